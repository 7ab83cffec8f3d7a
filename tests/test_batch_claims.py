"""Parallel tool calls of one model message claim (and replay) in one store round trip.

A ``ToolNode`` step (and a ``create_agent`` step through ``IdempotencyMiddleware``) with
N = 4 calls of one ``AIMessage``: the store wrapper counts operations, each of which is one
round trip. Batched, the step makes one ``claim_many`` and no single claim; the same four
calls in four messages (nothing to batch) make four claims. Every call still gets its own
answer, a second run replays all four from the one batched claim, and two steps racing
on the same message still run each effect once (the inner tools, unwrapped, run twice).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.runnables import ensure_config
from langchain_core.tools import BaseTool, StructuredTool, ToolException

from langchain_idempotent import (
    IdempotencyMiddleware,
    InMemoryIdempotencyStore,
    get_idempotency_context,
    idempotent,
)
from langchain_idempotent.adapters import _siblings
from langchain_idempotent.adapters._call import PendingCall
from langchain_idempotent.core.engine import Engine
from langchain_idempotent.core.policy import Policy
from langchain_idempotent.core.record import ClaimOutcome, State
from langchain_idempotent.core.store import BaseIdempotencyStore, ClaimRequest
from langchain_idempotent.errors import OutcomeUnknownError
from langchain_idempotent.stores.redis import RedisIdempotencyStore
from langchain_idempotent.stores.sqlite import SqliteIdempotencyStore
from tests.support.counting import CountingStore
from tests.support.graphs import (
    Effects,
    ScriptedChatModel,
    assert_every_call_answered,
    call,
    calls,
    final,
    thread,
    tool_graph,
)

N = 4
#: These tests count round trips, not takeovers. Under the 2 s default lease a batch hands
#: its claims over within a 0.5 s pickup window; on an overloaded CI machine a sibling can
#: come later than that, and its claim is then given back (correctly) and taken alone.
LEASE = 30


@pytest.fixture(params=["memory", "sqlite", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CountingStore]:
    inner: BaseIdempotencyStore
    if request.param == "memory":
        inner = InMemoryIdempotencyStore()
    elif request.param == "sqlite":
        inner = SqliteIdempotencyStore(tmp_path / "batch.db")
    else:
        server = request.getfixturevalue("redis_server")
        prefix = request.getfixturevalue("redis_prefix")
        inner = RedisIdempotencyStore.from_url(server.url, prefix=prefix)
    yield CountingStore(inner)
    inner.close()


def tools(effects: Effects, pause: float = 0.0) -> list[BaseTool]:
    def charge(card: str, cents: int) -> str:
        time.sleep(pause)
        n = effects.record("charge", card=card, cents=cents)
        return f"charged {cents} on {card} (#{n})"

    def email(to: str) -> str:
        time.sleep(pause)
        effects.record("email", to=to)
        return f"mailed {to}"

    async def acharge(card: str, cents: int) -> str:
        await asyncio.sleep(pause)
        return charge(card, cents)

    async def aemail(to: str) -> str:
        await asyncio.sleep(pause)
        return email(to)

    return [
        StructuredTool.from_function(charge, coroutine=acharge, description="Charge a card."),
        StructuredTool.from_function(email, coroutine=aemail, description="Send an email."),
    ]


def four_calls(tag: str) -> AIMessage:
    return calls(
        call("charge", {"card": "A", "cents": 100}, id=f"{tag}-1"),
        call("charge", {"card": "B", "cents": 200}, id=f"{tag}-2"),
        call("email", {"to": "ann@example.com"}, id=f"{tag}-3"),
        call("charge", {"card": "C", "cents": 300}, id=f"{tag}-4"),
    )


def answers(messages: list[Any]) -> dict[str, str]:
    return {m.tool_call_id: str(m.content) for m in messages if isinstance(m, ToolMessage)}


def assert_answers(messages: list[Any], tag: str) -> None:
    assert_every_call_answered(messages)
    got = answers(messages)
    assert got[f"{tag}-1"].startswith("charged 100 on A")
    assert got[f"{tag}-2"].startswith("charged 200 on B")
    assert got[f"{tag}-3"] == "mailed ann@example.com"
    assert got[f"{tag}-4"].startswith("charged 300 on C")


def graph(
    store: BaseIdempotencyStore, effects: Effects, script: list[Any], pause: float = 0.0
) -> Any:
    wrapped = idempotent(tools(effects, pause), store=store, lease=LEASE)
    return tool_graph(ScriptedChatModel(script=script), wrapped)


@pytest.mark.parametrize("face", ["sync", "async"])
def test_four_calls_of_one_toolnode_step_claim_and_replay_in_one_round_trip(
    store: CountingStore, face: str
) -> None:
    effects = Effects()
    for run in ("first", "replay"):
        store.reset()
        g = graph(store, effects, [four_calls("s"), final()])
        inputs = {"messages": [HumanMessage("pay")]}
        out = (
            g.invoke(inputs, thread("t-step"))
            if face == "sync"
            else asyncio.run(g.ainvoke(inputs, thread("t-step")))
        )
        assert_answers(out["messages"], "s")
        assert store.claims() == (0, 1), (run, store.counts)  # one round trip, not four
        completes = store.counts["complete"] + store.counts["acomplete"]
        assert completes == (N if run == "first" else 0)
        assert effects.count() == N  # the replay ran nothing


def test_the_same_calls_in_separate_messages_claim_one_by_one(store: CountingStore) -> None:
    """The comparison: nothing to batch, four single claims."""
    effects = Effects()
    one_each = [calls(tc) for tc in four_calls("m").tool_calls]
    g = graph(store, effects, [*one_each, final()])
    out = g.invoke({"messages": [HumanMessage("pay")]}, thread("t-separate"))
    assert_answers(out["messages"], "m")
    assert store.claims() == (N, 0)


def test_a_single_call_is_claimed_as_before(store: CountingStore) -> None:
    effects = Effects()
    g = graph(store, effects, [calls(call("email", {"to": "x@example.com"}, id="one")), final()])
    g.invoke({"messages": [HumanMessage("mail")]}, thread("t-single"))
    assert store.claims() == (1, 0)


@pytest.mark.parametrize("protected", [True, False], ids=["wrapped", "unwrapped"])
def test_two_steps_racing_on_one_message_still_run_each_effect_once(
    store: CountingStore, protected: bool
) -> None:
    """Two runs of the same step at once (a retried run while the first still runs): each
    effect once; the second step's batch finds the keys busy and waits for the replays.
    Unwrapped, the same race performs every effect twice."""
    effects = Effects()

    def run() -> list[Any]:
        plain = tools(effects, pause=0.3)
        chosen = idempotent(plain, store=store, lease=LEASE) if protected else plain
        g = tool_graph(ScriptedChatModel(script=[four_calls("r"), final()]), chosen)
        out = g.invoke({"messages": [HumanMessage("pay")]}, thread("t-race"))
        return list(out["messages"])

    results: list[list[Any]] = []
    threads = [threading.Thread(target=lambda: results.append(run())) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(results) == 2
    for messages in results:
        assert_answers(messages, "r")
    assert effects.count() == (N if protected else 2 * N)
    if protected:
        # One batch per step, or one shared: the steps run in one process, on one message,
        # and a step that arrives while the other's batch is open joins it.
        assert store.claims()[1] in (1, 2), store.counts


@pytest.mark.parametrize("face", ["sync", "async"])
def test_four_calls_through_create_agent_claim_and_replay_in_one_round_trip(
    store: CountingStore, face: str
) -> None:
    effects = Effects()
    for run in ("first", "replay"):
        store.reset()
        agent = create_agent(
            ScriptedChatModel(script=[four_calls("a"), final()]),
            tools=tools(effects),
            middleware=[IdempotencyMiddleware(store, tools=["charge", "email"], lease=LEASE)],
        )
        inputs = {"messages": [HumanMessage("pay")]}
        out = (
            agent.invoke(inputs, thread("t-agent"))
            if face == "sync"
            else asyncio.run(agent.ainvoke(inputs, thread("t-agent")))
        )
        assert_answers(out["messages"], "a")
        assert store.claims() == (0, 1), (run, store.counts)
        assert effects.count() == N


def test_create_agent_siblingses_only_the_tools_the_middleware_names(store: CountingStore) -> None:
    effects = Effects()
    agent = create_agent(
        ScriptedChatModel(script=[four_calls("n"), final()]),
        tools=tools(effects),
        middleware=[IdempotencyMiddleware(store, tools=["charge"], lease=LEASE)],
    )
    out = agent.invoke({"messages": [HumanMessage("pay")]}, thread("t-named"))
    assert_answers(out["messages"], "n")
    assert store.claims() == (0, 1)
    assert len(store.inner.list()) == 3  # the three charges; the email is not protected


# -- a sibling that never comes ---------------------------------------------------------


def _pending(engine: Engine, tool_call_id: str) -> PendingCall:
    pending = PendingCall.derive(
        tool="t",
        schema=None,
        tool_input={"x": tool_call_id},
        args={"x": tool_call_id},
        tool_call_id=tool_call_id,
        config=thread("t-gone"),
        policy=engine.policy,
    )
    assert pending is not None
    return pending


def _wait_until(check: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return check()


def test_a_sibling_that_never_runs_gives_its_lease_back_after_the_pickup_window() -> None:
    """The leader claims for three calls; only it runs. The other two keys are released
    (a fresh claim: not busy) well before their lease would end; a takeover the batch made
    is abandoned, so the next claimant is still told the earlier run's outcome is unknown."""
    store = InMemoryIdempotencyStore()
    engine = Engine(store, Policy(lease=30.0, ttl=60.0))  # window: 10 s; lease: 30 s
    me, gone, taken = (_pending(engine, f"c{i}") for i in range(3))
    # ``taken`` was started by a run whose lease expired: the batch takes it over.
    key = taken.derived.key
    fp = taken.derived.fingerprint
    store.claim(ClaimRequest(key, owner="dead", fingerprint=fp, lease_ms=1, ttl_ms=60_000))
    time.sleep(0.01)
    short = Engine(store, Policy(lease=0.3, ttl=60.0))  # a 0.1 s window for the test
    step_short = _siblings.StepCalls(
        ("c0", "c1", "c2"), lambda: [s.sibling(short) for s in (me, gone, taken)]
    )
    mine = _siblings.take(me.sibling(short), step_short)
    assert mine is not None and mine.claim.outcome is ClaimOutcome.ACQUIRED
    gone_key = gone.derived.key
    assert store.get(gone_key).state is State.RUNNING  # type: ignore[union-attr]
    assert _wait_until(lambda: store.get(gone_key).state is State.FREE)  # type: ignore[union-attr]
    assert _wait_until(lambda: store.get(key).lease_until == 0)  # type: ignore[union-attr]
    again = store.claim(
        ClaimRequest(key, owner="next", fingerprint=fp, lease_ms=1000, ttl_ms=60_000)
    )
    assert again.outcome is ClaimOutcome.TAKEOVER
    assert again.reason == "lease_expired"
    # A late sibling's old claim is gone (the window passed): it leads a new batch and
    # acquires the released key afresh (the fence still grows).
    late = _siblings.take(gone.sibling(short), step_short)
    assert late is not None and late.claim.outcome is ClaimOutcome.ACQUIRED
    assert late.claim.fence == 2


