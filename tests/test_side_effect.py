"""The side-effect boundary: a takeover of an attempt that never entered
``side_effect()`` is a free retry (no reconcile, never outcome unknown); one that entered
is reconciled or raises exactly as before. Each claim is shown beside the same crash on a
tool that does not mark its effect (today's behaviour: every takeover uncertain).

An exception raised after the block was entered is an unknown outcome too: the key is
abandoned (reason ``error``, the exception's type), so the retry reconciles, unless the
exception is one ``not_sent=`` names or the tool is ``keyed`` (released: a free retry)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from langchain_core.tools import tool

from langchain_idempotent import InMemoryIdempotencyStore, Policy, idempotent
from langchain_idempotent.core.context import get_idempotency_context, side_effect
from langchain_idempotent.core.engine import Engine
from langchain_idempotent.core.events import IdempotencyEvent
from langchain_idempotent.core.reconcile import ReconcileCall
from langchain_idempotent.core.store import ClaimRequest, Held
from langchain_idempotent.errors import (
    IdempotencyError,
    LeaseLostError,
    OutcomeUnknownError,
    SideEffectMisuseError,
)
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
            ClaimRequest(
                key, owner="dead", fingerprint="fp", lease_ms=5000, ttl_ms=60_000, boundary=boundary
            )
        )
        if entered:
            assert self.store.mark_effect(Held(key, owner="dead", fence=c.fence))
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


def test_side_effect_is_refused_outside_a_call_nested_undeclared_or_in_a_read_tool() -> None:
    """Each refusal is a ``SideEffectMisuseError`` (an ``IdempotencyError``) naming the misuse."""
    assert issubclass(SideEffectMisuseError, IdempotencyError)
    with pytest.raises(SideEffectMisuseError, match="outside an idempotent tool call"):
        side_effect()
    w = World()

    def nested() -> str:
        with side_effect(), side_effect():
            w.effects.append("refund")
        return "ok"

    with pytest.raises(SideEffectMisuseError, match="do not nest"):
        w.engine(boundary=True).run("n", fingerprint="fp", action=nested)
    with pytest.raises(SideEffectMisuseError, match="boundary=True"):
        w.engine().run("u", fingerprint="fp", action=lambda: w.refund(True))
    assert w.effects == []
    # The outer block was entered (and marked) before the inner one was refused; the
    # undeclared tool's block marked nothing.
    assert w.store.get("n").effect == "entered"  # type: ignore[union-attr]
    assert w.store.get("u").effect == "unmarked"  # type: ignore[union-attr]

    @tool
    def peek(invoice: str) -> str:
        """Read something."""
        with side_effect():
            return invoice

    with pytest.raises(SideEffectMisuseError, match="declared effect='read'"):
        idempotent(peek, InMemoryIdempotencyStore(), effect="read").invoke({"invoice": "A"})


def test_boundary_must_be_a_bool() -> None:
    with pytest.raises(ValueError, match="boundary must be True or False"):
        Policy(boundary="yes")  # type: ignore[arg-type]


# -- an exception after the block was entered: the outcome is unknown ------------------------


class ReadTimeout(Exception):
    """Stands for the client's read timeout: the request went out, the answer did not come."""


class ConnectRefused(Exception):
    """Stands for a refused connection: nothing left the process."""


def _timed_out_after_sending(w: World) -> str:
    with get_idempotency_context().side_effect():  # type: ignore[union-attr]
        w.effects.append("refund")  # the provider committed
        raise ReadTimeout("read timed out")


def _error_type(exc: type[BaseException]) -> str:
    return f"{exc.__module__}.{exc.__qualname__}"


def test_an_error_inside_the_block_keeps_the_key_uncertain_and_the_retry_reconciles() -> None:
    w = World()
    engine = w.engine(boundary=True)
    with pytest.raises(ReadTimeout):  # the caller that saw the error still gets it
        engine.run("k", fingerprint="fp", action=lambda: _timed_out_after_sending(w))
    rec = w.store.get("k")
    assert rec is not None and rec.uncertain(w.store.now_ms()) and rec.effect == "entered"
    abandon = next(e for e in w.events if e.kind == "abandon")
    assert abandon.detail == {"reason": "error", "error_type": _error_type(ReadTimeout)}

    assert engine.run("k", fingerprint="fp", action=lambda: w.refund(True)) == "refunded"
    assert "takeover" in w.kinds() and "release" not in w.kinds()
    [asked] = w.asked
    assert (asked.reason, asked.entered, asked.error_type) == (
        "error",
        True,
        _error_type(ReadTimeout),
    )
    assert (asked.previous_attempt, asked.attempt) == (1, 2)


