"""The key model for nested agents: one effect per call through sub-agents and subgraphs.

The graph path drops task ids and LangGraph's per-task call counters, so a retried task
that invokes a subgraph again derives the same keys; the innermost agent's name and the
calling call (for a sub-agent invoked from inside a memoized tool) are part of the key, so
two different agents never share one; ``turn`` scope is the outermost graph's user turn.
Every test that shows a duplicate prevented runs unprotected too and shows the duplicate.
"""

from __future__ import annotations

import asyncio
import warnings
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import ToolRetryMiddleware
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from langgraph.types import RetryPolicy, Send

from langchain_idempotent import IdempotencyMiddleware, InMemoryIdempotencyStore, idempotent
from langchain_idempotent.adapters.keys import AgentCollisionWarning, CallInfo, graph_path
from tests.support.agents import (
    GatewayError,
    Ledger,
    ReplyModel,
    email_tool,
    first_human,
    last_tool_result,
    refund_tool,
    tool_call,
)
from tests.support.graphs import ScriptedChatModel, on_each_turn, thread, tool_graph

PROTECTIONS = ["plain", "ours"]


def protect(tool_: BaseTool, mode: str, store: InMemoryIdempotencyStore, **options: Any) -> Any:
    return tool_ if mode == "plain" else idempotent(tool_, store, **options)


@pytest.mark.parametrize(
    ("ns", "path"),
    [
        ("billing:723b|tools:5888", "billing|tools"),
        ("billing:723b|1|tools:0b29", "billing|tools"),
        ("tools:89a7|2|tools:e98d", "tools|tools"),
        ("a:1|3|b:2|4|c:3", "a|b|c"),
    ],
)
def test_the_graph_path_drops_task_ids_and_call_counters(ns: str, path: str) -> None:
    assert graph_path(ns) == path


# -- D1: a retried task invokes the subgraph again ----------------------------------------


@pytest.mark.parametrize("mode", PROTECTIONS)
def test_a_node_retried_after_its_subgraph_refunded_does_not_refund_again(mode: str) -> None:
    """The issue's smallest reproduction: ``billing`` (``RetryPolicy``) invokes a
    ``START → ToolNode → END`` subgraph, then fails once; the retry's checkpoint_ns is
    ``billing:<t>|1|tools:<t>``."""
    ledger, store = Ledger(), InMemoryIdempotencyStore()
    sub = StateGraph(MessagesState)
    sub.add_node("tools", ToolNode([protect(refund_tool(ledger), mode, store)]))
    sub.add_edge(START, "tools")
    sub.add_edge("tools", END)
    subgraph = sub.compile()
    failures = [ConnectionError("reply lost")]

    def billing(state: MessagesState, config: RunnableConfig) -> dict[str, Any]:
        ask = tool_call("issue_refund", invoice_id="INV-7", amount=140)
        subgraph.invoke({"messages": [ask]}, config)
        if failures:
            raise failures.pop()
        return {}

    parent = StateGraph(MessagesState)
    retry = RetryPolicy(max_attempts=2, retry_on=ConnectionError, initial_interval=0.01)
    parent.add_node("billing", billing, retry_policy=retry)
    parent.add_edge(START, "billing")
    parent.add_edge("billing", END)
    graph = parent.compile(checkpointer=InMemorySaver())
    graph.invoke({"messages": [HumanMessage("refund INV-7")]}, thread(f"d1-{mode}"))
    assert ledger.count("refund") == {"plain": 2, "ours": 1}[mode]


# -- a ToolNode tool that invokes a sub-agent -----------------------------------------------


def billing_agent(refund: Any, *, name: str | None = "billing_agent") -> Any:
    return billing_agent_with(refund, name=name)


def billing_agent_with(refund: Any, *middleware: Any, name: str | None = "billing_agent") -> Any:
    def reply(messages: Any) -> AIMessage:
        if last_tool_result(messages) is not None:
            return AIMessage("refunded")
        return tool_call("issue_refund", invoice_id="INV-7", amount=140)

    return create_agent(ReplyModel(reply=reply), [refund], middleware=list(middleware), name=name)


