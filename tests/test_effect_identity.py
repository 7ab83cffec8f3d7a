"""Which effect a call is: every input the effect depends on enters the key, not only
what the model sent.

Each scenario is one thread on which the model asks ``refund_late_fee(amount=15)`` three
times: for customer A, for customer B, and for A again (a re-send). The customer reaches
the tool another way each time (an ``InjectedToolArg`` the application fills in, an
``InjectedState("customer")``, the whole state, a ``ToolRuntime``, the run's context, a
sub-agent behind an unwrapped tool). Plain, A is refunded twice; wrapped, A once and B
once, each told their own refund, and A's re-send replays A's. Before key format 3,
wrapped, B was told A's refund and never paid.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain.agents import AgentState, create_agent
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, InjectedToolArg, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import InjectedState, ToolRuntime, tools_condition

from langchain_idempotent import (
    IdempotencyMiddleware,
    InMemoryIdempotencyStore,
    InvalidArgumentsError,
    idempotent,
)
from langchain_idempotent.adapters.keys import explain_key
from tests.support.agents import ReplyModel, last_tool_result, tool_call
from tests.support.graphs import ScriptedChatModel, on_each_turn, thread, tool_graph

MODES = ["plain", "wrapped"]
TURNS = ["A", "B", "A"]  # the third turn is A's request re-sent
ASK = on_each_turn(("refund_late_fee", {"amount": 15}))


class Refunds:
    """The payment provider's books: refunds per customer."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.paid: dict[str, int] = {}

    def pay(self, customer: str, amount: float) -> str:
        with self._lock:
            self.paid[customer] = self.paid.get(customer, 0) + 1
        return f"refunded {amount} to {customer}"


def told(messages: list[Any]) -> str:
    """What the customer was told this turn: the last tool answer."""
    return str([m for m in messages if isinstance(m, ToolMessage)][-1].content)


def wrap(t: BaseTool, mode: str, store: InMemoryIdempotencyStore, **options: Any) -> Any:
    return t if mode == "plain" else idempotent(t, store, **options)


#: Plain, A's re-send refunds A again; wrapped, it replays A's refund.
EXPECTED_PAID = {"plain": {"A": 2, "B": 1}, "wrapped": {"A": 1, "B": 1}}
EXPECTED_TOLD = ["refunded 15.0 to A", "refunded 15.0 to B", "refunded 15.0 to A"]


def run_turns(invoke: Callable[[str], list[Any]]) -> list[str]:
    return [told(invoke(customer)) for customer in TURNS]


# -- 1. an InjectedToolArg the application fills in ----------------------------------------


class CustomerState(AgentState[Any]):
    customer: str


class TicketState(MessagesState):
    customer: str


def filling_graph(refund: Any, name: str) -> Callable[[str], list[Any]]:
    """The agent loop with a tools node that fills in the ``InjectedToolArg`` (LangChain's
    documented way: the model never sees ``user_id``; the code that runs the tool adds
    it. ``ToolNode`` strips such values from a model's call, so it cannot be the one)."""

    def agent(state: TicketState, config: RunnableConfig) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"], config)]}

    def tools(state: TicketState, config: RunnableConfig) -> dict[str, Any]:
        answers = []
        for c in state["messages"][-1].tool_calls:
            filled = {**c, "args": {**c["args"], "user_id": state["customer"]}}
            answers.append(refund.invoke({**filled, "type": "tool_call"}, config))
        return {"messages": answers}

    model = ScriptedChatModel(then=ASK)
    builder = StateGraph(TicketState)
    builder.add_node("agent", agent)
    builder.add_node("tools", tools)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition, ["tools", END])
    builder.add_edge("tools", "agent")
    graph = builder.compile(checkpointer=InMemorySaver())
    config = thread(name)

    def turn(customer: str) -> list[Any]:
        state = {"messages": [HumanMessage("refund my late fee")], "customer": customer}
        return list(graph.invoke(state, config)["messages"])

    return turn


@pytest.mark.parametrize("mode", MODES)
def test_an_injected_tool_arg_enters_the_key(mode: str) -> None:
    refunds, store = Refunds(), InMemoryIdempotencyStore()

    @tool
    def refund_late_fee(amount: float, user_id: Annotated[str, InjectedToolArg]) -> str:
        """Refund the customer's late fee."""
        return refunds.pay(user_id, amount)

    turn = filling_graph(wrap(refund_late_fee, mode, store), f"injected-arg-{mode}")
    assert run_turns(turn) == EXPECTED_TOLD
    assert refunds.paid == EXPECTED_PAID[mode]


