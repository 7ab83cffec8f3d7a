"""The key sees what the tool reads, with no declaration.

Each kind below is one way a refund tool learns whose refund it is without the model
saying so: the run's config (a ``RunnableConfig`` parameter, ``ToolRuntime.config``,
``get_config()`` in the body) and last round's four kinds (an ``InjectedToolArg``,
``InjectedState("customer")``, the whole ``InjectedState``, ``ToolRuntime.state``). On one
thread the model asks ``refund_late_fee(amount=15)`` for alice, then for bob, then for
alice again (a retry: a re-run LLM step, a new ``tool_call_id``). Plain, alice is paid
twice; wrapped with no options, each is paid once and told their own refund. At key
format 3, the three config kinds told bob "refunded 15.0 to alice" and never paid him,
and the two whole-state kinds were refused until ``key_state=`` was given.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Annotated, Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, InjectedToolArg, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.config import get_config
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import InjectedState, ToolNode, ToolRuntime
from langgraph.store.base import BaseStore
from langgraph.store.memory import InMemoryStore

from langchain_idempotent import InMemoryIdempotencyStore, idempotent
from langchain_idempotent.adapters.keys import explain_key
from langchain_idempotent.core.store import BaseIdempotencyStore
from langchain_idempotent.errors import InvalidArgumentsError
from tests.support.postgres_fixtures import pg_server, pg_url  # noqa: F401
from tests.test_effect_identity import Refunds

MODES = ["plain", "wrapped"]
KINDS = [
    "config parameter",
    "runtime.config",
    "get_config()",
    "InjectedToolArg",
    "InjectedState('customer')",
    "InjectedState",
    "ToolRuntime.state",
]


def refund_tool(kind: str, refunds: Refunds, before_paying: Callable[[str], None]) -> BaseTool:
    """``refund_late_fee(amount)`` reading the customer the ``kind`` way."""

    def pay(customer: str, amount: float) -> str:
        before_paying(customer)
        return refunds.pay(customer, amount)

    if kind == "config parameter":

        @tool
        def refund_late_fee(amount: float, config: RunnableConfig) -> str:
            """Refund the customer's late fee."""
            return pay(config["configurable"]["customer"], amount)

    elif kind == "runtime.config":

        @tool
        def refund_late_fee(amount: float, runtime: ToolRuntime) -> str:
            """Refund the customer's late fee."""
            return pay(runtime.config["configurable"]["customer"], amount)

    elif kind == "get_config()":

        @tool
        def refund_late_fee(amount: float) -> str:
            """Refund the customer's late fee."""
            return pay(get_config()["configurable"]["customer"], amount)

    elif kind == "InjectedToolArg":

        @tool
        def refund_late_fee(amount: float, customer: Annotated[str, InjectedToolArg]) -> str:
            """Refund the customer's late fee."""
            return pay(customer, amount)

    elif kind == "InjectedState('customer')":

        @tool
        def refund_late_fee(
            amount: float, customer: Annotated[str, InjectedState("customer")]
        ) -> str:
            """Refund the customer's late fee."""
            return pay(customer, amount)

    elif kind == "InjectedState":

        @tool
        def refund_late_fee(amount: float, state: Annotated[dict[str, Any], InjectedState]) -> str:
            """Refund the customer's late fee."""
            return pay(state["customer"], amount)

    else:

        @tool
        def refund_late_fee(amount: float, runtime: ToolRuntime) -> str:
            """Refund the customer's late fee."""
            return pay(runtime.state["customer"], amount)

    return refund_late_fee


class Ticket(MessagesState):
    customer: str
    currency: str  # read by the property's tool only


def ticket_graph(refund: BaseTool, kind: str) -> Any:
    """A tools node answering the last model message: ToolNode, or for an
    ``InjectedToolArg`` the application's own node that fills it in (ToolNode strips a
    value the model sends for it)."""

    def filling(state: Ticket, config: RunnableConfig) -> dict[str, Any]:
        answers = []
        for c in state["messages"][-1].tool_calls:
            filled = {**c, "args": {**c["args"], "customer": state["customer"]}}
            answers.append(refund.invoke({**filled, "type": "tool_call"}, config))
        return {"messages": answers}

    builder = StateGraph(Ticket)
    builder.add_node("tools", filling if kind == "InjectedToolArg" else ToolNode([refund]))
    builder.add_edge(START, "tools")
    builder.add_edge("tools", END)
    return builder.compile(checkpointer=InMemorySaver())


