"""The engine: claim, run, complete — once per key — with sync and async drivers.

The protocol's steps live in one generator, :meth:`Engine._flow`, which yields *steps*
(claim, watch, run, complete, release) and receives their results. It does no store I/O
(it only emits events and reads the monotonic clock for the wait deadline); the
decisions of each store operation are the table in :mod:`.protocol`. The sync driver
(:meth:`Engine.run`) and the async driver (:meth:`Engine.arun`) only execute steps, so
the two paths cannot drift; what they share beyond the store calls lives beside them:
asking a reconcile hook in :mod:`._reconciling`, transactional mode's run-and-complete in
one database transaction in :mod:`._transactional`.

Sequence of a first run and of a replay (one store round trip each, plus renewals for
tools that outlast a third of their lease)::

    caller            engine                      store
      |--- run ------->|--- claim --------------->|  ACQUIRED fence=f
      |                |--- action() (+renewals)  |
      |                |--- complete(f) --------->|  stored (write-once), waiters woken
      |<-- result -----|                          |
      |--- run ------->|--- claim --------------->|  REPLAY payload
      |<-- result -----|                          |

A duplicate that finds the key BUSY watches it (woken by the store, never past the
other owner's lease) and claims again, until ``wait_timeout`` runs out. With
``wait_timeout=None`` (``wait_timeout_s`` is infinite) it waits while the owner keeps
renewing; an owner that dies stops renewing, its lease expires, and the next claim is a
takeover (or ``OutcomeUnknownError`` with ``on_expired="raise"``) instead of BUSY.

A takeover is a call whose previous attempt's outcome is unknown (its owner died, was
paused past its lease, or was cancelled mid-tool and *abandoned* the key): when a
``reconcile`` hook is configured (:mod:`.reconcile`) the flow asks it first, and stores
what it finds instead of running the action again. An action cancelled mid-run
(``asyncio.CancelledError``, ``KeyboardInterrupt``: any ``BaseException`` that is not an
``Exception``) abandons the key, so the next claimant takes over and reconciles; an
``Exception`` the action raised itself releases it (a LangGraph ``interrupt()`` too).

An action that answers without a result worth keeping (a tool error already turned into
a message for the model) returns :class:`Unmemoized`: the key is released, so a retry
runs again, and the wrapped value is returned to the caller.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Generator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from . import _transactional
from ._reconciling import HookAnswer, aask, ask
from ._steps import (
    _BOUNDARY,
    _CLAIM,
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
from .context import IdempotencyContext, _Boundary, _current
from .errors import (
    IdempotencyError,
    InProgressError,
    LeaseLostError,
    OutcomeUnknownError,
    PayloadMismatchError,
    StoreUnavailableError,
)
from .events import EventCounter, EventHook, EventKind, IdempotencyEvent, deliver, logger
from .heartbeat import AsyncRenewal, schedule_renewal
from .policy import Policy
from .reconcile import ReconcileCall, reconciler_for
from .record import Claim, ClaimOutcome, Completion, UncertainReason
from .serde import ResultSerializer
from .stores.base import BaseIdempotencyStore

__all__ = ["Engine", "Unmemoized"]

T = TypeVar("T")
V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class Unmemoized(Generic[V]):
    """What an action returns for an answer that must not be stored (a handled tool error):
    the engine releases the key, so a retry runs again, and returns ``value``."""

    value: V


class Engine:
    """Runs actions at most once per key (while leases are honoured) and replays results.

    ``Engine(store, policy).run(key, fingerprint=fp, action=fn)`` is the whole interface;
    :class:`~langchain_idempotent.tool.IdempotentTool` derives ``key`` and ``fingerprint``
    from a tool call. ``on_event`` receives every :class:`IdempotencyEvent`; ``stats()``
    counts them. ``never_terminal`` names exception types that are never stored as a
    result even when ``policy.terminal_exceptions`` matches them (the adapters pass
    LangGraph's ``GraphBubbleUp``: interrupts and parent commands are control flow).
    """

    def __init__(
        self,
        store: BaseIdempotencyStore,
        policy: Policy | None = None,
        *,
        serializer: ResultSerializer | None = None,
        on_event: EventHook | None = None,
        never_terminal: tuple[type[BaseException], ...] = (),
    ) -> None:
        if not isinstance(store, BaseIdempotencyStore):
            raise TypeError(
                f"store must be an idempotency store (e.g. InMemoryIdempotencyStore, "
                f"SqliteIdempotencyStore, RedisIdempotencyStore), got {type(store).__name__}"
            )
        self.store = store
        self.policy = policy or Policy()
        if self.policy.transactional:
            _transactional.check_store(store)
        self.serializer = serializer or ResultSerializer(
            allowed_types=self.policy.allowed_types, max_bytes=self.policy.max_result_bytes
        )
        self.on_event = on_event
        self.never_terminal = tuple(never_terminal)
        self._counter = EventCounter()
        self._renew_every = self.policy.lease_s * self.policy.renew_fraction

        self._tools: dict[str, Engine] = {}

    def stats(self) -> dict[str, int]:
        """Events so far, by kind (``{"claim": 3, "replay": 2, ...}``)."""
        return self._counter.snapshot()

    def for_tool(self, tool: str) -> Engine:
        """The engine for one tool: this one, or (when the policy gives the tool an effect
        class, :meth:`Policy.for_tool`) a sibling on the same store, serializer, hooks and
        counters with that tool's policy."""
        policy = self.policy.for_tool(tool)
        if policy is self.policy:
            return self
        sibling = self._tools.get(tool)
        if sibling is None:
            sibling = Engine(
                self.store,
                policy,
                serializer=self.serializer,
                on_event=self.on_event,
                never_terminal=self.never_terminal,
            )
            sibling._counter = self._counter
            self._tools[tool] = sibling
        return sibling

    # -- the flow (no store I/O) --------------------------------------------------------------

    def _flow(self, call: _Call) -> Generator[_Step, Any, Any]:
        """Claim (waiting out a live lease), then run and complete, or answer without
        running: a replay, a reconciled result, or an unprotected run (fail open)."""
        got = yield from self._acquire(call)
        if got is None:
            return (yield from self._unprotected(call))
        if isinstance(got, _Answer):
            return got.value
        return (yield from self._run_owned(call, got))

    def _acquire(self, call: _Call) -> Generator[_Step, Any, Claim | _Answer | None]:
        """Claim until the claim runs (the claim), answers (``_Answer``) or the store is
        down with ``fail_open`` (``None``); BUSY waits, MISMATCH and EXPIRED raise."""
        deadline: float | None = None
        while True:
            try:
                claim: Claim = yield _CLAIM
            except IdempotencyError as exc:  # unreachable store or an unreadable record
                self._emit(call, "store_error", detail={"op": "claim", "error": str(exc)})
                if self.policy.fail_open and isinstance(exc, StoreUnavailableError):
                    return None
                raise
            outcome = claim.outcome
            if outcome is ClaimOutcome.REPLAY:
                self._emit(call, "replay", claim.fence, claim.attempt)
                return _Answer(self._replay(call, claim.payload, claim.failed))
            if outcome.runs:
                return claim
            if outcome is ClaimOutcome.BUSY:
                first = deadline is None
                if deadline is None:  # infinite for wait_timeout=None: the lease bounds it
                    deadline = time.monotonic() + self.policy.wait_timeout_s
                watch = self._watch(call, claim, deadline)
                if first:
                    detail = {"lease_left_ms": claim.retry_after_ms}
                    self._emit(call, "wait", claim.fence, claim.attempt, detail)
                yield watch
                continue
            if outcome is ClaimOutcome.MISMATCH:
                self._emit(call, "payload_mismatch", claim.fence, claim.attempt)
                raise PayloadMismatchError(
                    "this idempotency key was already used with different arguments; a key "
                    "must identify one payload (use a new key for a new request)",
                    key=call.key,
                )
            return _Answer((yield from self._expired(call, claim)))

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

    def _expired(self, call: _Call, claim: Claim) -> Generator[_Step, Any, Any]:
        """``on_expired="raise"`` met an expired lease: the reconcile hook's result, stored
        write-once over the record as it is (nothing is held), or ``OutcomeUnknownError``."""
        if call.reconcile is not None:
            found = yield from self._ask(call, claim, claim.attempt)
            if found is not None:
                held = IdempotencyContext(
                    key=call.key,
                    fence=claim.fence,
                    attempt=claim.attempt,
                    takeover=True,
                    owner=call.owner,
                )
                return (yield from self._store_reconciled(call, held, found.value, owned=False))
        self._emit(call, "outcome_unknown", claim.fence, claim.attempt)
        raise OutcomeUnknownError(
            f"a previous run (fence {claim.fence}, attempt {claim.attempt}) lost its lease "
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

    def _run_owned(self, call: _Call, claim: Claim) -> Generator[_Step, Any, Any]:
        """Holding the lease: reconcile a takeover, or run the action and settle it."""
        ctx = IdempotencyContext(
            key=call.key,
            fence=claim.fence,
            attempt=claim.attempt,
            takeover=claim.outcome is ClaimOutcome.TAKEOVER,
            owner=call.owner,
            _boundary=_Boundary(declared=self.policy.boundary, tool=call.tool),
        )
        if claim.outcome is ClaimOutcome.RETRY:  # the previous attempt never reached its effect
            self._emit(call, "free_retry", ctx.fence, ctx.attempt, {"reason": claim.reason})
        else:
            self._emit(call, "takeover" if ctx.takeover else "claim", ctx.fence, ctx.attempt)
        if ctx.takeover and call.reconcile is not None:
            try:
                found = yield from self._ask(call, claim, claim.attempt - 1)
            except BaseException:
                # Still unknown: give it back so the next claimant asks again.
                yield from self._abandon(call, ctx, claim.reason or "lease_expired")
                raise
            if found is not None:
                return (yield from self._store_reconciled(call, ctx, found.value))
        done: _Outcome = yield _RunStep(ctx)
        if done.exc is not None:
            return (yield from self._failed(call, ctx, done.exc))
        if isinstance(done.value, Unmemoized):
            yield from self._release(call, ctx, done.txn)
            return done.value.value
        try:
            payload = self.serializer.dumps(done.value, key=call.key)
        except (IdempotencyError, ValueError) as exc:
            # The effect happened but its result cannot be stored. Store the error instead,
            # so a retry does not repeat the effect, and tell this caller too.
            failure = self.serializer.dumps_failure(exc)
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
        cancellation, store a terminal failure, release on any other error; re-raise."""
        if not isinstance(failure, Exception):
            # Cancelled mid-tool: the effect may have happened. Keep the key uncertain.
            yield from self._abandon(call, ctx, "cancelled")
        elif self._is_terminal(failure):
            first = yield from self._store_failure(
                call, ctx, self.serializer.dumps_failure(failure)
            )
            if first is not None:
                return first.value
        else:
            yield from self._release(call, ctx)
        raise failure

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

    def _ask(
        self, call: _Call, claim: Claim, previous_attempt: int
    ) -> Generator[_Step, Any, HookAnswer | None]:
        """Ask the reconcile hook; the found result (a ``HookAnswer``), ``None`` when it found
        nothing, or the hook's exception raised."""
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
        )
        answer: HookAnswer = yield _ReconcileStep(call.reconcile, question)
        took = {"duration_ms": round(answer.duration_ms, 3), "reason": question.reason}
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
        self, call: _Call, ctx: IdempotencyContext, reason: UncertainReason
    ) -> Generator[_Step, Any, None]:
        try:
            abandoned = yield _AbandonStep(ctx, reason)
        except IdempotencyError as exc:
            self._emit(
                call, "store_error", ctx.fence, ctx.attempt, {"op": "abandon", "error": str(exc)}
            )
            return
        if abandoned:
            self._emit(call, "abandon", ctx.fence, ctx.attempt, {"reason": reason})

    def _release(
        self, call: _Call, ctx: IdempotencyContext, txn: Any = None
    ) -> Generator[_Step, Any, None]:
        try:
            released = yield _ReleaseStep(ctx, txn)
        except IdempotencyError as exc:
            self._emit(
                call, "store_error", ctx.fence, ctx.attempt, {"op": "release", "error": str(exc)}
            )
            return
        if released:
            self._emit(call, "release", ctx.fence, ctx.attempt)

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
        self._counter(IdempotencyEvent(kind, call.key))
        if self.on_event is None and call.observer is None and not logger.isEnabledFor(10):
            return
        event = IdempotencyEvent(kind, call.key, call.tool, fence, attempt, detail or {})
        deliver(event, self.on_event, call.observer)

    def _call(
        self,
        key: str,
        fingerprint: str,
        tool: str | None,
        meta: Mapping[str, str] | None,
        observer: EventHook | None,
        args: Mapping[str, Any] | None,
        thread_id: str | None,
    ) -> _Call:
        if not isinstance(key, str) or not key:
            raise ValueError("the idempotency key must be a non-empty string")
        # Owner tokens need uniqueness, not secrecy; random reseeds itself after fork().
        return _Call(
            key,
            fingerprint,
            f"{random.getrandbits(96):024x}",
            tool,
            meta,
            observer,
            reconciler_for(self.policy.reconcile, tool),
            MappingProxyType(dict(args or {})),
            thread_id,
        )

    # -- sync driver ------------------------------------------------------------------

    def run(
        self,
        key: str,
        *,
        fingerprint: str,
        action: Callable[[], T],
        tool: str | None = None,
        meta: Mapping[str, str] | None = None,
        observer: EventHook | None = None,
        args: Mapping[str, Any] | None = None,
        thread_id: str | None = None,
    ) -> T:
        """Run ``action`` once for ``key`` and return its result, or replay the stored one.

        ``args`` and ``thread_id`` are what a reconcile hook is told about the call; the
        hook is ``policy.reconcile`` (its entry for ``tool`` when it is a mapping)."""
        call = self._call(key, fingerprint, tool, meta, observer, args, thread_id)
        steps = self._flow(call)
        reply: Any = None
        error: BaseException | None = None
        while True:
            try:
                step = steps.send(reply) if error is None else steps.throw(error)
            except StopIteration as finished:
                return finished.value  # type: ignore[no-any-return]
            reply, error = None, None
            try:
                reply = self._do(step, call, action)
            except IdempotencyError as exc:
                error = exc

    def _do(self, step: _Step, call: _Call, action: Callable[[], Any]) -> Any:
        store, policy = self.store, self.policy
        if step is _CLAIM:
            return store.claim(**self._claim_args(call))
        if isinstance(step, _RunStep):
            return self._run_action(step.ctx, call, action)
        if isinstance(step, _CompleteStep):
            if not policy.transactional:
                return store.complete(**self._completion_args(call, step))
            return _transactional.complete(store, step.txn, self._completion_args(call, step))
        if isinstance(step, _ReleaseStep):
            if step.txn is not None:
                step.txn.rollback()
            return store.release(call.key, owner=call.owner, fence=step.ctx.fence)
        if isinstance(step, _AbandonStep):
            return store.abandon(
                call.key, owner=call.owner, fence=step.ctx.fence, reason=step.reason
            )
        if isinstance(step, _ReconcileStep):
            return ask(step.hook, step.call)
        assert isinstance(step, _WatchStep)
        store.watch(call.key, fence=step.fence, timeout=step.timeout)
        return None

    def _claim_args(self, call: _Call) -> dict[str, Any]:
        policy = self.policy
        return {
            "key": call.key,
            "owner": call.owner,
            "fingerprint": call.fingerprint,
            "lease_ms": policy.lease_ms,
            "ttl_ms": policy.ttl_ms,
            "on_expired": policy.on_expired,
            "meta": call.meta,
            **_BOUNDARY[policy.boundary],
        }

    def _completion_args(self, call: _Call, step: _CompleteStep) -> dict[str, Any]:
        return {
            "key": call.key,
            "owner": call.owner,
            "fence": step.ctx.fence,
            "fingerprint": call.fingerprint,
            "payload": step.payload,
            "failed": step.failed,
            "ttl_ms": self.policy.ttl_ms,
            "meta": call.meta,
        }

    def _run_action(
        self, ctx: IdempotencyContext, call: _Call, action: Callable[[], Any]
    ) -> _Outcome:
        txn = None
        if self.policy.transactional and ctx.protected:
            try:
                txn, ctx = _transactional.begin(self.store, ctx)
            except IdempotencyError as exc:
                return _Outcome(exc=exc)
        if ctx.protected:
            fence, store = ctx.fence, self.store
            ctx._boundary.mark = lambda: store.mark_effect(call.key, owner=call.owner, fence=fence)
        token = _current.set(ctx)
        renewal = (
            schedule_renewal(self._renew_every, lambda: self._renew(call, ctx))
            if ctx.protected
            else None
        )
        try:
            return _Outcome(value=action(), txn=txn)
        except BaseException as exc:
            if txn is not None:  # the tool's writes go; the failure is recorded apart
                txn.rollback()
            return _Outcome(exc=exc)
        finally:
            if renewal is not None:
                renewal.cancel()
            _current.reset(token)

    def _renew(self, call: _Call, ctx: IdempotencyContext) -> bool:
        ok = self.store.renew(
            call.key, owner=call.owner, fence=ctx.fence, lease_ms=self.policy.lease_ms
        )
        if not ok:
            self._lease_lost(call, ctx)
        return ok

    def _lease_lost(self, call: _Call, ctx: IdempotencyContext) -> None:
        ctx.mark_lease_lost()
        self._emit(call, "lease_lost", ctx.fence, ctx.attempt)

    # -- async driver -----------------------------------------------------------------

    async def arun(
        self,
        key: str,
        *,
        fingerprint: str,
        action: Callable[[], Awaitable[T]],
        tool: str | None = None,
        meta: Mapping[str, str] | None = None,
        observer: EventHook | None = None,
        args: Mapping[str, Any] | None = None,
        thread_id: str | None = None,
    ) -> T:
        """The async twin of :meth:`run`; ``action`` returns an awaitable."""
        call = self._call(key, fingerprint, tool, meta, observer, args, thread_id)
        steps = self._flow(call)
        reply: Any = None
        error: BaseException | None = None
        while True:
            try:
                step = steps.send(reply) if error is None else steps.throw(error)
            except StopIteration as finished:
                return finished.value  # type: ignore[no-any-return]
            reply, error = None, None
            try:
                reply = await self._ado(step, call, action)
            except IdempotencyError as exc:
                error = exc

    async def _ado(self, step: _Step, call: _Call, action: Callable[[], Awaitable[Any]]) -> Any:
        store, policy = self.store, self.policy
        if step is _CLAIM:
            return await store.aclaim(**self._claim_args(call))
        if isinstance(step, _RunStep):
            return await self._arun_action(step.ctx, call, action)
        if isinstance(step, _CompleteStep):
            if not policy.transactional:
                return await store.acomplete(**self._completion_args(call, step))
            args = self._completion_args(call, step)
            return await _transactional.acomplete(store, step.txn, args)
        if isinstance(step, _ReleaseStep):
            if step.txn is not None:
                await step.txn.rollback()
            return await store.arelease(call.key, owner=call.owner, fence=step.ctx.fence)
        if isinstance(step, _AbandonStep):
            # Shielded: the caller is usually being cancelled; a second cancellation must
            # not stop the record from saying so.
            return await asyncio.shield(
                store.aabandon(call.key, owner=call.owner, fence=step.ctx.fence, reason=step.reason)
            )
        if isinstance(step, _ReconcileStep):
            return await aask(step.hook, step.call)
        assert isinstance(step, _WatchStep)
        await store.awatch(call.key, fence=step.fence, timeout=step.timeout)
        return None

    async def _arun_action(
        self, ctx: IdempotencyContext, call: _Call, action: Callable[[], Awaitable[Any]]
    ) -> _Outcome:
        txn = None
        if self.policy.transactional and ctx.protected:
            try:
                txn, ctx = await _transactional.abegin(self.store, ctx)
            except IdempotencyError as exc:
                return _Outcome(exc=exc)
        if ctx.protected:
            fence, store, gate = ctx.fence, self.store, ctx._boundary
            gate.mark = lambda: store.mark_effect(call.key, owner=call.owner, fence=fence)
            gate.amark = lambda: store.amark_effect(call.key, owner=call.owner, fence=fence)
        token = _current.set(ctx)
        renewal = (
            AsyncRenewal(self._renew_every, lambda: self._arenew(call, ctx))
            if ctx.protected
            else None
        )
        try:
            return _Outcome(value=await action(), txn=txn)
        except BaseException as exc:
            if txn is not None:
                await txn.rollback()
            return _Outcome(exc=exc)
        finally:
            if renewal is not None:
                renewal.cancel()
            _current.reset(token)

    async def _arenew(self, call: _Call, ctx: IdempotencyContext) -> bool:
        ok = await self.store.arenew(
            call.key, owner=call.owner, fence=ctx.fence, lease_ms=self.policy.lease_ms
        )
        if not ok:
            self._lease_lost(call, ctx)
        return ok