# -- 2. InjectedState("customer") ----------------------------------------------------------


def graph_turns(tools: list[Any], name: str) -> Callable[[str], list[Any]]:
    graph = tool_graph(
        ScriptedChatModel(then=ASK), tools, checkpointer=InMemorySaver(), state_schema=TicketState
    )
    config = thread(name)

    def turn(customer: str) -> list[Any]:
        state = {"messages": [HumanMessage("refund my late fee")], "customer": customer}
        return list(graph.invoke(state, config)["messages"])

    return turn


@pytest.mark.parametrize("mode", MODES)
def test_a_named_injected_state_field_enters_the_key(mode: str) -> None:
    refunds, store = Refunds(), InMemoryIdempotencyStore()

    @tool
    def refund_late_fee(amount: float, customer: Annotated[str, InjectedState("customer")]) -> str:
        """Refund the customer's late fee."""
        return refunds.pay(customer, amount)

    turn = graph_turns([wrap(refund_late_fee, mode, store)], f"named-state-{mode}")
    assert run_turns(turn) == EXPECTED_TOLD
    assert refunds.paid == EXPECTED_PAID[mode]


# -- 3. the whole state: InjectedState, ToolRuntime.state ----------------------------------


def whole_state_tools(refunds: Refunds) -> dict[str, BaseTool]:
    @tool
    def refund_late_fee(amount: float, state: Annotated[dict[str, Any], InjectedState]) -> str:
        """Refund the customer's late fee."""
        return refunds.pay(state["customer"], amount)

    @tool("refund_late_fee")
    def refund_with_runtime(amount: float, runtime: ToolRuntime) -> str:
        """Refund the customer's late fee."""
        return refunds.pay(runtime.state["customer"], amount)

    return {"InjectedState": refund_late_fee, "ToolRuntime": refund_with_runtime}


@pytest.mark.parametrize("kind", ["InjectedState", "ToolRuntime"])
@pytest.mark.parametrize("mode", MODES)
def test_a_tool_given_the_whole_state_keys_by_the_declared_fields(mode: str, kind: str) -> None:
    refunds, store = Refunds(), InMemoryIdempotencyStore()
    refund = whole_state_tools(refunds)[kind]
    wrapped = wrap(refund, mode, store, key_state=["customer"])
    turn = graph_turns([wrapped], f"whole-{kind}-{mode}")
    assert run_turns(turn) == EXPECTED_TOLD
    assert refunds.paid == EXPECTED_PAID[mode]


@pytest.mark.parametrize("kind", ["InjectedState", "ToolRuntime"])
@pytest.mark.parametrize("mode", MODES)
def test_a_tool_given_the_whole_state_keys_by_what_it_reads_with_no_declaration(
    mode: str, kind: str
) -> None:
    """No ``key_state=``: the library notes which state fields the tool reads."""
    refunds, store = Refunds(), InMemoryIdempotencyStore()
    refund = whole_state_tools(refunds)[kind]
    turn = graph_turns([wrap(refund, mode, store)], f"whole-noted-{kind}-{mode}")
    assert run_turns(turn) == EXPECTED_TOLD
    assert refunds.paid == EXPECTED_PAID[mode]


@pytest.mark.parametrize("mode", MODES)
def test_the_middleware_keys_a_whole_state_tool_by_what_it_reads(mode: str) -> None:
    refunds, store = Refunds(), InMemoryIdempotencyStore()
    middleware = (
        [IdempotencyMiddleware(store, tools=["refund_late_fee"])] if mode != "plain" else []
    )
    agent = create_agent(
        ScriptedChatModel(then=ASK),
        [whole_state_tools(refunds)["ToolRuntime"]],
        middleware=middleware,
        checkpointer=InMemorySaver(),
        state_schema=CustomerState,
    )
    config = thread(f"mw-noted-{mode}")

    def turn(customer: str) -> list[Any]:
        state = {"messages": [HumanMessage("refund my late fee")], "customer": customer}
        return list(agent.invoke(state, config)["messages"])

    assert run_turns(turn) == EXPECTED_TOLD
    assert refunds.paid == EXPECTED_PAID[mode]


