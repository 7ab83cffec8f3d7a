"""The flow of one call: claim, run, complete — the decisions, with no store I/O.

:class:`Flow` is the half of :class:`~langchain_idempotent.core.engine.Engine` that decides:
one generator, :meth:`Flow._flow`, yields *steps* (claim, watch, run, complete, release,
abandon, reconcile; :mod:`._steps`) and receives their results, raising or returning the
call's answer. It emits events and reads the monotonic clock for the wait deadline, and
nothing else; what each store operation decides is the table in :mod:`.protocol`, and
the engine's sync and async drivers (:mod:`.engine`) only perform the steps, so the two
paths cannot drift.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Mapping
from typing import Any

from ..errors import (
    IdempotencyError,
    InProgressError,
    LeaseLostError,
    OutcomeUnknownError,
    PayloadMismatchError,
    StoreUnavailableError,
)
from ._reconciling import HookAnswer
from ._steps import (
    _CLAIM,
    Unmemoized,
    _AbandonStep,
    _Answer,
    _Call,
    _CompleteStep,
    _Outcome,
    _ReconcileStep,
    _ReleaseStep,
    _RunStep,
    _Step,
    _WatchStep,
)
from .context import IdempotencyContext, _Boundary, _Journal, _LeaseFlag
from .events import (
    QUIET_KINDS,
    EventCounter,
    EventHook,
    EventKind,
    IdempotencyEvent,
    deliver,
    listens_quietly,
    logger,
)
from .policy import Policy
from .reconcile import ReconcileCall
from .record import Claim, ClaimOutcome, Completion, UncertainReason, error_type_of
from .serde import ResultSerializer

__all__ = ["Flow"]


class Flow:
    """The protocol's decisions for one call, as a generator of steps (see the module).

    The engine supplies the policy, the serializer, the ``on_event`` hook and the event
    counter; the flow reads nothing else."""

    policy: Policy
    serializer: ResultSerializer
    on_event: EventHook | None
    never_terminal: tuple[type[BaseException], ...]
    _counter: EventCounter
    #: What a run's side-effect boundary is told, the same for every call (the policy is
    #: frozen): the exceptions that prove nothing was sent, and whether the tool is keyed.
    _resendable: tuple[type[BaseException], ...]
    _keyed: bool

    def _flow(self, call: _Call, made: Claim | None = None) -> Generator[_Step, Any, Any]:
        """Claim (waiting out a live lease), then run and complete, or answer without
        running: a replay, a reconciled result, or an unprotected run (fail open, the store
        down). BUSY waits and claims again; MISMATCH and EXPIRED (``on_expired="raise"``)
        raise. The common first run and replay pass through this one frame. ``made``: the
        answer to the first claim, which a batch of sibling calls already made."""
        deadline: float | None = None
        waited: float | None = None  # when the first BUSY answer came (perf_counter)
        while True:
            started = time.perf_counter()
            try:
                claim: Claim
                if made is None:
                    claim = yield _CLAIM
                else:
                    claim, made = made, None
            except IdempotencyError as exc:  # unreachable store or an unreadable record
                detail = {"op": "claim", "error": str(exc), **_took(started, waited)}
                self._emit(call, "store_error", detail=detail)
                if self.policy.fail_open and isinstance(exc, StoreUnavailableError):
                    return (yield from self._unprotected(call))
                raise
            took = _took(started, waited)  # the claim's round trip (and the wait), as detail
            outcome = claim.outcome
            if outcome is ClaimOutcome.REPLAY:
                self._emit(call, "replay", claim.fence, claim.attempt, took)
                return self._replay(call, claim.payload, claim.failed)
            if outcome.runs:
                return (yield from self._run_owned(call, claim, took))
            if outcome is ClaimOutcome.BUSY:
                first = deadline is None
                if deadline is None:  # infinite for wait_timeout=None: the lease bounds it
                    deadline = time.monotonic() + self.policy.wait_timeout_s
                    waited = time.perf_counter()
                watch = self._watch(call, claim, deadline)
                if first:
                    detail = {"lease_left_ms": claim.retry_after_ms, **took}
                    self._emit(call, "wait", claim.fence, claim.attempt, detail)
                yield watch
                continue
            if outcome is ClaimOutcome.MISMATCH:
                self._emit(call, "payload_mismatch", claim.fence, claim.attempt, took)
                raise PayloadMismatchError(
                    "this idempotency key was already used with different arguments; a key "
                    "must identify one payload (use a new key for a new request)",
                    key=call.key,
                )
            return (yield from self._expired(call, claim, took))

    def _watch(self, call: _Call, claim: Claim, deadline: float) -> _WatchStep:
        """The watch on a BUSY key, or :class:`InProgressError` once the wait is over."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise InProgressError(
                f"another caller is still running this tool call (fence {claim.fence}, "
                f"lease {claim.retry_after_ms} ms left) and it did not finish within "
                f"wait_timeout={self.policy.wait_timeout_s:g}s; retry later or raise "
                "wait_timeout",
                key=call.key,
            )
        return _WatchStep(claim.fence, min(left, claim.retry_after_ms / 1000 + 0.002))

    def _expired(
        self, call: _Call, claim: Claim, took: Mapping[str, float]
    ) -> Generator[_Step, Any, Any]:
        """``on_expired="raise"`` met an expired lease: the reconcile hook's result, stored
        write-once over the record as it is (nothing is held), or ``OutcomeUnknownError``."""
        if call.reconcile is not None:
            found = yield from self._consult(call, claim, claim.attempt, took)
            if found is not None:
                held = IdempotencyContext(
                    key=call.key,
                    fence=claim.fence,
                    attempt=claim.attempt,
                    takeover=True,
                    owner=call.owner,
                )
                return (yield from self._store_reconciled(call, held, found.value, owned=False))
            took = {}  # the claim's time went with the reconcile event
        self._emit(call, "outcome_unknown", claim.fence, claim.attempt, took)
        ended = "lost its lease"
        if claim.reason == "error":
            ended = f"raised {claim.error_type or 'an exception'} after its side effect began"
        elif claim.reason == "cancelled":
            ended = "was cancelled mid-tool"
        what = "a previous run" if call.step is None else f"step {call.step!r}: a previous run"
        raise OutcomeUnknownError(
            f"{what} (fence {claim.fence}, attempt {claim.attempt}) {ended} "
            "without recording a result, so its side effect may or may not have happened; "
            "check downstream, then run `langchain-idempotent resolve "
            f"{call.key}` to store the real result or free the key",
            key=call.key,
        )

    def _unprotected(self, call: _Call) -> Generator[_Step, Any, Any]:
        """Fail open: run without a lease, but with the key (a downstream that deduplicates
        on it still can); nothing is stored."""
        self._emit(call, "fail_open")
        done: _Outcome = yield _RunStep(
            IdempotencyContext(
                key=call.key, fence=0, attempt=0, takeover=False, owner=call.owner, protected=False
            )
        )
        if done.exc is not None:
            raise done.exc
        return done.value.value if isinstance(done.value, Unmemoized) else done.value

    def _run_owned(
        self, call: _Call, claim: Claim, took: Mapping[str, float]
    ) -> Generator[_Step, Any, Any]:
        """Holding the lease: reconcile a takeover, or run the action and settle it."""
        policy = self.policy
        boundary = _Boundary(
            declared=policy.boundary, tool=call.tool, resendable=self._resendable, keyed=self._keyed
        )
        # By position (keywords cost a third more, on every first run): the context's order.
        ctx = IdempotencyContext(
            call.key,
            claim.fence,
            claim.attempt,
            claim.outcome is ClaimOutcome.TAKEOVER,  # takeover
            call.owner,
            _LeaseFlag(),
            True,  # protected
            None,  # connection
            boundary,
            _Journal(call.tool),
        )
        paused = ctx.takeover and self._was_paused(claim)
        if paused:  # an interrupt() after the block: the tool runs on to its resume value
            boundary.paused = claim.error_type
        if claim.outcome is ClaimOutcome.RETRY:  # the previous attempt never reached its effect
            detail = {"reason": claim.reason, **took}
            self._emit(call, "free_retry", ctx.fence, ctx.attempt, detail)
        elif not ctx.takeover:
            self._emit(call, "claim", ctx.fence, ctx.attempt, took)
        else:  # ``reconcile``: a hook is asked first (its event follows, ``takeover=True``)
            detail = {"reconcile": call.reconcile is not None, **took}
            self._emit(call, "takeover", ctx.fence, ctx.attempt, detail)
        if ctx.takeover and call.reconcile is not None and not paused:
            try:
                found = yield from self._consult(call, claim, claim.attempt - 1, {"takeover": True})
            except BaseException:
                # Still unknown: give it back so the next claimant asks again.
                yield from self._abandon(
                    call, ctx, claim.reason or "lease_expired", claim.error_type
                )
                raise
            if found is not None:
                return (yield from self._store_reconciled(call, ctx, found.value))
        done: _Outcome = yield _RunStep(ctx)
        if done.exc is not None:
            return (yield from self._failed(call, ctx, done.exc))
        if isinstance(done.value, Unmemoized):
            handled = done.value.error
            # (A transactional tool's writes roll back with the release: nothing was sent.)
            if handled is not None and done.txn is None and self._unknown_after_error(ctx):
                yield from self._abandon(call, ctx, "error", boundary.paused or handled)
            else:
                yield from self._release(call, ctx, done.txn)
            return done.value.value
        try:
            payload = self.serializer.dumps(done.value, key=call.key)
        except (IdempotencyError, ValueError) as exc:
            # The effect happened but its result cannot be stored. Store the error instead,
            # so a retry does not repeat the effect, and tell this caller too.
            failure = self.serializer.dumps_failure(exc, key=call.key)
            first = yield from self._store_failure(call, ctx, failure, done.txn)
            if first is not None:
                return first.value
            raise
        completion = yield from self._complete(call, ctx, payload, failed=False, txn=done.txn)
        if completion is None or completion.stored:
            return done.value
        return self._replay(call, completion.payload, completion.failed)

    def _failed(
        self, call: _Call, ctx: IdempotencyContext, failure: BaseException
    ) -> Generator[_Step, Any, Any]:
        """The action raised (its transaction, if any, already rolled back): abandon on a
        cancellation, store a terminal failure, abandon on an error that leaves the effect
        unknown (:meth:`_left_unknown`), release on any other error; re-raise."""
        if not isinstance(failure, Exception):
            # Cancelled mid-tool: the effect may have happened. Keep the key uncertain.
            yield from self._abandon(call, ctx, "cancelled")
        elif isinstance(failure, self.never_terminal) and self._unknown_if_paused(ctx):
            # interrupt() after the side_effect() block: LangGraph re-executes the tool from
            # its first line on resume, so the key stays uncertain (the resumed run may not
            # enter the block again; steps, ``ctx.step``, replay on their own).
            paused = ctx._boundary.paused or error_type_of(failure)
            yield from self._abandon(call, ctx, "error", paused)
        elif self._is_terminal(failure):
            first = yield from self._store_failure(
                call, ctx, self.serializer.dumps_failure(failure, key=call.key)
            )
            if first is not None:
                return first.value
        elif self._left_unknown(ctx, failure):
            # A read timeout, a reset connection, a 502 after the provider committed: the
            # effect may have happened. Keep the key uncertain; the next claim reconciles.
            # (A run resumed after an interrupt past its block keeps saying so.)
            paused = ctx._boundary.paused or error_type_of(failure)
            yield from self._abandon(call, ctx, "error", paused)
        else:
            yield from self._release(call, ctx)
        raise failure

    def _left_unknown(self, ctx: IdempotencyContext, failure: Exception) -> bool:
        """Whether an exception the tool raised leaves its effect unknown (docs/effects.md,
        "After an error"). Never for control flow (``never_terminal``: LangGraph's
        ``interrupt()``), an exception ``not_sent`` names, or a ``keyed`` tool (it re-sends
        with the key); always once the ``side_effect()`` block was entered; and anywhere in
        an ``unsafe`` or ``irreversible`` tool that marks no boundary (it never re-runs
        blind). Other tools (no class, or a boundary not reached) release: a free retry."""
        resendable = (*self.never_terminal, *self.policy.not_sent)
        return not isinstance(failure, resendable) and self._unknown_after_error(ctx)

    def _unknown_after_error(self, ctx: IdempotencyContext) -> bool:
        """:meth:`_left_unknown` once the exception is not one that proves nothing was
        sent; also for a handled error (a message in place of the exception,
        :class:`Unmemoized`), which proves nothing either."""
        policy = self.policy
        if policy.effect_class == "keyed":
            return False
        if ctx.entered or ctx._boundary.paused is not None:
            return True
        blind = not policy.boundary and not policy.transactional
        return blind and policy.effect_class in ("unsafe", "irreversible")

    def _unknown_if_paused(self, ctx: IdempotencyContext) -> bool:
        """Whether an ``interrupt()`` leaves the key uncertain: raised after this run
        entered its block, or in a run that resumed one that had (not in a ``keyed``
        tool, which re-sends with its key)."""
        if self.policy.effect_class == "keyed":
            return False
        return ctx.entered or ctx._boundary.paused is not None

    def _was_paused(self, claim: Claim) -> bool:
        """Whether a takeover's previous attempt was paused by an ``interrupt()`` after its
        block (abandoned with the interrupt's type, :meth:`_failed`)."""
        if claim.reason != "error" or claim.error_type is None:
            return False
        return claim.error_type in _type_names(self.never_terminal)

    def _store_failure(
        self, call: _Call, ctx: IdempotencyContext, failure: bytes, txn: Any = None
    ) -> Generator[_Step, Any, _Answer | None]:
        """Store a failure; ``None`` when it is the stored one, else the replay of the
        result stored first (whose own failure the replay raises)."""
        stored = yield from self._complete(call, ctx, failure, failed=True, txn=txn)
        if stored is not None and not stored.stored:
            return _Answer(self._replay(call, stored.payload, stored.failed))
        return None

    def _complete(
        self,
        call: _Call,
        ctx: IdempotencyContext,
        payload: bytes,
        *,
        failed: bool,
        owned: bool = True,
        txn: Any = None,
    ) -> Generator[_Step, Any, Completion | None]:
        try:
            completion: Completion = yield _CompleteStep(ctx, payload, failed, txn)
        except LeaseLostError:  # transactional mode: the commit was refused, rolled back
            self._emit(call, "lease_lost", ctx.fence, ctx.attempt)
            raise
        except IdempotencyError as exc:
            # The action ran; its result is returned to this caller. The lease will expire
            # and a later duplicate takes over with the same key (pass it downstream).
            self._emit(
                call, "store_error", ctx.fence, ctx.attempt, {"op": "complete", "error": str(exc)}
            )
            if self.policy.transactional:
                raise  # the tool's writes committed with the record or not at all: unknown
            return None
        if completion.stale and (owned or not completion.stored):
            self._emit(
                call, "stale_completion", ctx.fence, ctx.attempt, {"stored": completion.stored}
            )
        elif completion.stored or not owned:
            self._emit(call, "complete", ctx.fence, ctx.attempt)
        return completion

    def _consult(
        self, call: _Call, claim: Claim, previous_attempt: int, extra: Mapping[str, Any]
    ) -> Generator[_Step, Any, HookAnswer | None]:
        """Ask the reconcile hook; the found result (a ``HookAnswer``), ``None`` when it found
        nothing, or the hook's exception raised. ``extra``: more detail for its event."""
        assert call.reconcile is not None
        question = ReconcileCall(
            key=call.key,
            fence=claim.fence,
            attempt=claim.attempt,
            previous_attempt=previous_attempt,
            tool=call.tool,
            args=call.args,
            thread_id=call.thread_id,
            reason=claim.reason or "lease_expired",
            entered=True if claim.entered else None,
            error_type=claim.error_type,
            step=call.step,
        )
        answer: HookAnswer = yield _ReconcileStep(call.reconcile, question)
        took: dict[str, Any] = {
            "duration_ms": round(answer.duration_ms, 3),
            "reason": question.reason,
            **extra,
        }
        if question.error_type is not None:
            took["error_type"] = question.error_type
        if answer.exc is not None:
            self._emit(call, "reconcile", claim.fence, claim.attempt, {"outcome": "error", **took})
            raise answer.exc
        if answer.value is None:
            self._emit(
                call, "reconcile", claim.fence, claim.attempt, {"outcome": "not_found", **took}
            )
            return None
        self._emit(call, "reconcile", claim.fence, claim.attempt, {"outcome": "found", **took})
        return answer

    def _store_reconciled(
        self, call: _Call, ctx: IdempotencyContext, value: Any, *, owned: bool = True
    ) -> Generator[_Step, Any, Any]:
        """Store what the hook found as the call's result (write-once) and return it; if a
        result was stored first (a resumed owner), that one is returned. ``owned=False``
        (``on_expired="raise"``): stored over the record without holding its lease."""
        try:
            payload = self.serializer.dumps(value, key=call.key)
        except (IdempotencyError, ValueError):
            if owned:
                yield from self._abandon(call, ctx, "lease_expired")
            raise
        completion = yield from self._complete(call, ctx, payload, failed=False, owned=owned)
        if completion is None or completion.stored:
            return value
        return self._replay(call, completion.payload, completion.failed)

    def _abandon(
        self,
        call: _Call,
        ctx: IdempotencyContext,
        reason: UncertainReason,
        error_type: str | None = None,
    ) -> Generator[_Step, Any, None]:
        detail: dict[str, str] = {"reason": reason}
        if error_type is not None:
            detail["error_type"] = error_type
        yield from self._let_go(call, ctx, _AbandonStep(ctx, reason, error_type), detail)

    def _release(
        self, call: _Call, ctx: IdempotencyContext, txn: Any = None
    ) -> Generator[_Step, Any, None]:
        yield from self._let_go(call, ctx, _ReleaseStep(ctx, txn))

    def _let_go(
        self,
        call: _Call,
        ctx: IdempotencyContext,
        step: _AbandonStep | _ReleaseStep,
        detail: Mapping[str, Any] | None = None,
    ) -> Generator[_Step, Any, None]:
        """Abandon or release the key; a store error is reported, not raised (the lease
        then expires on its own)."""
        op: EventKind = "abandon" if isinstance(step, _AbandonStep) else "release"
        try:
            done = yield step
        except IdempotencyError as exc:
            self._emit(call, "store_error", ctx.fence, ctx.attempt, {"op": op, "error": str(exc)})
            return
        if done:
            self._emit(call, op, ctx.fence, ctx.attempt, detail)

    def _is_terminal(self, exc: BaseException) -> bool:
        # A key reused with other arguments (a remote store said so, e.g. an MCP server)
        # stays so on every retry: store it rather than asking again.
        return (
            isinstance(exc, Exception)
            and not isinstance(exc, self.never_terminal)
            and isinstance(exc, (PayloadMismatchError, *self.policy.terminal_exceptions))
        )

    def _replay(self, call: _Call, payload: bytes | None, failed: bool) -> Any:
        try:
            if failed:
                failure = self.serializer.loads_failure(payload, key=call.key)
            else:
                return self.serializer.loads(payload, key=call.key)
        except IdempotencyError as exc:
            self._emit(call, "store_error", detail={"op": "decode", "error": str(exc)})
            raise
        raise failure.rebuild((PayloadMismatchError, *self.policy.terminal_exceptions))

    def _emit(
        self,
        call: _Call,
        kind: EventKind,
        fence: int = 0,
        attempt: int = 0,
        detail: Mapping[str, Any] | None = None,
    ) -> None:
        self._counter.add(kind)
        observer = call.observer
        if kind in QUIET_KINDS and not listens_quietly(observer):
            observer = None  # the adapters' observer: nothing to do for a quiet step
        if self.on_event is None and observer is None and not logger.isEnabledFor(10):
            return
        event = IdempotencyEvent(
            kind, call.key, call.tool, fence, attempt, detail or {}, call_id=call.call_id
        )
        deliver(event, self.on_event, observer)


def _type_names(kinds: tuple[type[BaseException], ...]) -> set[str]:
    """The names :func:`error_type_of` gives ``kinds`` and all their subclasses."""
    names: set[str] = set()
    todo = list(kinds)
    while todo:
        kind = todo.pop()
        module = kind.__module__
        names.add(kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}")
        todo.extend(kind.__subclasses__())
    return names


def _took(started: float, waited: float | None) -> dict[str, float]:
    """``claim_ms``: the claim's round trip since ``started``; ``waited_ms``: the lease wait
    since ``waited`` (the first BUSY answer), when there was one."""
    now = time.perf_counter()
    took = {"claim_ms": round((now - started) * 1000, 3)}
    if waited is not None:
        took["waited_ms"] = round((now - waited) * 1000, 3)
    return took