def test_before_this_change_the_same_error_released_the_key_and_nobody_was_asked() -> None:
    # The same tool, its error named in not_sent=: the old behaviour, a clean free retry.
    w = World()
    engine = w.engine(boundary=True, not_sent=(ReadTimeout,))
    with pytest.raises(ReadTimeout):
        engine.run("k", fingerprint="fp", action=lambda: _timed_out_after_sending(w))
    assert "release" in w.kinds()
    engine.run("k", fingerprint="fp", action=lambda: w.refund(True))
    assert w.asked == [] and "takeover" not in w.kinds()
    assert w.effects == ["refund", "refund"]  # what an unknown outcome retried blind costs


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("on_expired", ["takeover", "raise"])
def test_without_reconcile_on_expired_decides_after_an_error_in_the_block(
    mode: str, on_expired: Any
) -> None:
    w = World()
    engine = Engine(w.store, Policy(lease=LEASE_S, boundary=True, on_expired=on_expired))

    async def atimed_out() -> str:
        async with side_effect():
            w.effects.append("refund")
            raise ReadTimeout("read timed out")

    async def arefund() -> str:
        async with side_effect():
            w.effects.append("refund")
        return "refunded"

    def run(sync: Any, asynchronous: Any) -> Any:
        if mode == "sync":
            return engine.run("k", fingerprint="fp", action=sync)
        return asyncio.run(engine.arun("k", fingerprint="fp", action=asynchronous))

    with pytest.raises(ReadTimeout):
        run(lambda: _timed_out_after_sending(w), atimed_out)
    if on_expired == "raise":
        with pytest.raises(OutcomeUnknownError):
            run(lambda: w.refund(True), arefund)
        assert w.effects == ["refund"]
    else:
        assert run(lambda: w.refund(True), arefund) == "refunded"
        assert w.effects == ["refund", "refund"]  # re-sent, with the key handed downstream


def test_an_error_before_the_block_is_still_a_free_retry() -> None:
    w = World()
    engine = w.engine(boundary=True)

    def refused() -> str:
        raise ReadTimeout("failed before the block")

    with pytest.raises(ReadTimeout):
        engine.run("k", fingerprint="fp", action=refused)
    assert engine.run("k", fingerprint="fp", action=lambda: w.refund(True)) == "refunded"
    assert "release" in w.kinds() and w.asked == [] and w.effects == ["refund"]


@pytest.mark.parametrize("options", [{"not_sent": (ConnectRefused,)}, {"effect": "keyed"}])
def test_a_not_sent_error_inside_the_block_releases_and_a_keyed_tool_releases_any(
    options: dict[str, Any],
) -> None:
    w = World()
    engine = w.engine(boundary=True, **options)

    def refused() -> str:
        with get_idempotency_context().side_effect():  # type: ignore[union-attr]
            raise ConnectRefused("connection refused")

    with pytest.raises(ConnectRefused):
        engine.run("k", fingerprint="fp", action=refused)
    assert "release" in w.kinds() and "abandon" not in w.kinds()
    engine.run("k", fingerprint="fp", action=lambda: w.refund(True))
    assert w.asked == []


@pytest.mark.parametrize("effect", ["unsafe", "irreversible"])
def test_an_unsafe_or_irreversible_tool_without_a_boundary_never_re_runs_blind_after_an_error(
    effect: str,
) -> None:
    ours, plain = World(), World()

    def timed_out(w: World) -> str:
        w.effects.append("refund")
        raise ReadTimeout("read timed out")

    # The class's presets as the wrapper resolves them (approval is the wrapper's, not here).
    engine = Engine(ours.store, Policy(lease=LEASE_S, effect=effect).for_tool("refund"))  # type: ignore[arg-type]
    with pytest.raises(ReadTimeout):
        engine.run("k", fingerprint="fp", action=lambda: timed_out(ours))
    with pytest.raises(OutcomeUnknownError):
        engine.run("k", fingerprint="fp", action=lambda: ours.refund(False))
    assert ours.effects == ["refund"]

    # A tool with no class keeps today's default: the error releases, the retry re-runs.
    engine = Engine(plain.store, Policy(lease=LEASE_S))
    with pytest.raises(ReadTimeout):
        engine.run("k", fingerprint="fp", action=lambda: timed_out(plain))
    engine.run("k", fingerprint="fp", action=lambda: plain.refund(False))
    assert plain.effects == ["refund", "refund"]