@pytest.mark.parametrize("mode", ["plain", "wrapped"])
def test_the_middleware_keys_a_whole_state_tool_by_its_declared_fields(mode: str) -> None:
    refunds, store = Refunds(), InMemoryIdempotencyStore()
    middleware = (
        [IdempotencyMiddleware(store, tools=["refund_late_fee"], key_state=["customer"])]
        if mode == "wrapped"
        else []
    )
    agent = create_agent(
        ScriptedChatModel(then=ASK),
        [whole_state_tools(refunds)["ToolRuntime"]],
        middleware=middleware,
        checkpointer=InMemorySaver(),
        state_schema=CustomerState,
    )
    config = thread(f"mw-whole-{mode}")

    def turn(customer: str) -> list[Any]:
        state = {"messages": [HumanMessage("refund my late fee")], "customer": customer}
        return list(agent.invoke(state, config)["messages"])

    assert run_turns(turn) == EXPECTED_TOLD
    assert refunds.paid == EXPECTED_PAID[mode]


# -- the run's static context (context_schema, Runtime.context) -----------------------------


@dataclass
class Caller:
    user_id: str


@pytest.mark.parametrize("mode", MODES)
def test_the_runs_static_context_enters_the_key(mode: str) -> None:
    refunds, store = Refunds(), InMemoryIdempotencyStore()

    @tool
    def refund_late_fee(amount: float, runtime: ToolRuntime[Caller]) -> str:
        """Refund the customer's late fee."""
        return refunds.pay(runtime.context.user_id, amount)

    agent = create_agent(
        ScriptedChatModel(then=ASK),
        # key_state=(): the state is not what the effect depends on; the context is.
        [wrap(refund_late_fee, mode, store, key_state=())],
        context_schema=Caller,
        checkpointer=InMemorySaver(),
    )
    config = thread(f"context-{mode}")

    def turn(customer: str) -> list[Any]:
        request = {"messages": [HumanMessage("refund my late fee")]}
        return list(agent.invoke(request, config, context=Caller(customer))["messages"])

    assert run_turns(turn) == EXPECTED_TOLD
    assert refunds.paid == EXPECTED_PAID[mode]


def test_a_tool_can_keep_the_context_out_of_its_key() -> None:
    refunds, store = Refunds(), InMemoryIdempotencyStore()

    @tool
    def log_visit(page: str) -> str:
        """Log a page visit (one per thread, whoever asks)."""
        return refunds.pay("log", 1)

    agent = create_agent(
        ScriptedChatModel(then=on_each_turn(("log_visit", {"page": "home"}))),
        [idempotent(log_visit, store, key_exclude=["context"])],
        context_schema=Caller,
        checkpointer=InMemorySaver(),
    )
    for customer in ("A", "B"):
        agent.invoke(
            {"messages": [HumanMessage("hi")]}, thread("ctx-out"), context=Caller(customer)
        )
    assert refunds.paid == {"log": 1}


# -- 4. two unnamed sub-agents behind two different unwrapped tools, in one step ----------


def sub_agent(refund: Any) -> Any:
    def reply(messages: Any) -> AIMessage:
        answered = last_tool_result(messages)
        if answered is not None:
            return AIMessage(str(answered.content))
        return tool_call("refund_late_fee", amount=15)

    return create_agent(ReplyModel(reply=reply), [refund])  # unnamed


def customer_refund(refunds: Refunds, customer: str) -> BaseTool:
    @tool
    def refund_late_fee(amount: float) -> str:
        """Refund the customer's late fee."""
        return refunds.pay(customer, amount)

    return refund_late_fee


def ask_tools(agent_a: Any, agent_b: Any) -> list[BaseTool]:
    @tool
    def ask_billing_a(question: str) -> str:
        """Ask customer A's billing agent."""
        return str(agent_a.invoke({"messages": [HumanMessage(question)]})["messages"][-1].content)

    @tool
    def ask_billing_b(question: str) -> str:
        """Ask customer B's billing agent."""
        return str(agent_b.invoke({"messages": [HumanMessage(question)]})["messages"][-1].content)

    return [ask_billing_a, ask_billing_b]


def both_in_one_step(messages: Any) -> AIMessage:
    if messages and messages[-1].type == "tool":
        return AIMessage("done")
    question = {"question": "refund the late fee"}
    return AIMessage(
        "",
        tool_calls=[
            {"name": "ask_billing_a", "args": question, "id": f"a-{len(messages)}"},
            {"name": "ask_billing_b", "args": question, "id": f"b-{len(messages)}"},
        ],
    )


