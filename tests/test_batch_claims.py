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
from langchain_core.tools import BaseTool, StructuredTool, ToolException

from langchain_idempotent import (
    IdempotencyMiddleware,
    InMemoryIdempotencyStore,
    _siblings,
    idempotent,
)
from langchain_idempotent._call import PendingCall
from langchain_idempotent.engine import Engine
from langchain_idempotent.policy import Policy
from langchain_idempotent.record import ClaimOutcome, State
from langchain_idempotent.stores.base import BaseIdempotencyStore, ClaimRequest
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
    wrapped = idempotent(tools(effects, pause), store=store)
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
        chosen = idempotent(plain, store=store) if protected else plain
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
            middleware=[IdempotencyMiddleware(store, tools=["charge", "email"])],
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
        middleware=[IdempotencyMiddleware(store, tools=["charge"])],
    )
    out = agent.invoke({"messages": [HumanMessage("pay")]}, thread("t-named"))
    assert_answers(out["messages"], "n")
    assert store.claims() == (0, 1)
    assert len(store.inner.list()) == 3  # the three charges; the email is not protected


# -- a sibling that never comes ---------------------------------------------------------


def _sibling(engine: Engine, tool_call_id: str) -> _siblings.Sibling:
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
    return _siblings.Sibling(engine, pending)


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
    me, gone, taken = (_sibling(engine, f"c{i}") for i in range(3))
    # ``taken`` was started by a run whose lease expired: the batch takes it over.
    key = taken.pending.derived.key
    fp = taken.pending.derived.fingerprint
    store.claim(key, owner="dead", fingerprint=fp, lease_ms=1, ttl_ms=60_000)
    time.sleep(0.01)
    short = Engine(store, Policy(lease=0.3, ttl=60.0))  # a 0.1 s window for the test
    step_short = _siblings.StepCalls(
        ("c0", "c1", "c2"),
        lambda: [_siblings.Sibling(short, s.pending) for s in (me, gone, taken)],
    )
    mine = _siblings.take(_siblings.Sibling(short, me.pending), step_short)
    assert mine is not None and mine.claim.outcome is ClaimOutcome.ACQUIRED
    gone_key = gone.pending.derived.key
    assert store.get(gone_key).state is State.RUNNING  # type: ignore[union-attr]
    assert _wait_until(lambda: store.get(gone_key).state is State.FREE)  # type: ignore[union-attr]
    assert _wait_until(lambda: store.get(key).lease_until == 0)  # type: ignore[union-attr]
    again = store.claim(key, owner="next", fingerprint=fp, lease_ms=1000, ttl_ms=60_000)
    assert again.outcome is ClaimOutcome.TAKEOVER
    assert again.reason == "lease_expired"
    # A late sibling's old claim is gone (the window passed): it leads a new batch and
    # acquires the released key afresh (the fence still grows).
    late = _siblings.take(_siblings.Sibling(short, gone.pending), step_short)
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
    wrapped = idempotent([declining, plain[1]], store=store)
    g = tool_graph(ScriptedChatModel(script=[four_calls("o"), final()]), wrapped)
    out = g.invoke({"messages": [HumanMessage("pay")]}, thread("t-owner"))
    assert answers(out["messages"])["o-2"] == "card declined"
    assert store.claims() == (0, 1)
    states = sorted((r.state.value, r.fence) for r in store.inner.list())
    assert states == [("completed", 1)] * 3 + [("free", 1)]
    assert store.counts["release"] == 1
