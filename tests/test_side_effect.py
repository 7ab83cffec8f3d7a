"""The side-effect boundary: a takeover of an attempt that never entered
``side_effect()`` is a free retry (no reconcile, never outcome unknown); one that entered
is reconciled or raises exactly as before. Each claim is shown beside the same crash on a
tool that does not mark its effect (today's behaviour: every takeover uncertain)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from langchain_idempotent import Engine, InMemoryIdempotencyStore, Policy
from langchain_idempotent.context import get_idempotency_context, side_effect
from langchain_idempotent.errors import IdempotencyError, LeaseLostError, OutcomeUnknownError
from langchain_idempotent.events import IdempotencyEvent
from langchain_idempotent.reconcile import ReconcileCall
from langchain_idempotent.testing import FakeClock

LEASE_S = 5.0


class World:
    """A store on a hand-moved clock, the effects performed downstream, the reconcile
    calls asked, and the events seen."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.store = InMemoryIdempotencyStore(clock=self.clock)
        self.effects: list[str] = []
        self.asked: list[ReconcileCall] = []
        self.events: list[IdempotencyEvent] = []

    def engine(self, **options: Any) -> Engine:
        def hook(call: ReconcileCall) -> Any:
            self.asked.append(call)
            return None

        policy = Policy(lease=LEASE_S, reconcile=hook, **options)
        return Engine(self.store, policy, on_event=self.events.append)

    def died(self, key: str, *, boundary: bool, entered: bool = False) -> None:
        """A worker claimed ``key`` and died (before or inside its block): its lease runs out."""
        c = self.store.claim(
            key, owner="dead", fingerprint="fp", lease_ms=5000, ttl_ms=60_000, boundary=boundary
        )
        if entered:
            assert self.store.mark_effect(key, owner="dead", fence=c.fence)
        self.clock.now += LEASE_S + 1

    def refund(self, marked: bool) -> str:
        if marked:
            with get_idempotency_context().side_effect():  # type: ignore[union-attr]
                self.effects.append("refund")
        else:
            self.effects.append("refund")
        return "refunded"

    def kinds(self) -> list[str]:
        return [e.kind for e in self.events]


@pytest.mark.parametrize("on_expired", ["takeover", "raise"])
def test_a_takeover_of_an_attempt_that_died_before_its_block_is_a_free_retry(
    on_expired: Any,
) -> None:
    ours, plain = World(), World()
    ours.died("k", boundary=True)
    plain.died("k", boundary=False)

    got = ours.engine(boundary=True, on_expired=on_expired).run(
        "k", fingerprint="fp", action=lambda: ours.refund(True)
    )
    assert got == "refunded" and ours.effects == ["refund"]
    assert ours.asked == [] and "free_retry" in ours.kinds() and "takeover" not in ours.kinds()
    free = next(e for e in ours.events if e.kind == "free_retry")
    assert (free.fence, free.attempt, free.detail["reason"]) == (2, 2, "lease_expired")

    # The same crash on a tool that does not mark its effect: uncertain, the hook is asked.
    engine = plain.engine(on_expired=on_expired)
    if on_expired == "raise":
        with pytest.raises(OutcomeUnknownError):
            engine.run("k", fingerprint="fp", action=lambda: plain.refund(False))
    else:
        engine.run("k", fingerprint="fp", action=lambda: plain.refund(False))
        assert "takeover" in plain.kinds()
    assert len(plain.asked) == 1 and plain.asked[0].entered is None


@pytest.mark.parametrize("on_expired", ["takeover", "raise"])
def test_a_takeover_of_an_attempt_that_entered_its_block_is_reconciled_and_told_so(
    on_expired: Any,
) -> None:
    w = World()
    w.died("k", boundary=True, entered=True)
    engine = w.engine(boundary=True, on_expired=on_expired)
    if on_expired == "raise":
        with pytest.raises(OutcomeUnknownError):
            engine.run("k", fingerprint="fp", action=lambda: w.refund(True))
        assert w.effects == []
    else:
        engine.run("k", fingerprint="fp", action=lambda: w.refund(True))
        assert "takeover" in w.kinds() and "free_retry" not in w.kinds()
    assert [c.entered for c in w.asked] == [True]


@pytest.mark.parametrize(("inside", "retried"), [(False, "free_retry"), (True, "takeover")])
def test_a_tool_cancelled_before_its_block_is_retried_freely_and_inside_it_is_not(
    inside: bool, retried: str
) -> None:
    w = World()
    engine = w.engine(boundary=True)

    def cancelled() -> str:
        if inside:
            with get_idempotency_context().side_effect():  # type: ignore[union-attr]
                raise KeyboardInterrupt
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        engine.run("k", fingerprint="fp", action=cancelled)
    assert engine.run("k", fingerprint="fp", action=lambda: w.refund(True)) == "refunded"
    assert retried in w.kinds()
    assert len(w.asked) == (1 if inside else 0)


def test_the_context_tells_whether_the_block_was_entered() -> None:
    w = World()
    seen: list[bool] = []

    def tool() -> str:
        ctx = get_idempotency_context()
        assert ctx is not None
        seen.append(ctx.entered)
        with ctx.side_effect():
            seen.append(ctx.entered)
        with ctx.side_effect():  # a second block in a row marks nothing more
            pass
        seen.append(ctx.entered)
        return "ok"

    w.engine(boundary=True).run("k", fingerprint="fp", action=tool)
    assert seen == [False, True, True]
    assert w.store.get("k").effect == "entered"  # type: ignore[union-attr]


def test_a_run_that_lost_its_lease_is_refused_at_the_block_and_performs_nothing() -> None:
    w = World()

    def tool() -> str:
        w.store.delete("k")  # an operator (or a takeover) took the record away
        return w.refund(True)

    with pytest.raises(LeaseLostError):
        w.engine(boundary=True).run("k", fingerprint="fp", action=tool)
    assert w.effects == []


def test_async_tools_mark_with_async_with() -> None:
    w = World()

    async def tool() -> str:
        async with side_effect():
            w.effects.append("refund")
        return "ok"

    assert asyncio.run(w.engine(boundary=True).arun("k", fingerprint="fp", action=tool)) == "ok"
    assert w.effects == ["refund"] and w.store.get("k").effect == "entered"  # type: ignore[union-attr]


def test_side_effect_is_refused_outside_a_call_nested_or_undeclared() -> None:
    with pytest.raises(IdempotencyError, match="outside an idempotent tool call"), side_effect():
        pass
    w = World()

    def nested() -> str:
        with side_effect(), side_effect():
            w.effects.append("refund")
        return "ok"

    with pytest.raises(IdempotencyError, match="do not nest"):
        w.engine(boundary=True).run("n", fingerprint="fp", action=nested)
    with pytest.raises(IdempotencyError, match="boundary=True"):
        w.engine().run("u", fingerprint="fp", action=lambda: w.refund(True))
    assert w.effects == []
    # The outer block was entered (and marked) before the inner one was refused; the
    # undeclared tool's block marked nothing.
    assert w.store.get("n").effect == "entered"  # type: ignore[union-attr]
    assert w.store.get("u").effect == "unmarked"  # type: ignore[union-attr]


def test_boundary_must_be_a_bool() -> None:
    with pytest.raises(ValueError, match="boundary must be True or False"):
        Policy(boundary="yes")  # type: ignore[arg-type]
