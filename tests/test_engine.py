"""The engine's guarantees, on the in-memory store (every store runs the contract suite)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter

import pytest
from langgraph.errors import GraphBubbleUp, GraphInterrupt

from langchain_idempotent import (
    IdempotencyContext,
    IdempotencyEvent,
    InMemoryIdempotencyStore,
    InProgressError,
    OutcomeUnknownError,
    PayloadMismatchError,
    Policy,
    ResultTooLargeError,
    StoreUnavailableError,
    get_idempotency_context,
)
from langchain_idempotent.core.engine import Engine, Unmemoized
from langchain_idempotent.core.events import EventCounter
from langchain_idempotent.core.record import Claim, ClaimOutcome, State
from langchain_idempotent.core.store import ClaimRequest


class Refused(Exception):
    pass


class DownStore(InMemoryIdempotencyStore):
    """A store whose every operation fails as an unreachable backend would."""

    def claim(self, request: ClaimRequest) -> Claim:
        raise StoreUnavailableError("connection refused", key=request.key)


def make(**policy: object) -> tuple[Engine, InMemoryIdempotencyStore, list[IdempotencyEvent]]:
    store = InMemoryIdempotencyStore()
    events: list[IdempotencyEvent] = []
    return Engine(store, Policy(**policy), on_event=events.append), store, events  # type: ignore[arg-type]


def test_a_completed_key_replays_without_running_the_action_again() -> None:
    engine, _, events = make()
    runs = Counter[str]()

    def act() -> dict[str, int]:
        runs["k"] += 1
        return {"refund": 140}

    assert engine.run("k", fingerprint="f", action=act) == {"refund": 140}
    assert engine.run("k", fingerprint="f", action=act) == {"refund": 140}
    assert runs["k"] == 1
    assert [e.kind for e in events] == ["claim", "complete", "replay"]


@pytest.mark.parametrize("value", [0, "", [], None, {}, False, b"", 0.0])
def test_falsy_results_replay_as_themselves(value: object) -> None:
    engine, _, _ = make()
    assert engine.run("k", fingerprint="f", action=lambda: value) == value
    replayed = engine.run("k", fingerprint="f", action=lambda: "ran again")
    assert replayed == value and type(replayed) is type(value)


def test_concurrent_duplicates_wait_for_the_first_result_instead_of_running() -> None:
    engine, _, _ = make()
    runs: list[int] = []
    results: list[object] = []

    def act() -> str:
        runs.append(1)
        time.sleep(0.2)
        return "done"

    threads = [
        threading.Thread(
            target=lambda: results.append(engine.run("k", fingerprint="f", action=act))
        )
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(runs) == 1
    assert results == ["done"] * 8
    assert engine.stats()["wait"] == 7


async def test_concurrent_async_duplicates_wait_for_the_first_result() -> None:
    engine, _, _ = make()
    runs: list[int] = []

    async def act() -> str:
        runs.append(1)
        await asyncio.sleep(0.1)
        return "done"

    results = await asyncio.gather(
        *(engine.arun("k", fingerprint="f", action=act) for _ in range(8))
    )
    assert results == ["done"] * 8 and len(runs) == 1


def test_a_waiter_gives_up_with_in_progress_after_wait_timeout() -> None:
    engine, store, _ = make(wait_timeout=0.1, lease=5)
    store.claim(ClaimRequest("k", owner="other", fingerprint="f", lease_ms=5000, ttl_ms=60000))
    started = time.monotonic()
    with pytest.raises(InProgressError) as info:
        engine.run("k", fingerprint="f", action=lambda: "never")
    assert info.value.key == "k"
    assert 0.09 < time.monotonic() - started < 2


def test_a_retryable_error_releases_the_key_so_a_retry_runs_with_a_higher_fence() -> None:
    engine, store, events = make()
    fences: list[int] = []

    def flaky() -> str:
        ctx = get_idempotency_context()
        assert ctx is not None
        fences.append(ctx.fence)
        if len(fences) == 1:
            raise ConnectionError("gateway reset")
        return "ok"

    with pytest.raises(ConnectionError):
        engine.run("k", fingerprint="f", action=flaky)
    rec = store.get("k")
    assert rec is not None and rec.state is State.FREE
    assert engine.run("k", fingerprint="f", action=flaky) == "ok"
    assert fences == [1, 2]
    assert "release" in [e.kind for e in events]


def test_a_terminal_error_is_stored_and_re_raised_on_replay_without_running() -> None:
    engine, store, _ = make(terminal_exceptions=(Refused,))
    runs: list[int] = []

    def refuse() -> str:
        runs.append(1)
        raise Refused("card declined")

    for _ in range(3):
        with pytest.raises(Refused, match="card declined"):
            engine.run("k", fingerprint="f", action=refuse)
    assert len(runs) == 1
    rec = store.get("k")
    assert rec is not None and rec.state is State.FAILED


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), SystemExit(3)])
def test_an_interrupted_run_leaves_the_key_uncertain_for_a_takeover_and_propagates(
    exc: BaseException,
) -> None:
    # Interrupted mid-tool, the effect may have happened: not a clean retryable error.
    store = InMemoryIdempotencyStore()
    engine = Engine(store, Policy(terminal_exceptions=(Exception,)))

    def boom() -> str:
        raise exc

    with pytest.raises(type(exc)):
        engine.run("k", fingerprint="f", action=boom)
    rec = store.get("k")
    assert rec is not None and rec.state is State.RUNNING and rec.uncertain(store.now_ms())
    claim = store.claim(
        ClaimRequest("k", owner="next", fingerprint="f", lease_ms=1000, ttl_ms=1000)
    )
    assert (claim.outcome, claim.reason, claim.attempt) == (ClaimOutcome.TAKEOVER, "cancelled", 2)


@pytest.mark.parametrize("exc", [GraphInterrupt()])
def test_control_flow_releases_the_lease_and_propagates(
    exc: BaseException,
) -> None:
    # The adapters name LangGraph's control flow (interrupt(), parent commands) as never
    # terminal; the engine itself does not import LangGraph.
    store = InMemoryIdempotencyStore()
    engine = Engine(
        store, Policy(terminal_exceptions=(Exception,)), never_terminal=(GraphBubbleUp,)
    )

    def boom() -> str:
        raise exc

    with pytest.raises(type(exc)):
        engine.run("k", fingerprint="f", action=boom)
    rec = store.get("k")
    assert rec is not None and rec.state is State.FREE


async def test_cancellation_leaves_the_key_uncertain_for_a_takeover() -> None:
    engine, store, events = make()

    async def slow() -> str:
        await asyncio.sleep(10)
        return "never"

    task = asyncio.create_task(engine.arun("k", fingerprint="f", action=slow))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    rec = store.get("k")
    assert rec is not None and rec.state is State.RUNNING and rec.uncertain(store.now_ms())

    async def fast() -> str:
        return "again"

    assert await engine.arun("k", fingerprint="f", action=fast) == "again"
    assert [e.kind for e in events] == ["claim", "abandon", "takeover", "complete"]
    assert events[1].detail == {"reason": "cancelled"}


def test_the_same_key_with_other_arguments_is_rejected() -> None:
    engine, _, _ = make()
    engine.run("k", fingerprint="a", action=lambda: 1)
    with pytest.raises(PayloadMismatchError) as info:
        engine.run("k", fingerprint="b", action=lambda: 2)
    assert info.value.key == "k"


def test_an_expired_lease_is_taken_over_and_the_tool_is_told() -> None:
    engine, store, events = make(lease=0.1)
    store.claim(ClaimRequest("k", owner="crashed", fingerprint="f", lease_ms=100, ttl_ms=60000))
    time.sleep(0.15)
    seen = []
    engine.run("k", fingerprint="f", action=lambda: seen.append(get_idempotency_context()))
    ctx = seen[0]
    assert ctx.takeover and ctx.fence == 2 and ctx.attempt == 2 and ctx.key == "k"
    assert "takeover" in [e.kind for e in events]


def test_on_expired_raise_reports_an_unknown_outcome_and_leaves_the_record() -> None:
    engine, store, events = make(lease=0.1, on_expired="raise")
    store.claim(ClaimRequest("k", owner="crashed", fingerprint="f", lease_ms=100, ttl_ms=60000))
    time.sleep(0.15)
    with pytest.raises(OutcomeUnknownError, match="resolve"):
        engine.run("k", fingerprint="f", action=lambda: "never")
    assert [e.kind for e in events] == ["outcome_unknown"]
    rec = store.get("k")
    assert rec is not None and rec.state is State.RUNNING and rec.owner == "crashed"


def test_a_long_tool_keeps_its_lease_by_renewal_so_no_one_takes_over() -> None:
    engine, _, events = make(lease=0.15)
    runs: list[int] = []
    results: list[object] = []

    def slow() -> str:
        runs.append(1)
        time.sleep(0.5)
        return "done"

    first = threading.Thread(
        target=lambda: results.append(engine.run("k", fingerprint="f", action=slow))
    )
    first.start()
    time.sleep(0.05)
    results.append(engine.run("k", fingerprint="f", action=slow))
    first.join()
    assert len(runs) == 1 and results == ["done", "done"]
    assert "takeover" not in [e.kind for e in events]


def test_a_stale_owner_finishing_second_returns_the_stored_result() -> None:
    engine, store, events = make(lease=0.1, renew_fraction=0.99)
    release = threading.Event()

    def stalls() -> str:
        release.wait(5)
        return "late"

    late: list[object] = []
    t = threading.Thread(
        target=lambda: late.append(engine.run("k", fingerprint="f", action=stalls))
    )
    # The renewal can't keep up with a lease this short: force expiry by claiming after it.
    t.start()
    time.sleep(0.05)
    rec = store.get("k")
    assert rec is not None
    # Simulate the pause: the owner's renewals are blocked by a long GC-like stall.
    store._records["k"] = (
        rec.__class__(**{**_fields(rec), "lease_until": 0}),
        store._records["k"][1],
    )
    other = Engine(store, Policy(lease=5))
    assert other.run("k", fingerprint="f", action=lambda: "fresh") == "fresh"
    release.set()
    t.join()
    assert late == ["fresh"]
    assert "stale_completion" in [e.kind for e in events]


def _fields(rec: object) -> dict[str, object]:
    import dataclasses

    return {f.name: getattr(rec, f.name) for f in dataclasses.fields(rec)}  # type: ignore[arg-type]


def test_fail_closed_the_action_never_runs_when_the_store_is_down() -> None:
    engine = Engine(DownStore(), Policy())
    runs: list[int] = []
    with pytest.raises(StoreUnavailableError):
        engine.run("k", fingerprint="f", action=lambda: runs.append(1))
    assert runs == []


def test_fail_open_runs_the_action_unprotected_and_says_so() -> None:
    counter = EventCounter()
    engine = Engine(DownStore(), Policy(fail_open=True), on_event=counter)
    assert engine.run("k", fingerprint="f", action=lambda: "ran") == "ran"
    assert counter["fail_open"] == 1 and counter["store_error"] == 1


async def test_an_unprotected_run_still_gets_its_key_to_pass_downstream() -> None:
    seen: list[IdempotencyContext | None] = []

    def action() -> str:
        seen.append(get_idempotency_context())
        return "ran"

    async def aaction() -> str:
        return action()

    engine = Engine(DownStore(), Policy(fail_open=True))
    engine.run("k", fingerprint="f", action=action)
    await engine.arun("k", fingerprint="f", action=aaction)
    for ctx in seen:
        assert ctx is not None and ctx.key == "k"
        assert (ctx.protected, ctx.fence, ctx.attempt, ctx.takeover) == (False, 0, 0, False)
        ctx.check_lease()  # no lease to lose: never raises
    assert get_idempotency_context() is None  # only while the action runs
    protected, _, _ = make()
    protected.run("p", fingerprint="f", action=action)
    assert seen[-1] is not None and seen[-1].protected and seen[-1].fence == 1


def test_a_result_over_the_size_limit_is_an_error_and_is_not_repeated() -> None:
    engine, _, _ = make(max_result_bytes=1000)
    runs: list[int] = []

    def big() -> str:
        runs.append(1)
        return "x" * 5000

    with pytest.raises(ResultTooLargeError, match="max_result_bytes"):
        engine.run("k", fingerprint="f", action=big)
    with pytest.raises(ResultTooLargeError, match="max_result_bytes"):  # the same error
        engine.run("k", fingerprint="f", action=big)
    assert len(runs) == 1


def test_an_event_hook_that_raises_never_breaks_the_call() -> None:
    def bad_hook(event: IdempotencyEvent) -> None:
        raise RuntimeError("hook bug")

    engine = Engine(InMemoryIdempotencyStore(), on_event=bad_hook)
    assert engine.run("k", fingerprint="f", action=lambda: 1) == 1


def test_context_is_none_outside_and_set_inside_the_action() -> None:
    engine, _, _ = make()
    assert get_idempotency_context() is None
    seen: list[object] = []
    engine.run("k", fingerprint="f", action=lambda: seen.append(get_idempotency_context()))
    ctx = seen[0]
    assert (
        isinstance(ctx, IdempotencyContext)
        and ctx.key == "k"
        and ctx.fence == 1
        and not ctx.takeover
    )
    assert get_idempotency_context() is None


def test_engine_rejects_things_that_are_not_stores() -> None:
    with pytest.raises(TypeError, match="idempotency store"):
        Engine(object())  # type: ignore[arg-type]


def test_a_tool_that_lost_its_lease_learns_it_and_can_stop_before_the_effect() -> None:
    engine, store, events = make(lease=0.15)
    effects: list[int] = []

    def long_tool() -> str:
        ctx = get_idempotency_context()
        assert ctx is not None
        # Another worker takes the key over while this one is stalled (as after a pause).
        rec = store.get("k")
        assert rec is not None
        store._records["k"] = (
            rec.__class__(**{**_fields(rec), "owner": "someone-else", "fence": rec.fence + 1}),
            store._records["k"][1],
        )
        deadline = time.monotonic() + 2
        while not ctx.lease_lost and time.monotonic() < deadline:
            time.sleep(0.01)
        ctx.check_lease()
        effects.append(1)
        return "done"

    from langchain_idempotent import LeaseLostError

    with pytest.raises(LeaseLostError) as info:
        engine.run("k", fingerprint="f", action=long_tool)
    assert info.value.key == "k" and effects == []
    assert "lease_lost" in [e.kind for e in events]


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_an_unmemoized_answer_is_returned_and_the_key_released(mode: str) -> None:
    engine, store, events = make()
    runs: list[int] = []

    def act() -> object:
        runs.append(1)
        return Unmemoized("the tool failed; tell the model") if len(runs) == 1 else "done"

    async def aact() -> object:
        return act()

    def call() -> object:
        return engine.run("k", fingerprint="f", action=act)

    async def acall() -> object:
        return await engine.arun("k", fingerprint="f", action=aact)

    first = call() if mode == "sync" else await acall()
    assert first == "the tool failed; tell the model"
    rec = store.get("k")
    assert rec is not None and rec.state is State.FREE
    assert (call() if mode == "sync" else await acall()) == "done"
    assert len(runs) == 2
    assert [e.kind for e in events] == ["claim", "release", "claim", "complete"]


def test_the_engine_does_not_import_langgraph() -> None:
    import ast
    import inspect

    import langchain_idempotent.core.engine as engine_module

    tree = ast.parse(inspect.getsource(engine_module))
    imported = {
        name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for name in (
            [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        )
    }
    assert not {m for m in imported if m.split(".")[0] in ("langgraph", "langchain_core")}