def ask_billing_tool(agent: Any, failures: list[Exception]) -> BaseTool:
    @tool
    def ask_billing(question: str) -> str:
        """Ask the billing agent."""
        out = agent.invoke({"messages": [HumanMessage(question)]})
        if failures:
            raise failures.pop()  # the sub-agent refunded; its answer is lost on the way
        return str(out["messages"][-1].content)

    return ask_billing


SUPERVISOR_STEP = on_each_turn(("ask_billing", {"question": "refund INV-7, $140"}))


@pytest.mark.parametrize("caller", ["caller plain", "caller wrapped"])
@pytest.mark.parametrize("mode", PROTECTIONS)
def test_a_tool_retried_by_retry_policy_after_its_sub_agent_refunded_refunds_once(
    mode: str, caller: str
) -> None:
    ledger, store = Ledger(), InMemoryIdempotencyStore()
    agent = billing_agent(protect(refund_tool(ledger), mode, store))
    ask: BaseTool = ask_billing_tool(agent, [GatewayError("lost")])
    if caller == "caller wrapped" and mode == "ours":
        ask = idempotent(ask, store)
    retry = RetryPolicy(max_attempts=2, retry_on=ConnectionError, initial_interval=0.01)
    graph = tool_graph(
        ScriptedChatModel(then=SUPERVISOR_STEP),
        [ask],
        checkpointer=InMemorySaver(),
        retry_policy=retry,
    )
    graph.invoke({"messages": [HumanMessage("refund INV-7")]}, thread(f"rp-{mode}-{caller}"))
    assert ledger.count("refund") == {"plain": 2, "ours": 1}[mode]


@pytest.mark.parametrize("mode", PROTECTIONS)
def test_a_tool_retried_by_tool_retry_middleware_after_its_sub_agent_refunded_refunds_once(
    mode: str,
) -> None:
    ledger, store = Ledger(), InMemoryIdempotencyStore()
    agent = billing_agent(protect(refund_tool(ledger), mode, store))
    ask = ask_billing_tool(agent, [GatewayError("lost")])
    supervisor = create_agent(
        ScriptedChatModel(then=SUPERVISOR_STEP),
        [ask],
        middleware=[ToolRetryMiddleware(max_retries=1, initial_delay=0.01, jitter=False)],
        checkpointer=InMemorySaver(),
        name="supervisor",
    )
    supervisor.invoke({"messages": [HumanMessage("refund INV-7")]}, thread(f"trm-{mode}"))
    assert ledger.count("refund") == {"plain": 2, "ours": 1}[mode]


# -- D2: different sub-agents never share a key ---------------------------------------------


def emailing_agent(send_email: Any, name: str | None) -> Any:
    def reply(messages: Any) -> AIMessage:
        if last_tool_result(messages) is not None:
            return AIMessage("sent")
        return tool_call("send_email", customer_id="C-42", subject="your refund")

    return create_agent(ReplyModel(reply=reply), [send_email], name=name)


def asking_tools(billing: Any, comms: Any) -> list[BaseTool]:
    @tool
    def ask_billing(question: str) -> str:
        """Ask the billing agent."""
        return str(billing.invoke({"messages": [HumanMessage(question)]})["messages"][-1].content)

    @tool
    def ask_comms(question: str) -> str:
        """Ask the communications agent."""
        return str(comms.invoke({"messages": [HumanMessage(question)]})["messages"][-1].content)

    return [ask_billing, ask_comms]


def both_agents_step(messages: Any) -> AIMessage:
    if messages and messages[-1].type == "tool":
        return AIMessage("done")
    return AIMessage(
        "",
        tool_calls=[
            {"name": "ask_billing", "args": {"question": "tell C-42"}, "id": "c-billing"},
            {"name": "ask_comms", "args": {"question": "tell C-42"}, "id": "c-comms"},
        ],
    )