@pytest.mark.parametrize("run", ["sync", "async"])
@pytest.mark.parametrize("mode", MODES)
def test_two_unnamed_sub_agents_behind_two_unwrapped_tools_in_one_step_each_refund_once(
    mode: str, run: str
) -> None:
    refunds, store = Refunds(), InMemoryIdempotencyStore()
    agents = [sub_agent(wrap(customer_refund(refunds, c), mode, store)) for c in ("A", "B")]
    graph = tool_graph(
        ScriptedChatModel(then=both_in_one_step), ask_tools(*agents), checkpointer=InMemorySaver()
    )
    config = thread(f"sub-agents-{mode}-{run}")
    answers: list[dict[str, str]] = []
    for text in ("refund us", "refund us again"):  # the second is a re-send
        request = {"messages": [HumanMessage(text)]}
        out = (
            asyncio.run(graph.ainvoke(request, config))
            if run == "async"
            else graph.invoke(request, config)
        )
        answers.append(
            {m.name: str(m.content) for m in out["messages"][-3:] if isinstance(m, ToolMessage)}
        )
    assert refunds.paid == {"plain": {"A": 2, "B": 2}, "wrapped": {"A": 1, "B": 1}}[mode]
    told_each = {"ask_billing_a": "refunded 15.0 to A", "ask_billing_b": "refunded 15.0 to B"}
    assert answers == [told_each, told_each]


# -- property: calls that differ only in an injected input never share a key -------------


@tool
def refund_for(
    amount: float,
    user_id: Annotated[Any, InjectedToolArg],
    customer: Annotated[Any, InjectedState("customer")],
    state: Annotated[dict[str, Any], InjectedState],
) -> str:
    """Refund the customer's late fee."""
    return "ok"


PROPERTY_TOOL = idempotent(refund_for, InMemoryIdempotencyStore(), key_state=["tier"])
#: Injected values whose Python equality is their canonical equality (no floats).
VALUES = st.one_of(
    st.text(max_size=8),
    st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1),
    st.booleans(),
    st.none(),
    st.lists(st.text(max_size=3), max_size=3),
)
INPUTS = st.fixed_dictionaries({"user_id": VALUES, "customer": VALUES, "tier": VALUES})


def key_of(inputs: dict[str, Any], call_id: str) -> str:
    args = {
        "amount": 15,
        "user_id": inputs["user_id"],
        "customer": inputs["customer"],
        "state": {"messages": [call_id], "tier": inputs["tier"]},
    }
    config = {"configurable": {"thread_id": "t-prop"}, "metadata": {"langgraph_node": "tools"}}
    envelope = {"name": "refund_for", "args": args, "id": call_id, "type": "tool_call"}
    return explain_key(PROPERTY_TOOL, envelope, config).key


def same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(first=INPUTS, second=INPUTS, field=st.sampled_from(["user_id", "customer", "tier"]))
def test_calls_differing_only_in_an_injected_input_never_share_a_key(
    first: dict[str, Any], second: dict[str, Any], field: str
) -> None:
    other = {**first, field: second[field]}
    # Another call id and another message history: not inputs of the effect.
    assert (key_of(first, "c1") == key_of(other, "c2")) == same(first[field], other[field])
    assert key_of(first, "c1") == key_of(dict(first), "c3")


# -- bad input: an injected value with no canonical form -----------------------------------


@pytest.mark.parametrize("handle", ["lock", "socket"])
def test_an_injected_value_with_no_canonical_form_is_refused_naming_it_and_the_option(
    handle: str,
) -> None:
    refunds = Refunds()

    @tool
    def refund_late_fee(amount: float, conn: Annotated[Any, InjectedToolArg]) -> str:
        """Refund the customer's late fee."""
        return refunds.pay("A", amount)

    value: Any = threading.Lock() if handle == "lock" else socket.socket()
    try:
        wrapped = idempotent(refund_late_fee, InMemoryIdempotencyStore())
        config = {"configurable": {"thread_id": "t-bad"}}
        with pytest.raises(InvalidArgumentsError, match=r"injected parameter 'conn'") as refused:
            wrapped.invoke({"amount": 15, "conn": value}, config)
        assert "key_exclude=['conn']" in str(refused.value)
        assert refunds.paid == {}  # the tool never ran
        # Kept out of the key, it is passed through to the tool as before.
        excluded = idempotent(refund_late_fee, InMemoryIdempotencyStore(), key_exclude=["conn"])
        assert excluded.invoke({"amount": 15, "conn": value}, config) == "refunded 15.0 to A"
    finally:
        if isinstance(value, socket.socket):
            value.close()