def ask(graph: Any, thread_id: str, customer: str, amount: float = 15) -> str:
    """One model step asking for the refund on ``thread_id``, for ``customer`` (in the
    state and in ``configurable``); what the customer is told."""
    call = {"name": "refund_late_fee", "args": {"amount": amount}, "id": uuid.uuid4().hex}
    state = {"messages": [AIMessage("", tool_calls=[call])], "customer": customer}
    config = {"configurable": {"thread_id": thread_id, "customer": customer}}
    out = graph.invoke(state, config)
    return str([m for m in out["messages"] if isinstance(m, ToolMessage)][-1].content)


def wrap(t: BaseTool, mode: str, store: BaseIdempotencyStore, **options: Any) -> Any:
    return t if mode == "plain" else idempotent(t, store, **options)


def _nothing(customer: str) -> None:
    return None


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", MODES)
def test_two_customers_on_one_thread_are_each_paid_once_and_told_their_own(
    mode: str, kind: str
) -> None:
    refunds = Refunds()
    refund = wrap(refund_tool(kind, refunds, _nothing), mode, InMemoryIdempotencyStore())
    graph = ticket_graph(refund, kind)
    told = [ask(graph, "ticket-1", who) for who in ("alice", "bob", "alice")]
    assert told == ["refunded 15.0 to alice", "refunded 15.0 to bob", "refunded 15.0 to alice"]
    assert refunds.paid == ({"alice": 2, "bob": 1} if mode == "plain" else {"alice": 1, "bob": 1})


@pytest.mark.parametrize("kind", KINDS)
def test_a_retry_with_the_same_reads_replays(kind: str) -> None:
    refunds = Refunds()
    graph = ticket_graph(
        idempotent(refund_tool(kind, refunds, _nothing), InMemoryIdempotencyStore()), kind
    )
    for _ in range(3):  # a re-run LLM step (new call id), a resumed thread, a second worker
        assert ask(graph, "ticket-2", "alice") == "refunded 15.0 to alice"
    assert refunds.paid == {"alice": 1}


class Crash(BaseException):
    """The worker dies in the middle of the call (after the payment was sent)."""


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", MODES)
def test_a_crash_in_the_middle_of_alices_call_then_bob_gives_no_wrong_answer(
    mode: str, kind: str
) -> None:
    """Alice's worker dies mid-call (its record is left running, no reads recorded). Bob's
    call then takes the key over when the lease expires: he is paid and told his own;
    alice's retry is told hers."""
    refunds = Refunds()
    dying = {"alice"}

    def crash_once(customer: str) -> None:
        if customer in dying:
            dying.discard(customer)
            refunds.pay(customer, 15)  # the payment went out; the answer never came back
            raise Crash

    store = InMemoryIdempotencyStore()
    refund = wrap(refund_tool(kind, refunds, crash_once), mode, store, lease=0.3)
    graph = ticket_graph(refund, kind)
    with pytest.raises(Crash):
        ask(graph, "ticket-3", "alice")
    assert ask(graph, "ticket-3", "bob") == "refunded 15.0 to bob"
    assert ask(graph, "ticket-3", "alice") == "refunded 15.0 to alice"
    assert refunds.paid["bob"] == 1