def test_two_named_sub_agents_sending_the_same_e_mail_each_send_their_own() -> None:
    """Both sub-agents call ``send_email(C-42, ...)`` from path ``tools|tools``, node
    ``tools``; their names (``lc_agent_name``) tell them apart."""
    ledger, store = Ledger(), InMemoryIdempotencyStore()
    send = idempotent(email_tool(ledger), store)
    tools = asking_tools(emailing_agent(send, "billing"), emailing_agent(send, "comms"))
    graph = tool_graph(
        ScriptedChatModel(then=both_agents_step), tools, checkpointer=InMemorySaver()
    )
    config = thread("two-named")
    graph.invoke({"messages": [HumanMessage("tell the customer")]}, config)
    assert ledger.count("email") == 2
    records = store.list(thread_id="two-named")
    assert sorted(r.meta["agent"] for r in records) == ["billing", "comms"]
    assert {r.meta["graph_path"] for r in records} == {"tools|tools"}
    # Asked again on the thread: each agent's e-mail replays, none is sent again.
    graph.invoke({"messages": [HumanMessage("again")]}, config)
    assert ledger.count("email") == 2


@pytest.mark.parametrize("run", ["sync", "async"])
def test_two_unnamed_sub_agents_called_from_wrapped_tools_are_told_apart_by_their_caller(
    run: str,
) -> None:
    ledger, store = Ledger(), InMemoryIdempotencyStore()
    send = idempotent(email_tool(ledger), store)
    tools = idempotent(asking_tools(emailing_agent(send, None), emailing_agent(send, None)), store)
    graph = tool_graph(
        ScriptedChatModel(then=both_agents_step), tools, checkpointer=InMemorySaver()
    )
    request = {"messages": [HumanMessage("tell the customer")]}
    if run == "async":
        asyncio.run(graph.ainvoke(request, thread("two-unnamed")))
    else:
        graph.invoke(request, thread("two-unnamed"))
    assert ledger.count("email") == 2
    emails = [r for r in store.list(thread_id="two-unnamed") if r.meta["tool"] == "send_email"]
    callers = {r.meta["parent_call"] for r in store.list(thread_id="two-unnamed")} - {""}
    assert len({r.meta["parent_call"] for r in emails}) == 2 and len(callers) == 2


@pytest.mark.parametrize("run", ["sync", "async"])
def test_two_unnamed_sub_agents_behind_unwrapped_tools_are_told_apart_by_the_calling_call(
    run: str,
) -> None:
    """Once a documented limit (one e-mail for two agents): the calling tool is not
    wrapped, but its tool run names it (name and model-visible arguments) to the
    sub-agent it runs, so each agent's call has its own key and replays on a re-send."""
    ledger, store = Ledger(), InMemoryIdempotencyStore()
    send = idempotent(email_tool(ledger), store)
    tools = asking_tools(emailing_agent(send, None), emailing_agent(send, None))
    graph = tool_graph(
        ScriptedChatModel(then=both_agents_step), tools, checkpointer=InMemorySaver()
    )
    config = thread(f"two-anonymous-{run}")
    for text in ("tell the customer", "again"):
        request = {"messages": [HumanMessage(text)]}
        if run == "async":
            asyncio.run(graph.ainvoke(request, config))
        else:
            graph.invoke(request, config)
        assert ledger.count("email") == 2
    callers = {
        r.meta["parent_call"].split(":")[0]
        for r in store.list(thread_id=config["configurable"]["thread_id"])
    }
    assert callers == {"ask_billing", "ask_comms"}


# -- D4: turn scope inside a sub-agent -------------------------------------------------------