def test_a_run_context_with_no_canonical_form_is_refused_naming_key_exclude_context() -> None:
    @dataclass
    class Handles:
        lock: Any

    @tool
    def refund_late_fee(amount: float) -> str:
        """Refund the customer's late fee."""
        return "refunded"

    agent = create_agent(
        ScriptedChatModel(then=ASK),
        [idempotent(refund_late_fee, InMemoryIdempotencyStore())],
        context_schema=Handles,
        checkpointer=InMemorySaver(),
    )
    with pytest.raises(InvalidArgumentsError, match=r"static context.*key_exclude=\['context'\]"):
        agent.invoke(
            {"messages": [HumanMessage("hi")]}, thread("bad-ctx"), context=Handles(threading.Lock())
        )


# -- wrapping never changes what a tool answers ---------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_a_sub_agents_message_text_is_stored_and_replays_as_the_equal_str(mode: str) -> None:
    """LangChain's sub-agent-as-a-tool pattern returns ``result["messages"][-1].text``, a
    ``TextAccessor`` (a ``str`` subclass) since langchain-core 1.0."""
    refunds, store = Refunds(), InMemoryIdempotencyStore()
    billing = sub_agent(customer_refund(refunds, "A"))

    @tool
    def ask_billing(question: str) -> str:
        """Ask the billing agent."""
        return billing.invoke({"messages": [HumanMessage(question)]})["messages"][-1].text

    asked = wrap(ask_billing, mode, store)
    config = {"configurable": {"thread_id": f"text-{mode}"}}
    first = asked.invoke({"question": "refund the late fee"}, config)
    again = asked.invoke({"question": "refund the late fee"}, config)
    assert first == again == "refunded 15.0 to A"
    assert type(again) is (str if mode == "wrapped" else type(first))
    assert refunds.paid == {"plain": {"A": 2}, "wrapped": {"A": 1}}[mode]


@pytest.mark.parametrize("face", ["idempotent", "middleware"])
def test_a_runtime_parameter_injected_by_name_is_no_model_argument(
    face: str, tmp_path: Any
) -> None:
    """LangChain's own ``ShellToolMiddleware`` declares ``runtime: Annotated[Any,
    SkipJsonSchema()] = None``: ToolNode injects the ``ToolRuntime`` by name, and
    ``tool_call_schema`` still shows the field. Wrapped, the command runs once per key (it
    reads its shell session from the state: ``key_state=()`` says that is no input)."""
    from langchain.agents.middleware import ShellToolMiddleware

    shell = ShellToolMiddleware(workspace_root=tmp_path)
    assert "runtime" in shell.tools[0].tool_call_schema.model_fields
    store = InMemoryIdempotencyStore()
    middleware: list[Any] = [shell]
    if face == "idempotent":
        shell.tools = [idempotent(t, store, key_state=()) for t in shell.tools]
    else:
        middleware.append(IdempotencyMiddleware(store, tools=["shell"], key_state=()))
    command = {"command": "echo paid >> ledger.txt; wc -l < ledger.txt"}
    agent = create_agent(
        ScriptedChatModel(then=on_each_turn(("shell", command))),
        middleware=middleware,
        checkpointer=InMemorySaver(),
    )
    answers = []
    for _ in range(2):  # the second is the request re-sent
        out = agent.invoke({"messages": [HumanMessage("pay")]}, thread(f"shell-{face}"))
        answers.append(told(out["messages"]).strip())
    assert answers == ["1", "1"]
    assert (tmp_path / "ledger.txt").read_text() == "paid\n"


def swarm_middleware(handoff: str | None) -> Callable[[], list[Any]]:
    names = ["issue_refund", "transfer_to_bob", "transfer_to_alice"]
    options: dict[str, Any] = {} if handoff is None else {"handoff": handoff, "key_state": ()}
    return lambda: [IdempotencyMiddleware(STORE, tools=names, **options)]


STORE = InMemoryIdempotencyStore()