def test_claim_many_of_a_store_without_its_own_siblings_claims_one_by_one() -> None:
    """Third-party stores keep working: the base class's default loops over ``claim``."""
    inner = InMemoryIdempotencyStore()

    class OneByOne(CountingStore):
        def claim_many(self, requests: Any) -> list[Any]:
            return BaseIdempotencyStore.claim_many(self, requests)

    store = OneByOne(inner)
    requests = [ClaimRequest(f"k{i % 2}", f"o{i}", "fp", 1000, 5000) for i in range(3)]
    got = [c.outcome for c in store.claim_many(requests)]
    assert got == [ClaimOutcome.ACQUIRED, ClaimOutcome.ACQUIRED, ClaimOutcome.BUSY]
    assert store.counts["claim"] == 3
    assert asyncio.run(store.aclaim_many([])) == []


def test_a_failed_siblings_claim_sends_every_call_to_claim_on_its_own(tmp_path: Path) -> None:
    """claim_many unreachable (here: refused) while claim works: all four calls still claim,
    run once and answer; nothing is lost to the failed batch."""
    from langchain_idempotent.errors import StoreUnavailableError

    class NoBatches(CountingStore):
        def claim_many(self, requests: Any) -> list[Any]:
            self._count("claim_many")
            raise StoreUnavailableError("batch refused")

    store = NoBatches(InMemoryIdempotencyStore())
    effects = Effects()
    out = graph(store, effects, [four_calls("f"), final()]).invoke(
        {"messages": [HumanMessage("pay")]}, thread("t-fail")
    )
    assert_answers(out["messages"], "f")
    assert store.claims() == (N, 1)
    assert effects.count() == N


