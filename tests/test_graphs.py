"""Wrapped tools in real LangGraph graphs: one effect per key, whatever re-runs the call.

Every graph here runs for real (``StateGraph`` + ``ToolNode``, ``create_agent``,
``create_react_agent``, subgraphs, ``interrupt()``) with a checkpointer and a scripted chat
model; the store is the in-memory one. An "effect" is a line in :class:`Effects`.
"""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, InjectedToolCallId, StructuredTool, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import InjectedState, create_react_agent
from langgraph.types import Command, RetryPolicy, interrupt

from langchain_idempotent import InMemoryIdempotencyStore, MissingScopeError, idempotent
from tests.support.graphs import (
    Effects,
    EventRecorder,
    ScriptedChatModel,
    assert_every_call_answered,
    call,
    calls,
    final,
    on_each_turn,
    thread,
    tool_graph,
    tool_results,
)

REFUND = {"invoice_id": "INV-7", "amount": 140}


def refund_tool(effects: Effects) -> BaseTool:
    """``issue_refund``, with a sync and an async body (ToolNode picks by invoke/ainvoke)."""

    def issue_refund(invoice_id: str, amount: float) -> str:
        n = effects.record("issue_refund", invoice_id=invoice_id, amount=amount)
        return f"refund #{n}: {amount:g} on {invoice_id}"

    async def aissue_refund(invoice_id: str, amount: float) -> str:
        await asyncio.sleep(0)
        return issue_refund(invoice_id, amount)

    return StructuredTool.from_function(
        issue_refund,
        coroutine=aissue_refund,
        name="issue_refund",
        description="Refund part or all of an invoice.",
    )


async def run(graph: Any, input: Any, config: RunnableConfig, mode: str) -> dict[str, Any]:
    if mode == "async":
        return await graph.ainvoke(input, config)  # type: ignore[no-any-return]
    return graph.invoke(input, config)  # type: ignore[no-any-return]


@pytest.fixture
def store() -> InMemoryIdempotencyStore:
    return InMemoryIdempotencyStore()


# -- the three ways to build a tool-calling agent, sync and async ----------------------------


def _hand_built(model: ScriptedChatModel, tools: list[BaseTool]) -> Any:
    return tool_graph(model, tools, checkpointer=InMemorySaver())


def _create_agent(model: ScriptedChatModel, tools: list[BaseTool]) -> Any:
    return create_agent(model, tools=tools, checkpointer=InMemorySaver())


def _create_react_agent(model: ScriptedChatModel, tools: list[BaseTool]) -> Any:
    return create_react_agent(model, tools, checkpointer=InMemorySaver())


@pytest.mark.filterwarnings("ignore:create_react_agent has been moved")
@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize(
    "build",
    [_hand_built, _create_agent, _create_react_agent],
    ids=["tool_node", "create_agent", "create_react_agent"],
)
async def test_the_same_call_again_in_the_thread_replays_the_first_result(
    store: InMemoryIdempotencyStore, build: Any, mode: str
) -> None:
    effects = Effects()
    model = ScriptedChatModel(then=on_each_turn(("issue_refund", REFUND)))
    graph = build(model, [idempotent(refund_tool(effects), store)])
    recorder = EventRecorder()
    config: RunnableConfig = {**thread(f"{build.__name__}-{mode}"), "callbacks": [recorder]}

    await run(graph, {"messages": [HumanMessage("refund INV-7, $140")]}, config, mode)
    out = await run(graph, {"messages": [HumanMessage("did it go through?")]}, config, mode)

    assert effects.count() == 1
    results = tool_results(out["messages"])
    assert [content for _, content in results] == ["refund #1: 140 on INV-7"] * 2
    assert results[0][0] != results[1][0]  # each answer carries its own call's id
    assert_every_call_answered(out["messages"])
    assert recorder.names() == ["idempotency.replay"]
    [record] = store.list(thread_id=config["configurable"]["thread_id"])
    assert (record.meta["node"], record.meta["graph_path"]) == ("tools", "tools")


