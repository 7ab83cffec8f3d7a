"""Every event kind is emitted in the situation it names, with the right key, fence and
attempt; events are logged to ``langchain_idempotent`` (no handler installed) and counted
by ``Engine.stats()``.

The store is an :class:`InMemoryIdempotencyStore` on a hand-moved clock, so lease expiry
is a step of the test, never a sleep.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from collections.abc import Mapping
from typing import Any

import pytest

from langchain_idempotent import (
    CorruptRecordError,
    IdempotencyEvent,
    InMemoryIdempotencyStore,
    PayloadMismatchError,
    Policy,
    StoreUnavailableError,
)
from langchain_idempotent.core.engine import Engine
from langchain_idempotent.core.events import EVENT_KINDS
from langchain_idempotent.core.record import Completion
from langchain_idempotent.core.serde import ResultSerializer
from langchain_idempotent.core.store import ClaimRequest, CompleteRequest

KEY = "k-1"
TOOL = "issue_refund"


class Clock:
    """The store's clock, in seconds; tests move it forward."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class Recorder:
    """An ``on_event`` hook that keeps every event."""

    def __init__(self) -> None:
        self.events: list[IdempotencyEvent] = []
        self.seen = {kind: threading.Event() for kind in EVENT_KINDS}

    def __call__(self, event: IdempotencyEvent) -> None:
        self.events.append(event)
        self.seen[event.kind].set()

    def trail(self) -> list[tuple[str, str, str | None, int, int]]:
        """``(kind, key, tool, fence, attempt)`` of every event, in order."""
        return [(e.kind, e.key, e.tool, e.fence, e.attempt) for e in self.events]

    def clear(self) -> None:
        self.events.clear()