@pytest.mark.parametrize("mode", [*PROTECTIONS, "ours (middleware)"])
def test_turn_scope_inside_a_sub_agent_is_the_outermost_user_turn(mode: str) -> None:
    """The calling tool makes the sub-agent's HumanMessage afresh on every attempt; the
    user's turn is the supervisor's."""
    ledger, store = Ledger(), InMemoryIdempotencyStore()
    if mode == "ours (middleware)":
        agent = billing_agent_with(
            refund_tool(ledger), IdempotencyMiddleware(store, tools=["issue_refund"], scope="turn")
        )
    else:
        agent = billing_agent(protect(refund_tool(ledger), mode, store, scope="turn"))
    retry = RetryPolicy(max_attempts=2, retry_on=ConnectionError, initial_interval=0.01)
    graph = tool_graph(
        ScriptedChatModel(then=SUPERVISOR_STEP),
        [ask_billing_tool(agent, [GatewayError("lost")])],
        checkpointer=InMemorySaver(),
        retry_policy=retry,
    )
    config = thread(f"turn-{mode}")
    graph.invoke({"messages": [HumanMessage("refund INV-7")]}, config)
    assert ledger.count("refund") == (2 if mode == "plain" else 1)
    if mode != "plain":  # a new user turn may repeat the call: that is what turn scope is
        graph.invoke({"messages": [HumanMessage("and once more, please")]}, config)
        assert ledger.count("refund") == 2


# -- Send fan-out to a create_agent billing subgraph ----------------------------------------


@pytest.mark.parametrize("mode", PROTECTIONS)
def test_send_fan_out_to_an_agent_subgraph_retried_after_one_refund_refunds_five_times(
    mode: str,
) -> None:
    ledger, store = Ledger(), InMemoryIdempotencyStore()

    def reply(messages: Any) -> AIMessage:
        if last_tool_result(messages) is not None:
            return AIMessage("refunded")
        ticket = first_human(messages)
        return tool_call("issue_refund", invoice_id=f"INV-{ticket[-1]}", amount=140)

    def fails_after_refund(messages: Any) -> bool:  # ticket 3's model, once, after refunding
        return last_tool_result(messages) is not None and first_human(messages).endswith("3")

    billing = create_agent(
        ReplyModel(reply=reply, fail_when=fails_after_refund),
        [protect(refund_tool(ledger), mode, store)],
        name="billing_agent",
    )
    parent = StateGraph(MessagesState)
    retry = RetryPolicy(max_attempts=2, retry_on=ConnectionError, initial_interval=0.01)
    parent.add_node("billing", billing, retry_policy=retry)
    parent.add_conditional_edges(
        START,
        lambda state: [
            Send("billing", {"messages": [HumanMessage(f"ticket T-{i}")]}) for i in range(1, 6)
        ],
        ["billing"],
    )
    parent.add_edge("billing", END)
    graph = parent.compile(checkpointer=InMemorySaver())
    graph.invoke({"messages": []}, thread(f"send-{mode}"))
    assert ledger.count("refund") == {"plain": 6, "ours": 5}[mode]


# -- bad input: a key function that merges two agents ----------------------------------------


def test_a_key_function_that_merges_two_agents_warns_naming_both() -> None:
    ledger, store = Ledger(), InMemoryIdempotencyStore()

    def by_customer(call: CallInfo) -> str:
        return f"email:{call.args['customer_id']}"

    send = idempotent(email_tool(ledger), store, scope=by_customer)
    tools = asking_tools(emailing_agent(send, "billing"), emailing_agent(send, "comms"))
    graph = tool_graph(
        ScriptedChatModel(then=both_agents_step), tools, checkpointer=InMemorySaver()
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        graph.invoke({"messages": [HumanMessage("tell the customer")]}, thread("merged"))
    [warning] = [w for w in caught if issubclass(w.category, AgentCollisionWarning)]
    assert "'billing'" in str(warning.message) and "'comms'" in str(warning.message)
    assert "call.agent_name" in str(warning.message)
    assert ledger.count("email") == 1  # what the key function asked for, now said aloud