def test_a_graph_run_without_a_thread_id_fails_loudly_before_the_tool_runs(
    store: InMemoryIdempotencyStore,
) -> None:
    effects = Effects()
    model = ScriptedChatModel(then=on_each_turn(("issue_refund", REFUND)))
    graph = tool_graph(model, [idempotent(refund_tool(effects), store)])  # no checkpointer
    with pytest.raises(MissingScopeError, match="checkpointer"):
        graph.invoke({"messages": [HumanMessage("refund")]})
    assert effects.count() == 0
    # A ToolNode told to hand every error to the model does not get this one: a missing
    # thread id is the developer's mistake, not a tool failure for the model to read.
    graph = tool_graph(model, [idempotent(refund_tool(effects), store)], handle_tool_errors=True)
    with pytest.raises(MissingScopeError, match="thread id"):
        graph.invoke({"messages": [HumanMessage("refund")]})
    assert effects.count() == 0


# -- subgraphs ----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_two_subgraphs_calling_the_same_tool_get_different_keys_each_stable_on_rerun(
    store: InMemoryIdempotencyStore, mode: str
) -> None:
    effects = Effects()
    refund = idempotent(refund_tool(effects), store)
    # One compiled agent subgraph, mounted twice: only the graph path tells them apart.
    agent = tool_graph(ScriptedChatModel(then=on_each_turn(("issue_refund", REFUND))), [refund])
    parent = StateGraph(MessagesState)
    parent.add_node("billing", agent)
    parent.add_node("disputes", agent)
    parent.add_edge(START, "billing")
    parent.add_edge("billing", "disputes")
    parent.add_edge("disputes", END)
    graph = parent.compile(checkpointer=InMemorySaver())
    config = thread(f"subgraphs-{mode}")

    first = await run(graph, {"messages": [HumanMessage("refund")]}, config, mode)
    assert effects.count() == 2  # one per subgraph: different keys
    records = store.list(thread_id=config["configurable"]["thread_id"])
    assert sorted(r.meta["graph_path"] for r in records) == ["billing|tools", "disputes|tools"]
    assert {r.meta["node"] for r in records} == {"tools"}

    # The whole thing again on the same thread: new task ids, same keys → replays.
    second = await run(graph, {"messages": [HumanMessage("again")]}, config, mode)
    assert effects.count() == 2
    assert len(store.list(thread_id=config["configurable"]["thread_id"])) == 2
    assert [c for _, c in tool_results(second["messages"])] == [
        "refund #1: 140 on INV-7",
        "refund #2: 140 on INV-7",
    ] * 2
    assert len(first["messages"]) < len(second["messages"])
    assert_every_call_answered(second["messages"])


# -- parallel calls, one of which fails once ------------------------------------------------


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("retry", ["resume", "retry_policy"])
async def test_parallel_calls_that_succeeded_are_replayed_when_a_failed_sibling_is_retried(
    store: InMemoryIdempotencyStore, mode: str, retry: str
) -> None:
    effects = Effects()

    @tool
    def notify_customer(customer_id: str, message: str) -> str:
        """Notify a customer."""
        if effects.record("notify_customer") == 1:
            # Fail once the sibling refunds are done (ToolNode runs the calls concurrently
            # and stops waiting for the others when one raises).
            deadline = time.monotonic() + 5
            while effects.count("issue_refund") < 2 and time.monotonic() < deadline:
                time.sleep(0.005)
            raise ConnectionError("smtp connection reset")
        return f"notified {customer_id}"

    tools = idempotent([refund_tool(effects), notify_customer], store)
    model = ScriptedChatModel(
        script=[
            calls(
                call("issue_refund", {"invoice_id": "INV-1", "amount": 10}, "c-1"),
                call("notify_customer", {"customer_id": "C-1", "message": "refunded"}, "c-n"),
                call("issue_refund", {"invoice_id": "INV-2", "amount": 20}, "c-2"),
            )
        ]
    )
    policy = (
        RetryPolicy(max_attempts=2, initial_interval=0.01, jitter=False, retry_on=ConnectionError)
        if retry == "retry_policy"
        else None
    )
    graph = tool_graph(
        model, tools, checkpointer=InMemorySaver(), handle_tool_errors=False, retry_policy=policy
    )
    recorder = EventRecorder()
    config: RunnableConfig = {**thread(f"parallel-{retry}-{mode}"), "callbacks": [recorder]}

    if retry == "resume":
        with pytest.raises(ConnectionError):
            await run(graph, {"messages": [HumanMessage("refund both")]}, config, mode)
        assert effects.count("issue_refund") == 2
        out = await run(graph, None, config, mode)  # resume the thread from its checkpoint
    else:
        out = await run(graph, {"messages": [HumanMessage("refund both")]}, config, mode)

    assert effects.count("issue_refund") == 2  # INV-1 and INV-2 once each
    assert effects.count("notify_customer") == 2  # failed once, then ran again
    assert recorder.names().count("idempotency.replay") == 2
    results = dict(tool_results(out["messages"]))
    assert results["c-1"].endswith(": 10 on INV-1") and results["c-2"].endswith(": 20 on INV-2")
    assert results["c-n"] == "notified C-1"
    assert_every_call_answered(out["messages"])