def test_an_unsafe_tool_with_a_boundary_is_uncertain_only_after_entering_it() -> None:
    w = World()
    engine = w.engine(boundary=True, effect="unsafe")

    def refused() -> str:
        raise ReadTimeout("before the block")

    with pytest.raises(ReadTimeout):
        engine.run("k", fingerprint="fp", action=refused)
    assert "release" in w.kinds()
    with pytest.raises(ReadTimeout):
        engine.run("k2", fingerprint="fp", action=lambda: _timed_out_after_sending(w))
    assert w.store.get("k2").uncertain(w.store.now_ms())  # type: ignore[union-attr]


def test_an_interrupt_in_an_irreversible_tool_without_a_boundary_still_releases() -> None:
    from langgraph.errors import GraphInterrupt

    from langchain_idempotent.adapters._compat import NEVER_TERMINAL

    w = World()
    policy = Policy(lease=LEASE_S, effect="irreversible").for_tool("refund")
    engine = Engine(w.store, policy, never_terminal=NEVER_TERMINAL, on_event=w.events.append)

    def asks() -> str:
        raise GraphInterrupt(())

    with pytest.raises(GraphInterrupt):
        engine.run("k", fingerprint="fp", action=asks)
    assert engine.run("k", fingerprint="fp", action=lambda: w.refund(False)) == "refunded"
    assert [e.kind for e in w.events if e.kind in ("release", "abandon")] == ["release"]


def test_side_effect_entered_again_after_its_block_raised_is_refused_at_the_call() -> None:
    w = World()

    def retries_inside(errors: tuple[type[Exception], ...]) -> Any:
        def tool() -> str:
            try:
                with side_effect():
                    w.effects.append("refund")
                    raise errors[0]("first send")
            except errors:
                with side_effect():  # a blind re-send from inside the run
                    w.effects.append("refund")
            return "refunded"

        return tool

    with pytest.raises(IdempotencyError, match=r"entered again .* after its block raised"):
        w.engine(boundary=True).run("k", fingerprint="fp", action=retries_inside((ReadTimeout,)))
    assert w.effects == ["refund"]
    # An error not_sent= names proves nothing left: the re-send in the run is allowed.
    engine = w.engine(boundary=True, not_sent=(ConnectRefused,))
    assert engine.run("k2", fingerprint="fp", action=retries_inside((ConnectRefused,))) == (
        "refunded"
    )


@pytest.mark.parametrize(
    "bad", [ReadTimeout("an instance"), "httpx.ConnectError", (ReadTimeout, int), 3]
)
def test_not_sent_takes_only_exception_classes(bad: Any) -> None:
    from langchain_core.tools import tool

    with pytest.raises(TypeError, match="not_sent= takes exception classes"):
        Policy(not_sent=bad)

    @tool
    def refund(amount: int) -> str:
        """Refund."""
        return "ok"

    from langchain_idempotent import idempotent

    with pytest.raises(TypeError, match="not_sent= takes exception classes"):
        idempotent(refund, InMemoryIdempotencyStore(), not_sent=bad)
    assert Policy(not_sent=ReadTimeout).not_sent == (ReadTimeout,)  # one class is enough


@pytest.mark.parametrize("boundary", [True, False])
def test_a_handled_error_after_the_block_keeps_the_key_uncertain(boundary: bool) -> None:
    """An error already turned into a message (the middleware's view of a ToolNode that
    handles tool errors) leaves the key as the exception would have: uncertain once the
    block was entered, released (a free retry) by a tool that marks no boundary."""
    from langchain_idempotent.core.engine import Unmemoized

    w = World()
    engine = w.engine(boundary=boundary)

    def handled() -> Any:
        with get_idempotency_context().side_effect() if boundary else contextlib.nullcontext():
            w.effects.append("refund")  # the provider committed; the answer was lost
        return Unmemoized("Error: the billing API timed out", error="x.HandledError")

    assert engine.run("k", fingerprint="fp", action=handled) == ("Error: the billing API timed out")
    assert engine.run("k", fingerprint="fp", action=lambda: w.refund(boundary)) == "refunded"
    if boundary:
        [asked] = w.asked
        assert (asked.reason, asked.entered, asked.error_type) == ("error", True, "x.HandledError")
        assert "release" not in w.kinds()
    else:
        assert w.asked == [] and "release" in w.kinds()