class ReachableUntil(InMemoryIdempotencyStore):
    """A store that fails, as an unreachable backend would, from operation ``down`` on."""

    def __init__(self, *, down: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.down = down

    def claim(self, request: ClaimRequest) -> Any:
        if self.down == "claim":
            raise StoreUnavailableError("connection refused", key=request.key)
        return super().claim(request)

    def complete(self, request: CompleteRequest) -> Completion:
        if self.down == "complete":
            raise StoreUnavailableError("connection reset", key=request.key)
        return super().complete(request)


def setup(
    store: InMemoryIdempotencyStore | None = None, **policy: Any
) -> tuple[Engine, InMemoryIdempotencyStore, Recorder, Clock]:
    clock = Clock()
    store = store if store is not None else InMemoryIdempotencyStore(clock=clock)
    recorder = Recorder()
    return Engine(store, Policy(**policy), on_event=recorder), store, recorder, clock


def run(engine: Engine, action: Any = lambda: "refunded", fingerprint: str = "fp") -> Any:
    return engine.run(KEY, fingerprint=fingerprint, action=action, tool=TOOL)


def crashed_owner(store: InMemoryIdempotencyStore, lease_ms: int = 1000) -> None:
    """Another worker claims the key (fence 1) and never finishes."""
    store.claim(
        ClaimRequest(KEY, owner="crashed", fingerprint="fp", lease_ms=lease_ms, ttl_ms=3_600_000)
    )


def test_a_first_run_emits_claim_then_complete_at_fence_1_attempt_1() -> None:
    engine, _, rec, _ = setup()
    assert run(engine) == "refunded"
    assert rec.trail() == [("claim", KEY, TOOL, 1, 1), ("complete", KEY, TOOL, 1, 1)]


def test_a_repeated_call_emits_replay_and_runs_nothing() -> None:
    engine, _, rec, _ = setup()
    run(engine)
    rec.clear()
    assert run(engine, action=lambda: pytest.fail("ran twice")) == "refunded"
    assert rec.trail() == [("replay", KEY, TOOL, 1, 1)]


def test_a_duplicate_of_a_running_call_emits_wait_once_then_replay() -> None:
    engine, store, rec, _ = setup(wait_timeout=5)
    crashed_owner(store, lease_ms=60_000)
    payload = ResultSerializer().dumps("theirs")
    finisher = threading.Timer(
        0.05,
        lambda: store.complete(
            CompleteRequest(
                KEY,
                owner="crashed",
                fence=1,
                fingerprint="fp",
                payload=payload,
                failed=False,
                ttl_ms=60_000,
            )
        ),
    )
    finisher.start()
    try:
        assert run(engine, action=lambda: pytest.fail("ran twice")) == "theirs"
    finally:
        finisher.join()
    assert rec.trail() == [("wait", KEY, TOOL, 1, 1), ("replay", KEY, TOOL, 1, 1)]
    assert 0 < rec.events[0].detail["lease_left_ms"] <= 60_000


def test_an_expired_lease_emits_takeover_at_the_next_fence_and_attempt() -> None:
    engine, store, rec, clock = setup()
    crashed_owner(store, lease_ms=1000)
    clock.now += 2
    run(engine)
    assert rec.trail() == [("takeover", KEY, TOOL, 2, 2), ("complete", KEY, TOOL, 2, 2)]


def test_a_renewal_that_finds_the_lease_taken_emits_lease_lost_and_the_late_result_is_stale() -> (
    None
):
    engine, store, rec, clock = setup(lease=0.3)  # renewed every 0.1 s of real time

    def slow_tool() -> str:
        clock.now += 1  # the lease (0.3 s on the store's clock) passes...
        store.claim(
            ClaimRequest(KEY, owner="thief", fingerprint="fp", lease_ms=60_000, ttl_ms=60_000)
        )
        assert rec.seen["lease_lost"].wait(5), "the renewal never noticed"
        return "late"

    assert run(engine, action=slow_tool) == "late"
    assert rec.trail() == [
        ("claim", KEY, TOOL, 1, 1),
        ("lease_lost", KEY, TOOL, 1, 1),
        ("stale_completion", KEY, TOOL, 1, 1),
    ]
    # Write-once: the first completion is stored, even from the stale owner.
    assert rec.events[-1].detail == {"stored": True}


def test_a_completion_after_another_result_emits_stale_completion_and_returns_that_result() -> None:
    engine, store, rec, clock = setup(lease=30)
    theirs = ResultSerializer().dumps("theirs")

    def overtaken() -> str:
        clock.now += 60
        claim = store.claim(
            ClaimRequest(KEY, owner="thief", fingerprint="fp", lease_ms=1000, ttl_ms=60_000)
        )
        store.complete(
            CompleteRequest(
                KEY,
                owner="thief",
                fence=claim.fence,
                fingerprint="fp",
                payload=theirs,
                failed=False,
                ttl_ms=60_000,
            )
        )
        return "mine"

    assert run(engine, action=overtaken) == "theirs"
    assert rec.trail() == [("claim", KEY, TOOL, 1, 1), ("stale_completion", KEY, TOOL, 1, 1)]
    assert rec.events[-1].detail == {"stored": False}


def test_the_key_reused_with_other_arguments_emits_payload_mismatch() -> None:
    engine, _, rec, _ = setup()
    run(engine, fingerprint="fp-a")
    rec.clear()
    with pytest.raises(PayloadMismatchError):
        run(engine, fingerprint="fp-b")
    assert rec.trail() == [("payload_mismatch", KEY, TOOL, 1, 1)]


def test_an_unreachable_store_emits_store_error_and_the_tool_does_not_run() -> None:
    engine, _, rec, _ = setup(ReachableUntil(down="claim"))
    with pytest.raises(StoreUnavailableError):
        run(engine, action=lambda: pytest.fail("ran unprotected"))
    assert rec.trail() == [("store_error", KEY, TOOL, 0, 0)]
    assert rec.events[0].detail["op"] == "claim"
    assert "connection refused" in rec.events[0].detail["error"]


def test_fail_open_emits_store_error_then_fail_open_and_runs_the_tool() -> None:
    engine, _, rec, _ = setup(ReachableUntil(down="claim"), fail_open=True)
    assert run(engine) == "refunded"
    assert [e.kind for e in rec.events] == ["store_error", "fail_open"]


def test_a_store_error_on_completion_is_reported_and_the_result_still_returned() -> None:
    engine, _, rec, _ = setup(ReachableUntil(down="complete"))
    assert run(engine) == "refunded"
    assert rec.trail() == [("claim", KEY, TOOL, 1, 1), ("store_error", KEY, TOOL, 1, 1)]
    assert rec.events[-1].detail["op"] == "complete"


def test_a_stored_payload_that_cannot_be_decoded_emits_store_error() -> None:
    engine, store, rec, _ = setup()
    crashed_owner(store)
    store.complete(
        CompleteRequest(
            KEY,
            owner="crashed",
            fence=1,
            fingerprint="fp",
            payload=b"pickle\n\x80\x04",
            failed=False,
            ttl_ms=60_000,
        )
    )
    with pytest.raises(CorruptRecordError):
        run(engine)
    assert [(e.kind, e.detail.get("op")) for e in rec.events] == [
        ("replay", None),
        ("store_error", "decode"),
    ]


def test_a_retryable_error_emits_release_and_the_retry_claims_the_next_fence() -> None:
    engine, _, rec, _ = setup()

    def flaky() -> str:
        raise ConnectionError("502 from the refunds API")

    with pytest.raises(ConnectionError):
        run(engine, action=flaky)
    assert rec.trail() == [("claim", KEY, TOOL, 1, 1), ("release", KEY, TOOL, 1, 1)]
    rec.clear()
    run(engine)
    assert rec.trail() == [("claim", KEY, TOOL, 2, 2), ("complete", KEY, TOOL, 2, 2)]


async def test_the_async_driver_emits_the_same_events() -> None:
    engine, _, rec, _ = setup(wait_timeout=5)

    async def refund() -> str:
        await asyncio.sleep(0.05)
        return "refunded"

    first = asyncio.create_task(engine.arun(KEY, fingerprint="fp", action=refund, tool=TOOL))
    await asyncio.sleep(0.01)
    second = await engine.arun(KEY, fingerprint="fp", action=refund, tool=TOOL)
    assert (await first, second) == ("refunded", "refunded")
    assert sorted(rec.trail()) == sorted(
        [
            ("claim", KEY, TOOL, 1, 1),
            ("wait", KEY, TOOL, 1, 1),
            ("complete", KEY, TOOL, 1, 1),
            ("replay", KEY, TOOL, 1, 1),
        ]
    )


def test_stats_counts_every_event_by_kind() -> None:
    engine, store, _, clock = setup()
    run(engine)  # claim, complete
    run(engine)  # replay
    run(engine)  # replay
    with pytest.raises(PayloadMismatchError):
        run(engine, fingerprint="other")  # payload_mismatch
    store.claim(
        ClaimRequest("k-2", owner="crashed", fingerprint="fp", lease_ms=1000, ttl_ms=60_000)
    )
    clock.now += 2
    engine.run("k-2", fingerprint="fp", action=lambda: 1)  # takeover, complete
    assert engine.stats() == {
        "claim": 1,
        "complete": 2,
        "replay": 2,
        "payload_mismatch": 1,
        "takeover": 1,
    }


def test_stats_count_even_without_a_hook_or_logging() -> None:
    engine = Engine(InMemoryIdempotencyStore(), Policy())
    engine.run(KEY, fingerprint="fp", action=lambda: 1)
    engine.run(KEY, fingerprint="fp", action=lambda: 1)
    assert engine.stats() == {"claim": 1, "complete": 1, "replay": 1}


def test_events_are_logged_to_langchain_idempotent_at_their_level(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = Engine(InMemoryIdempotencyStore(), Policy())  # no hook: logging alone
    with caplog.at_level(logging.DEBUG, logger="langchain_idempotent"):
        engine.run(KEY, fingerprint="fp", action=lambda: 1, tool=TOOL)
        engine.run(KEY, fingerprint="fp", action=lambda: 1, tool=TOOL)
        with pytest.raises(PayloadMismatchError):
            engine.run(KEY, fingerprint="other", action=lambda: 1, tool=TOOL)
    ours = [r for r in caplog.records if r.name == "langchain_idempotent"]
    assert [(r.levelname, r.getMessage().split()[1]) for r in ours] == [
        ("DEBUG", "claim"),
        ("DEBUG", "complete"),
        ("INFO", "replay"),
        ("WARNING", "payload_mismatch"),
    ]
    assert re.fullmatch(
        rf"idempotency replay key={KEY} tool={TOOL} fence=1 attempt=1 claim_ms=[0-9.]+",
        ours[2].getMessage(),
    )


def test_the_library_installs_no_log_handler() -> None:
    import langchain_idempotent.cli
    import langchain_idempotent.cli.doctor
    import langchain_idempotent.integrations.otel
    import langchain_idempotent.stores.redis
    import langchain_idempotent.stores.sqlite  # noqa: F401

    root = logging.getLogger("langchain_idempotent")
    assert root.handlers == []
    assert root.propagate
    children: Mapping[str, Any] = logging.Logger.manager.loggerDict
    for name, logger in children.items():
        if name.startswith("langchain_idempotent.") and isinstance(logger, logging.Logger):
            assert logger.handlers == [], name


def test_every_event_kind_has_one_row_a_log_level_and_a_line_in_the_docs() -> None:
    from langchain_idempotent.core import events

    assert set(events._KINDS) == set(EVENT_KINDS) and len(EVENT_KINDS) == len(events._KINDS)
    assert set(EVENT_KINDS) - {"claim", "complete", "release"} == events.SURFACED_KINDS
    doc = events.__doc__ or ""
    assert [kind for kind in EVENT_KINDS if f"``{kind}``" not in doc] == []


def test_quiet_events_reach_every_listener_but_an_observer_marked_surfaced_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Claims and completions are built only for someone who hears them: the engine's
    ``on_event``, a call's own observer, a DEBUG log; an observer marked ``surfaced_only``
    (the adapters') is not called for them, and the counters count them anyway."""
    from langchain_idempotent.core.events import surfaced_only

    hooked: list[str] = []
    seen: list[str] = []
    marked: list[str] = []
    engine = Engine(InMemoryIdempotencyStore(), on_event=lambda e: hooked.append(e.kind))
    engine.run("q-1", fingerprint="fp", action=lambda: 1, observer=lambda e: seen.append(e.kind))
    assert hooked == seen == ["claim", "complete"]

    quiet = Engine(InMemoryIdempotencyStore())
    only = surfaced_only(lambda e: marked.append(e.kind))
    quiet.run("q-2", fingerprint="fp", action=lambda: 1, observer=only)
    quiet.run("q-2", fingerprint="fp", action=lambda: 1, observer=only)
    assert marked == ["replay"]
    assert quiet.stats() == {"claim": 1, "complete": 1, "replay": 1}

    with caplog.at_level(logging.DEBUG, logger="langchain_idempotent"):
        quiet.run("q-3", fingerprint="fp", action=lambda: 1, observer=only)
    assert marked == ["replay"]
    assert [r.getMessage().split()[1] for r in caplog.records] == ["claim", "complete"]