# -- interrupt() after the tool -----------------------------------------------------------------


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_node_that_calls_a_tool_then_interrupts_runs_the_effect_once_after_resume(
    store: InMemoryIdempotencyStore, mode: str
) -> None:
    effects = Effects()
    refund = idempotent(refund_tool(effects), store)

    def approve(state: MessagesState) -> dict[str, Any]:
        # No config passed: the tool finds the node's config in the context.
        receipt = refund.invoke(REFUND)
        decision = interrupt({"receipt": receipt, "question": "notify the customer?"})
        return {"messages": [AIMessage(f"{receipt}; notify={decision}")]}

    async def aapprove(state: MessagesState, config: RunnableConfig) -> dict[str, Any]:
        receipt = await refund.ainvoke(REFUND, config)
        decision = interrupt({"receipt": receipt, "question": "notify the customer?"})
        return {"messages": [AIMessage(f"{receipt}; notify={decision}")]}

    builder = StateGraph(MessagesState)
    builder.add_node("approve", approve if mode == "sync" else aapprove)
    builder.add_edge(START, "approve")
    builder.add_edge("approve", END)
    graph = builder.compile(checkpointer=InMemorySaver())
    config = thread(f"interrupt-{mode}")

    paused = await run(graph, {"messages": [HumanMessage("refund")]}, config, mode)
    [pending] = paused["__interrupt__"]
    assert pending.value["receipt"] == "refund #1: 140 on INV-7"
    assert effects.count() == 1

    # Resuming re-runs the node from its start: the tool call replays.
    done = await run(graph, Command(resume="yes"), config, mode)
    assert done["messages"][-1].content == "refund #1: 140 on INV-7; notify=yes"
    assert effects.count() == 1
    [record] = store.list(thread_id=config["configurable"]["thread_id"])
    assert record.meta["node"] == "approve"


# -- scopes: a re-run LLM step, a new user turn ---------------------------------------------


def _rerun_llm_step(graph: Any, config: RunnableConfig) -> dict[str, Any]:
    """Re-run the thread from the checkpoint just before its first LLM step (what a resume
    does after a crash under ``durability="exit"``, or a fork from history)."""
    history = list(graph.get_state_history(config))
    before_llm = next(s for s in reversed(history) if s.next == ("agent",))
    return graph.invoke(None, before_llm.config)  # type: ignore[no-any-return]


@pytest.mark.parametrize(("scope", "expected_effects"), [("thread", 1), ("turn", 1), ("call", 2)])
def test_a_regenerated_call_after_the_llm_step_re_runs(
    store: InMemoryIdempotencyStore, scope: str, expected_effects: int
) -> None:
    effects = Effects()
    model = ScriptedChatModel(
        script=[
            calls(call("issue_refund", {"invoice_id": "INV-7", "amount": 140})),
            final("refunded"),
            # The re-sampled LLM writes the same call differently, with a new call id.
            calls(call("issue_refund", {"amount": 140.0, "invoice_id": "INV-7"})),
            final("refunded"),
        ]
    )
    graph = tool_graph(
        model, [idempotent(refund_tool(effects), store, scope=scope)], checkpointer=InMemorySaver()
    )
    config = thread(f"regenerated-{scope}")
    graph.invoke({"messages": [HumanMessage("refund INV-7, $140")]}, config)
    out = _rerun_llm_step(graph, config)

    assert model.calls == 4  # the LLM step really ran twice
    assert effects.count() == expected_effects
    assert len(store.list(thread_id=config["configurable"]["thread_id"])) == expected_effects
    [(_, content)] = tool_results(out["messages"])  # the fork holds only the new branch
    assert content == f"refund #{expected_effects}: 140 on INV-7"
    assert_every_call_answered(out["messages"])