def test_an_unchanged_thread_on_another_agent_server_run_replays() -> None:
    """A double-texted run on the Agent Server: another ``run_id``, request id, request
    start time and header; the tool reads none of them, so its key and answer stay."""
    refunds = Refunds()
    refund = idempotent(refund_tool("get_config()", refunds, _nothing), InMemoryIdempotencyStore())
    call = {"name": "refund_late_fee", "args": {"amount": 15}, "type": "tool_call"}
    for n in range(2):
        knobs = {
            "run_id": f"run-{n}",
            "langgraph_request_id": f"req-{n}",
            "__request_start_time_ms__": n,
            "__after_seconds__": n,
            "assistant_id": "agent",
            "graph_id": "agent",
            "checkpoint_id": f"cp-{n}",
        }
        config = {"configurable": {"thread_id": "t-ds", "customer": "alice", **knobs}}
        assert refund.invoke({**call, "id": f"c{n}"}, config).content == "refunded 15.0 to alice"
    assert refunds.paid == {"alice": 1}


def test_a_value_the_tool_reads_with_no_canonical_form_is_refused_naming_its_path() -> None:
    """A client object in the state: refused at the read, before the payment, naming the
    path and ``key_exclude=``; with ``key_exclude=["state.client"]`` it runs."""
    refunds = Refunds()

    @tool
    def refund_late_fee(amount: float, runtime: ToolRuntime) -> str:
        """Refund the customer's late fee."""
        client = runtime.state["client"]
        assert client is not None
        return refunds.pay(runtime.state["customer"], amount)

    class WithClient(Ticket):
        client: Any

    for options, refused in (({}, True), ({"key_exclude": ["state.client"]}, False)):
        builder = StateGraph(WithClient)
        builder.add_node(
            "tools", ToolNode([idempotent(refund_late_fee, InMemoryIdempotencyStore(), **options)])
        )
        builder.add_edge(START, "tools")
        builder.add_edge("tools", END)
        graph = builder.compile()  # no checkpointer: it could not save the client either
        call = {"name": "refund_late_fee", "args": {"amount": 15}, "id": "c1"}
        state = {"messages": [AIMessage("", tool_calls=[call])], "customer": "alice"}
        state["client"] = threading.Lock()
        config = {"configurable": {"thread_id": f"t-client-{refused}"}}
        if refused:
            with pytest.raises(InvalidArgumentsError) as error:
                graph.invoke(state, config)
            assert "state.client" in str(error.value)
            assert "key_exclude=['state.client']" in str(error.value)
            assert refunds.paid == {}
        else:
            graph.invoke(state, config)
            assert refunds.paid == {"alice": 1}


def test_a_non_json_argument_is_refused_naming_it_and_key_exclude() -> None:
    @tool
    def notify(channel: Any, text: str) -> str:
        """Send ``text``."""
        return "sent"

    wrapped = idempotent(notify, InMemoryIdempotencyStore())
    config: RunnableConfig = {"configurable": {"thread_id": "t-arg"}}
    with pytest.raises(InvalidArgumentsError) as error:
        wrapped.invoke({"channel": threading.Lock(), "text": "hi"}, config)
    assert "argument 'channel'" in str(error.value)
    assert "key_exclude=['channel']" in str(error.value)
    # Kept out of the key, the call runs.
    kept_out = idempotent(notify, InMemoryIdempotencyStore(), key_exclude=["channel"])
    assert kept_out.invoke({"channel": threading.Lock(), "text": "hi"}, config) == "sent"


def test_what_the_key_is_made_of_does_not_include_the_reads() -> None:
    """The first call's key is the call's own (thread, path, tool, arguments, inputs
    known before it runs); the reads only move a call whose reads differ to another key."""
    wrapped = idempotent(
        refund_tool("get_config()", Refunds(), _nothing), InMemoryIdempotencyStore()
    )
    config: RunnableConfig = {"configurable": {"thread_id": "t-x", "customer": "alice"}}
    explained = explain_key(wrapped, {"amount": 15}, config)
    assert "customer" not in str(explained) and explained.parts[0] == ("version", "v1.k4")