def test_the_middleware_reruns_a_handoff_it_names_with_no_declaration() -> None:
    """One rule for both faces: a state-reading ``Command`` tool given no ``handoff=``
    runs on every call (``"rerun"``), so the swarm hands off and refunds once."""
    from langgraph_swarm import create_handoff_tool, create_swarm

    from tests.support.agents import Ledger, refund_tool, swarm_agents

    ledger = Ledger()
    to_bob, to_alice = (
        create_handoff_tool(agent_name="bob"),
        create_handoff_tool(agent_name="alice"),
    )
    graph = create_swarm(
        swarm_agents(refund_tool(ledger), to_bob, to_alice, swarm_middleware(None)),
        default_active_agent="alice",
    ).compile(checkpointer=InMemorySaver())
    for _ in range(2):
        out = graph.invoke({"messages": [HumanMessage("refund INV-7, $140")]}, thread("mw-ho"))
        assert out["messages"][-1].content == "bob has refunded you"
    assert ledger.count("refund") == 1
    IdempotencyMiddleware(STORE, tools=[to_bob])  # given as an object: not refused
    with pytest.raises(ValueError, match="'rerun' or 'replay'"):
        IdempotencyMiddleware(STORE, tools=["transfer_to_bob"], handoff="always")  # type: ignore[arg-type]


@pytest.mark.parametrize("handoff", ["rerun", "replay"])
def test_a_swarm_behind_the_middleware_re_sent_refunds_once_with_a_valid_history(
    handoff: str,
) -> None:
    from langgraph_swarm import create_handoff_tool, create_swarm

    from tests.support.agents import Ledger, refund_tool, swarm_agents
    from tests.support.graphs import assert_every_call_answered

    ledger = Ledger()
    to_bob, to_alice = (
        create_handoff_tool(agent_name="bob"),
        create_handoff_tool(agent_name="alice"),
    )
    graph = create_swarm(
        swarm_agents(refund_tool(ledger), to_bob, to_alice, swarm_middleware(handoff)),
        default_active_agent="alice",
    ).compile(checkpointer=InMemorySaver())
    config = thread(f"mw-swarm-{handoff}")
    for _ in range(3):
        out = graph.invoke({"messages": [HumanMessage("refund INV-7, $140")]}, config)
        assert_every_call_answered(out["messages"])
        assert out["messages"][-1].content == "bob has refunded you"
    assert ledger.count("refund") == 1


def test_the_explain_command_with_the_inputs_gives_the_stored_key(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An operator reproduces the key of a call whose inputs the model did not send."""
    from langchain_idempotent.cli import main

    store = InMemoryIdempotencyStore()

    @tool
    def refund_late_fee(amount: float, customer: Annotated[str, InjectedState("customer")]) -> str:
        """Refund the customer's late fee."""
        return f"refunded {amount} to {customer}"

    turn = graph_turns([idempotent(refund_late_fee, store)], "explain-inputs")
    turn("B")
    [record] = store.list(thread_id="explain-inputs")
    argv = ["--tool", "refund_late_fee", "--args", '{"amount": 15}', "--thread", "explain-inputs"]
    argv += ["--checkpoint-ns", "tools:0b29f1", "--node", "tools", "--key", record.key]
    assert main(["explain", *argv, "--inputs", '{"state": {"customer": "B"}}']) == 0
    assert '{"state":{"customer":"B"}}' in capsys.readouterr().out
    assert main(["explain", *argv, "--inputs", '{"state": {"customer": "A"}}']) == 1


def test_a_tool_langchain_mcp_adapters_made_is_no_whole_state_read() -> None:
    """The adapter's tools take a ``ToolRuntime`` for the client's interceptors only: their
    effect is the MCP call's arguments, so it is handed no view; a tool of the same shape
    written by hand is handed one (its reads are noted): neither is refused."""
    import mcp.types
    from langchain_mcp_adapters.tools import convert_mcp_tool_to_langchain_tool

    schema = {"type": "object", "properties": {"amount": {"type": "number"}}}
    made = convert_mcp_tool_to_langchain_tool(
        None,
        mcp.types.Tool(name="refund", inputSchema=schema),
        connection={"transport": "stdio", "command": "true", "args": []},
    )
    idempotent(made, InMemoryIdempotencyStore())  # not refused

    @tool
    def refund(amount: float, runtime: ToolRuntime) -> str:
        """Refund."""
        return "ok"

    assert idempotent(refund, InMemoryIdempotencyStore())._params.whole_state == ("runtime",)
    assert idempotent(made, InMemoryIdempotencyStore())._params.whole_state == ()