@pytest.mark.parametrize(("scope", "expected_effects"), [("thread", 1), ("turn", 2), ("call", 2)])
@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_deliberate_repeat_in_a_new_user_turn(
    store: InMemoryIdempotencyStore, scope: str, expected_effects: int, mode: str
) -> None:
    effects = Effects()
    model = ScriptedChatModel(then=on_each_turn(("issue_refund", REFUND)))
    graph = tool_graph(
        model, [idempotent(refund_tool(effects), store, scope=scope)], checkpointer=InMemorySaver()
    )
    config = thread(f"new-turn-{scope}-{mode}")
    await run(graph, {"messages": [HumanMessage("refund INV-7, $140")]}, config, mode)
    out = await run(graph, {"messages": [HumanMessage("and once more, please")]}, config, mode)
    assert effects.count() == expected_effects
    assert len(store.list(thread_id=config["configurable"]["thread_id"])) == expected_effects
    assert [c for _, c in tool_results(out["messages"])][-1] == (
        f"refund #{expected_effects}: 140 on INV-7"
    )
    assert_every_call_answered(out["messages"])


def test_under_turn_scope_the_same_call_twice_in_one_turn_runs_once(
    store: InMemoryIdempotencyStore,
) -> None:
    effects = Effects()
    model = ScriptedChatModel(
        script=[calls(call("issue_refund", REFUND)), calls(call("issue_refund", REFUND))]
    )
    graph = tool_graph(
        model, [idempotent(refund_tool(effects), store, scope="turn")], checkpointer=InMemorySaver()
    )
    out = graph.invoke({"messages": [HumanMessage("refund")]}, thread("one-turn"))
    assert effects.count() == 1
    assert [c for _, c in tool_results(out["messages"])] == ["refund #1: 140 on INV-7"] * 2


# -- injected state --------------------------------------------------------------------------


class TicketState(MessagesState):
    tier: str


def test_a_named_state_field_enters_the_key_and_the_undeclared_rest_of_the_state_does_not(
    store: InMemoryIdempotencyStore,
) -> None:
    effects = Effects()

    @tool
    def credit_account(
        customer_id: str,
        amount: float,
        tier: Annotated[str, InjectedState("tier")],
        state: Annotated[dict[str, Any], InjectedState],
        tool_call_id: Annotated[str, InjectedToolCallId],
    ) -> str:
        """Credit a customer's account."""
        n = effects.record("credit_account", tier=tier, seen=len(state["messages"]))
        return f"credit #{n} ({tier}, saw {len(state['messages'])} messages)"

    model = ScriptedChatModel(
        then=on_each_turn(("credit_account", {"customer_id": "C-1", "amount": 5}))
    )
    graph = tool_graph(
        model,
        # key_state=(): the whole state it also reads (the message count) is no input.
        [idempotent(credit_account, store, key_state=())],
        checkpointer=InMemorySaver(),
        state_schema=TicketState,
    )
    config = thread("injected")

    graph.invoke({"messages": [HumanMessage("credit")], "tier": "gold"}, config)
    # Another message count and call id, the same tier: the same effect, replayed.
    out = graph.invoke({"messages": [HumanMessage("credit")], "tier": "gold"}, config)
    assert effects.count() == 1
    assert [c for _, c in tool_results(out["messages"])] == ["credit #1 (gold, saw 2 messages)"] * 2
    # Another tier (an input the tool names with InjectedState("tier")): a new effect.
    out = graph.invoke({"messages": [HumanMessage("credit")], "tier": "platinum"}, config)
    assert effects.count() == 2
    assert tool_results(out["messages"])[-1][1] == "credit #2 (platinum, saw 10 messages)"