# -- the property -----------------------------------------------------------------------------


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    calls=st.lists(
        st.tuples(
            st.sampled_from(["alice", "bob", "carol"]),  # read: configurable["customer"]
            st.sampled_from(["EUR", "USD"]),  # read: state["currency"]
            st.sampled_from(["x", "y"]),  # never read: configurable["trace"]
        ),
        min_size=1,
        max_size=8,
    )
)
def test_calls_differing_in_a_value_read_never_share_an_answer_and_equal_reads_replay(
    calls: list[tuple[str, str, str]],
) -> None:
    """Every call is told the values it read; it runs exactly once per distinct read
    set (a value it never reads changes nothing)."""
    ran: list[tuple[str, str]] = []

    @tool
    def refund_late_fee(amount: float, runtime: ToolRuntime) -> str:
        """Refund the customer's late fee."""
        read = (runtime.config["configurable"]["customer"], runtime.state["currency"])
        ran.append(read)
        return f"{read[0]}:{read[1]}"

    wrapped = idempotent(refund_late_fee, InMemoryIdempotencyStore())
    builder = StateGraph(Ticket)
    builder.add_node("tools", ToolNode([wrapped]))
    builder.add_edge(START, "tools")
    builder.add_edge("tools", END)
    graph = builder.compile(checkpointer=InMemorySaver())
    thread_id = uuid.uuid4().hex
    for customer, currency, trace in calls:
        call = {"name": "refund_late_fee", "args": {"amount": 15}, "id": uuid.uuid4().hex}
        state = {
            "messages": [AIMessage("", tool_calls=[call])],
            "customer": customer,
            "currency": currency,
        }
        configurable = {"thread_id": thread_id, "customer": customer, "trace": trace}
        out = graph.invoke(state, {"configurable": configurable})
        assert out["messages"][-1].content == f"{customer}:{currency}"
    assert sorted(ran) == sorted({(c, cur) for c, cur, _ in calls})


# -- two customers at once, one key, on Redis and PostgreSQL ---------------------------------


@pytest.fixture(params=["redis", "postgres"])
def shared_store(request: pytest.FixtureRequest) -> Iterator[BaseIdempotencyStore]:
    if request.param == "redis":
        from langchain_idempotent.stores import RedisIdempotencyStore

        server = request.getfixturevalue("redis_server")
        store: Any = RedisIdempotencyStore.from_url(server.url, prefix=f"reads-{uuid.uuid4().hex}:")
        yield store
        asyncio.run(store.aclose())
    else:
        from langchain_idempotent.stores import PostgresIdempotencyStore

        url = request.getfixturevalue("pg_url")
        store = PostgresIdempotencyStore.from_url(url, table=f"reads_{uuid.uuid4().hex[:12]}")
        yield store
        store.close()