def test_each_sibling_holds_its_lease_under_the_owner_token_the_siblings_claimed_it_with(
    store: CountingStore,
) -> None:
    """The charge on card B fails with a handled error, so its call releases the key —
    which only the owner the batch claimed it for can do (a release under any other token
    is refused and the key would stay running until its lease ran out). The other three
    complete at fence 1."""
    effects = Effects()
    plain = tools(effects)

    def charge(card: str, cents: int) -> str:
        if card == "B":
            raise ToolException("card declined")
        return str(plain[0].invoke({"card": card, "cents": cents}))

    declining = StructuredTool.from_function(
        charge, name="charge", description="Charge a card.", handle_tool_error=True
    )
    wrapped = idempotent([declining, plain[1]], store=store, lease=LEASE)
    g = tool_graph(ScriptedChatModel(script=[four_calls("o"), final()]), wrapped)
    out = g.invoke({"messages": [HumanMessage("pay")]}, thread("t-owner"))
    assert answers(out["messages"])["o-2"] == "card declined"
    assert store.claims() == (0, 1)
    states = sorted((r.state.value, r.fence) for r in store.inner.list())
    assert states == [("completed", 1)] * 3 + [("free", 1)]
    assert store.counts["release"] == 1


# -- each call under its own tool's policy ------------------------------------------------