@pytest.mark.parametrize("kind", ["get_config()", "ToolRuntime.state"])
def test_concurrent_calls_for_two_customers_on_one_key_never_cross(
    shared_store: BaseIdempotencyStore, kind: str
) -> None:
    """Alice's and bob's calls start together on one thread with the same arguments (one
    first key); whichever runs first, the other waits, finds a stored answer whose reads
    differ and runs as its own effect. Each is told their own, each paid once."""
    refunds = Refunds()
    barrier = threading.Barrier(2)
    graph = ticket_graph(idempotent(refund_tool(kind, refunds, _nothing), shared_store), kind)
    told: dict[str, str] = {}

    def run(who: str) -> None:
        barrier.wait()
        told[who] = ask(graph, "ticket-race", who)

    for _ in range(3):
        threads = [threading.Thread(target=run, args=(who,)) for who in ("alice", "bob")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert told == {"alice": "refunded 15.0 to alice", "bob": "refunded 15.0 to bob"}
    assert refunds.paid == {"alice": 1, "bob": 1}


# -- the middleware hands the tool the same views ---------------------------------------------


@pytest.mark.parametrize(
    "kind", ["config parameter", "runtime.config", "get_config()", "ToolRuntime.state"]
)
@pytest.mark.parametrize("mode", MODES)
def test_the_middleware_keys_by_what_the_tool_reads(mode: str, kind: str) -> None:
    from langchain.agents import create_agent
    from langchain_core.messages import HumanMessage

    from langchain_idempotent import IdempotencyMiddleware
    from tests.support.graphs import ScriptedChatModel, on_each_turn
    from tests.test_effect_identity import CustomerState

    refunds = Refunds()
    store = InMemoryIdempotencyStore()
    middleware = (
        [IdempotencyMiddleware(store, tools=["refund_late_fee"])] if mode != "plain" else []
    )
    agent = create_agent(
        ScriptedChatModel(then=on_each_turn(("refund_late_fee", {"amount": 15}))),
        [refund_tool(kind, refunds, _nothing)],
        middleware=middleware,
        checkpointer=InMemorySaver(),
        state_schema=CustomerState,
    )

    def turn(who: str) -> str:
        state = {"messages": [HumanMessage("refund my late fee")], "customer": who}
        config = {"configurable": {"thread_id": f"mw-{kind}-{mode}", "customer": who}}
        out = agent.invoke(state, config)
        return str([m for m in out["messages"] if isinstance(m, ToolMessage)][-1].content)

    told = [turn(who) for who in ("alice", "bob", "alice")]
    assert told == ["refunded 15.0 to alice", "refunded 15.0 to bob", "refunded 15.0 to alice"]
    assert refunds.paid == ({"alice": 2, "bob": 1} if mode == "plain" else {"alice": 1, "bob": 1})


def test_under_approval_a_call_whose_reads_differ_is_refused_not_run_unapproved() -> None:
    """Bob's call finds alice's approved refund under its key: his is another effect that
    nobody approved, so it is refused with a reason instead of run."""
    from langchain_idempotent.core.reads import ReadsDivergedError

    refunds = Refunds()
    refund = idempotent(
        refund_tool("get_config()", refunds, _nothing),
        InMemoryIdempotencyStore(),
        approval=lambda call: False,  # a predicate: asks nobody for alice's call
    )
    call = {"name": "refund_late_fee", "args": {"amount": 15}, "type": "tool_call"}
    config = {"configurable": {"thread_id": "t-approval", "customer": "alice"}}
    assert refund.invoke({**call, "id": "c1"}, config).content == "refunded 15.0 to alice"
    bob = {"configurable": {"thread_id": "t-approval", "customer": "bob"}}
    assert refund.invoke({**call, "id": "c2"}, bob).content == "refunded 15.0 to bob"  # not gated
    approving = idempotent(
        refund_tool("get_config()", refunds, _nothing),
        InMemoryIdempotencyStore(),
        approval=lambda call: True,
    )
    with pytest.raises(ReadsDivergedError, match="nobody approved"):
        run_approved_then(approving, call)
    assert refunds.paid == {"alice": 2, "bob": 1}  # the approved tool paid alice only


def run_approved_then(refund: Any, call: dict[str, Any]) -> None:
    """Alice's call approved and run through a graph (``interrupt()`` answered), then
    bob's call on the same thread with the same arguments."""
    from langgraph.types import Command

    builder = StateGraph(Ticket)
    builder.add_node("tools", ToolNode([refund]))
    builder.add_edge(START, "tools")
    builder.add_edge("tools", END)
    graph = builder.compile(checkpointer=InMemorySaver())
    for who in ("alice", "bob"):
        config = {"configurable": {"thread_id": f"t-approved-{who}", "customer": who}}
        config["configurable"]["idempotency_scope"] = "t-approved"  # one key for both
        state = {
            "messages": [AIMessage("", tool_calls=[{**call, "id": f"id-{who}"}])],
            "customer": who,
        }
        graph.invoke(state, config)
        graph.invoke(Command(resume={"decisions": [{"type": "approve"}]}), config)


# -- the views ------------------------------------------------------------------------------


def test_a_config_view_notes_the_tools_reads_and_never_the_frameworks_knobs() -> None:
    """What LangChain does to a config (``ensure_config`` copies ``configurable``; a child
    run copies it again) keeps noting; the run's own knobs are handed out un-noted."""
    from langchain_core.runnables import ensure_config

    from langchain_idempotent.adapters._reads import view_config
    from langchain_idempotent.core.reads import ABSENT, Reads

    reads = Reads("t", exclude=["configurable.trace"])
    config: Any = {
        "recursion_limit": 7,
        "metadata": {"langgraph_step": 3},
        "configurable": {
            "thread_id": "t-1",
            "run_id": "r-1",
            "__pregel_runtime": object(),
            "customer": "alice",
            "trace": "x",
        },
    }
    view = view_config(config, reads)
    ensured = ensure_config(view)  # iterates the config: notes nothing
    assert reads.seen == {}
    configurable = ensured["configurable"]
    assert configurable["customer"] == "alice" and configurable["trace"] == "x"
    assert configurable["thread_id"] == "t-1" and configurable["run_id"] == "r-1"
    assert configurable.get("missing") is None and view.get("recursion_limit") == 7
    assert view["metadata"] == {"langgraph_step": 3}
    assert set(reads.seen) == {
        "configurable.customer",
        "configurable.missing",
        "config.recursion_limit",
    }
    assert reads.seen["configurable.missing"] == ABSENT


def test_a_state_view_writes_through_and_skips_untracked_channels() -> None:
    from langchain_idempotent.core.reads import ReadingDict, Reads

    reads = Reads("t")
    state = {"customer": "bob", "session": object()}
    view = ReadingDict(state, reads, "state", skip=frozenset({"session"}))
    assert view["session"] is state["session"]  # an UntrackedValue channel: not noted
    view["created"] = 1  # a tool that stores a handle back into the state
    assert state["created"] == 1 and list(reads.seen) == []
    assert view["customer"] == "bob" and list(reads.seen) == ["state.customer"]


@pytest.mark.parametrize("kind", ["config parameter", "get_config()", "ToolRuntime.state"])
def test_async_calls_for_two_customers_are_each_paid_once_and_told_their_own(kind: str) -> None:
    """The same through ``ainvoke`` (the tool's ``_arun``, the views in its task)."""
    refunds = Refunds()
    graph = ticket_graph(
        idempotent(refund_tool(kind, refunds, _nothing), InMemoryIdempotencyStore()), kind
    )

    async def ask_async(who: str) -> str:
        call = {"name": "refund_late_fee", "args": {"amount": 15}, "id": uuid.uuid4().hex}
        state = {"messages": [AIMessage("", tool_calls=[call])], "customer": who}
        config = {"configurable": {"thread_id": "ticket-async", "customer": who}}
        out = await graph.ainvoke(state, config)
        return str(out["messages"][-1].content)

    async def turns() -> list[str]:
        return [await ask_async(who) for who in ("alice", "bob", "alice")]

    told = asyncio.run(turns())
    assert told == ["refunded 15.0 to alice", "refunded 15.0 to bob", "refunded 15.0 to alice"]
    assert refunds.paid == {"alice": 1, "bob": 1}


def test_memory_agents_injected_config_and_store_need_no_declaration() -> None:
    """LangChain's memory-agent template: ``config: Annotated[RunnableConfig,
    InjectedToolArg]`` and ``store: Annotated[BaseStore, InjectedToolArg]``, filled in by
    its own node. The store is a handle (never a key input) and the config is keyed by what
    the tool reads of it (``user_id``), not by value: per-run knobs change nothing."""
    stored: list[tuple[str, str]] = []

    async def upsert_memory(
        content: str,
        *,
        config: Annotated[RunnableConfig, InjectedToolArg],
        store: Annotated[BaseStore, InjectedToolArg],
    ) -> str:
        """Upsert a memory.

        Args:
            content: The main content of the memory.
        """
        user = config["configurable"]["user_id"]
        stored.append((user, content))
        await store.aput(("memories", user), str(len(stored)), {"content": content})
        return f"stored for {user}"

    wrapped = idempotent(upsert_memory, store=InMemoryIdempotencyStore())
    memories = InMemoryStore()

    def call(user: str, run_id: str) -> str:
        configurable = {"thread_id": "t-1", "user_id": user, "run_id": run_id}
        config: RunnableConfig = {"configurable": configurable}
        return asyncio.run(wrapped(content="likes tea", config=config, store=memories))

    assert call("alice", "run-1") == "stored for alice"
    assert call("bob", "run-1") == "stored for bob"  # another user read: its own effect
    assert call("alice", "run-2") == "stored for alice"  # a retry on another run: replayed
    assert stored == [("alice", "likes tea"), ("bob", "likes tea")]