class _Clock:
    """A store clock that moves only when told (leases are read exactly)."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def _leased_tools(store: BaseIdempotencyStore, seen: dict[str, int]) -> list[BaseTool]:
    """``charge`` and ``email``, each noting the lease left on its own record as it runs."""

    def lease_left() -> int:
        rec = store.get(get_idempotency_context().key)
        assert rec is not None
        return rec.lease_until - store.now_ms()

    def charge(card: str) -> str:
        seen[f"charge {card}"] = lease_left()
        return f"charged {card}"

    def email(to: str) -> str:
        seen[f"email {to}"] = lease_left()
        return f"mailed {to}"

    return [
        StructuredTool.from_function(charge, description="Charge a card."),
        StructuredTool.from_function(email, description="Send an email."),
    ]


def test_two_same_named_tools_in_one_process_each_hold_their_own_lease_in_a_batched_step() -> None:
    """Two agents in one process wrap ``charge`` and ``email`` with a 5 s and a 300 s lease.
    Each agent's step is claimed in one batch, and every call holds the lease of the tool
    that runs it (a table by name, last one wrapped wins, gave the 5 s tools 300 s)."""
    store = CountingStore(InMemoryIdempotencyStore(clock=_Clock()))
    step = [
        calls(
            call("charge", {"card": "A"}, id="p-1"),
            call("charge", {"card": "B"}, id="p-2"),
            call("email", {"to": "ann"}, id="p-3"),
        ),
        final(),
    ]
    leases: dict[str, dict[str, int]] = {"short": {}, "long": {}}
    agents = {  # both wrapped before either runs
        label: idempotent(_leased_tools(store, leases[label]), store=store, lease=lease)
        for label, lease in (("short", 5.0), ("long", 300.0))
    }
    for label, wrapped in agents.items():
        tool_graph(ScriptedChatModel(script=step), wrapped).invoke(
            {"messages": [HumanMessage("pay")]}, thread(f"t-{label}")
        )
    assert leases == {
        "short": {"charge A": 5_000, "charge B": 5_000, "email ann": 5_000},
        "long": {"charge A": 300_000, "charge B": 300_000, "email ann": 300_000},
    }
    assert store.claims() == (0, 2)  # one batch per step, no single claim


@pytest.mark.parametrize(
    ("own", "other"), [("takeover", "raise"), ("raise", "takeover")], ids=["takes-over", "raises"]
)
def test_a_batched_takeover_follows_the_tools_own_on_expired_not_a_same_named_tools(
    own: str, other: str
) -> None:
    """``refund``'s first attempt crashed and its lease passed. ``note``, its sibling in the
    model message, leads the step's batch. A same-named ``refund`` wrapped elsewhere in the
    process, last, with the other ``on_expired`` changes nothing: ``takeover`` takes over
    and refunds once, ``raise`` raises ``OutcomeUnknownError`` and refunds nothing."""
    clock = _Clock()
    store = CountingStore(InMemoryIdempotencyStore(clock=clock))
    effects = Effects()

    def refund(amount: int) -> str:
        effects.record("refund", amount=amount)
        return f"refunded {amount}"

    def note(text: str) -> str:
        return f"noted {text}"

    plain = [
        StructuredTool.from_function(refund, description="Refund."),
        StructuredTool.from_function(note, description="Take a note."),
    ]
    in_graph = idempotent(plain, store=store, lease=30, ttl=600, on_expired=own)  # type: ignore[call-overload]
    idempotent(plain[0], store=store, lease=300, ttl=600, on_expired=other)  # type: ignore[call-overload]
    refund_call = call("refund", {"amount": 15}, id="c1")
    note_call = call("note", {"text": "late fee"}, id="c2")
    ai = calls(refund_call, note_call)
    config = ensure_config(
        {
            "configurable": {"thread_id": "t1", "__pregel_read": lambda ch, fresh: [ai]},
            "metadata": {"langgraph_node": "tools"},
        }
    )
    pending = in_graph[0]._derive(refund_call, config)
    assert pending is not None
    crashed = store.inner.claim(
        ClaimRequest(
            pending.derived.key,
            owner="crashed",
            fingerprint=pending.derived.fingerprint,
            lease_ms=1_000,
            ttl_ms=60_000,
        )
    )
    assert crashed.outcome is ClaimOutcome.ACQUIRED
    clock.now += 1.2  # the crashed attempt's lease has passed

    assert in_graph[1].invoke(note_call, config).content == "noted late fee"
    assert store.claims() == (0, 1)  # note led: refund was claimed in the same batch
    if own == "takeover":
        assert in_graph[0].invoke(refund_call, config).content == "refunded 15"
        assert effects.count() == 1
        rec = store.get(pending.derived.key)
        assert rec is not None and (rec.state, rec.fence, rec.attempt) == (State.COMPLETED, 2, 2)
    else:
        with pytest.raises(OutcomeUnknownError):
            in_graph[0].invoke(refund_call, config)
        assert effects.count() == 0
    assert store.claims() == (0, 1)  # refund took the batch's claim: no claim of its own


def test_a_claim_made_under_another_policy_is_given_back_and_the_call_claims_its_own() -> None:
    """The safety net: a batch that holds a claim made with a request other than the
    call's own (here a 300 s lease for a 5 s tool) never hands it over. It is released,
    and the call claims on its own, with its own lease."""
    store = CountingStore(InMemoryIdempotencyStore(clock=_Clock()))
    five, three_hundred = Engine(store, Policy(lease=5.0)), Engine(store, Policy(lease=300.0))
    me, other = _pending(five, "g1"), _pending(five, "g2")
    # The leader believes ``other`` runs under the 300 s engine; it runs under the 5 s one.
    step = _siblings.StepCalls(("g1", "g2"), lambda: [other.sibling(three_hundred)])
    mine = _siblings.take(me.sibling(five), step)
    assert mine is not None and mine.request.lease_ms == 5_000
    assert _siblings.take(other.sibling(five), step) is None
    assert store.counts["release"] == 1
    rec = store.get(other.derived.key)
    assert rec is not None and rec.state is State.FREE
    got = five.run(other.derived.key, fingerprint=other.derived.fingerprint, action=lambda: 1)
    assert got == 1
    assert store.claims() == (1, 1)
