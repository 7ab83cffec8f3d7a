"""The engine: claim, run, complete — once per key — with sync and async drivers.

The protocol's steps live in one generator, :meth:`Engine._flow` (in :mod:`._flow`),
which yields *steps* (claim, watch, run, complete, release) and receives their results.
It does no store I/O (it only emits events and reads the monotonic clock for the wait
deadline); the decisions of each store operation are the table in :mod:`.protocol`. This
module holds the engine's construction and how it performs each step: :meth:`Engine.run`
and :meth:`Engine.arun` hand the flow to the library's one driver (:mod:`._drive`) with a
sync or an async ``perform``, so the two paths cannot drift; what they share beyond the
store calls lives beside them: asking a reconcile hook in :mod:`._reconciling`,
transactional mode's run-and-complete in one database transaction in
:mod:`._transactional`.

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
paused past its lease, was cancelled mid-tool, or raised after its effect may have begun,
and *abandoned* the key): when a ``reconcile`` hook is configured (:mod:`.reconcile`) the
flow asks it first, and stores what it finds instead of running the action again. An
action cancelled mid-run (``asyncio.CancelledError``, ``KeyboardInterrupt``: any
``BaseException`` that is not an ``Exception``) abandons the key, so the next claimant
takes over and reconciles. An ``Exception`` the action raised abandons it too (reason
``error``, with the exception's type) when it leaves the effect unknown: raised after the
``side_effect()`` block was entered, or anywhere in an ``unsafe`` / ``irreversible`` tool
without a boundary; otherwise it releases it, a free retry: before the block, in a tool
with no effect class, a ``keyed`` tool, an exception ``not_sent=`` names, and a
LangGraph ``interrupt()`` (the ``never_terminal`` types). The caller gets the exception
either way.

An action that answers without a result worth keeping (a tool error already turned into
a message for the model) returns :class:`Unmemoized`: the key is released, so a retry
runs again, and the wrapped value is returned to the caller.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import random
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from types import BuiltinFunctionType, FunctionType, MappingProxyType, MethodType
from typing import Any, TypeVar

from ..errors import IdempotencyError, UnstorableResultError
from . import _transactional
from ._drive import adrive, drive
from ._flow import Flow
from ._frozen import fast_init
from ._reconciling import aconsult, consult
from ._steps import (
    _CLAIM,
    Unmemoized,
    _AbandonStep,
    _Call,
    _CompleteStep,
    _Outcome,
    _ReconcileStep,
    _ReleaseStep,
    _RunStep,
    _Step,
    _WatchStep,
)
from .context import IdempotencyContext, _awaited, _current
from .events import EventCounter, EventHook, IdempotencyEvent, deliver
from .heartbeat import AsyncRenewal, schedule_renewal
from .policy import EffectClass, Policy
from .reconcile import reconciler_for
from .record import Claim, ExpiredPolicy, abandon_kwargs
from .serde import ResultSerializer
from .store import BaseIdempotencyStore, ClaimRequest, CompleteRequest, Held

__all__ = ["Claimed", "Engine", "Unmemoized", "new_owner", "step_fingerprint", "step_key"]

T = TypeVar("T")


@fast_init
@dataclass(frozen=True, slots=True)
class Claimed:
    """A claim already made for a call (a batch of sibling calls, :mod:`._siblings`): the
    request it was made with, which is the call's own (:meth:`Engine.claim_request`), and
    the store's answer. The engine takes it as the answer to its first claim, so the call
    claims no second time."""

    request: ClaimRequest
    claim: Claim


def _held(call: _Call, ctx: IdempotencyContext) -> Held:
    """The lease ``call`` holds at ``ctx``'s fence."""
    return Held(call.key, call.owner, ctx.fence)


def step_key(key: str, name: str) -> str:
    """The key of the step ``name`` inside the call ``key`` (``ctx.step``): the same on every
    re-execution of the call, and in the call's Redis Cluster slot only through the record
    it names (a step is a record of its own)."""
    return f"{key}:step:{hashlib.sha256(name.encode()).hexdigest()[:32]}"


def step_fingerprint(fn: Callable[..., Any]) -> str:
    """A step's payload identity: the function it runs, by module and qualified name (a
    re-executed tool re-creates its lambdas; a deploy between pause and resume keeps the
    names). Another function under the same name is a mismatch."""
    target = fn.func if isinstance(fn, functools.partial) else fn
    if isinstance(target, MethodType):
        target = target.__func__
    kind = target if isinstance(target, (FunctionType, BuiltinFunctionType, type)) else type(target)
    name = f"{kind.__module__}.{kind.__qualname__}"
    return hashlib.sha256(f"step:{name}".encode()).hexdigest()


@contextmanager
def _naming_step(name: str, tool: str | None) -> Iterator[None]:
    """A step's result that cannot be stored, said with the step's name."""
    try:
        yield
    except UnstorableResultError as exc:
        raise UnstorableResultError(
            f"step {name!r} of tool {tool!r} ran, but its result cannot be stored, so the "
            f"tool stops here (no later effect runs): {exc}",
            key=exc.key,
        ) from exc


def _step_call(call: _Call, name: str, fn: Callable[..., Any]) -> dict[str, Any]:
    """How the step ``name`` running ``fn`` inside ``call`` is run: its key and payload
    identity, and what it is told of its call (not the adapter's observer: a step's replay
    is not the call's)."""
    return {
        "key": step_key(call.key, name),
        "fingerprint": step_fingerprint(fn),
        "tool": call.tool,
        "meta": call.meta,
        "args": call.args,
        "thread_id": call.thread_id,
        "call_id": call.call_id,
        "step_name": name,
    }


def new_owner() -> str:
    """A fresh owner token. Owner tokens need uniqueness, not secrecy; ``random`` reseeds
    itself after ``fork()``."""
    return f"{random.getrandbits(96):024x}"


class Engine(Flow):
    """Runs actions at most once per key (while leases are honoured) and replays results.

    ``Engine(store, policy).run(key, fingerprint=fp, action=fn)`` is the whole interface;
    :class:`~langchain_idempotent.adapters.tool.IdempotentTool` derives ``key`` and ``fingerprint``
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
        #: As given (its per-tool ``effect`` dict, options left ``None``), for :meth:`for_tool`.
        self._given = policy or Policy()
        #: The values this engine's calls use (:meth:`Policy.for_tool`).
        self.policy = self._given.for_tool(None)
        if self.policy.transactional:
            _transactional.check_store(store)
        self.serializer = serializer or ResultSerializer(
            allowed_types=self.policy.allowed_types,
            max_bytes=self.policy.max_result_bytes,
            encryption=self.policy.encryption,
            namespace=self.policy.namespace,
        )
        self.on_event = on_event
        self.never_terminal = tuple(never_terminal)
        self._resendable = (*self.never_terminal, *self.policy.not_sent)
        self._keyed = self.policy.effect_class == "keyed"
        self._counter = EventCounter()
        self._renew_every = self.policy.lease_s * self.policy.renew_fraction
        # Read once: the policy is frozen, and every claim passes the same settings.
        self._lease_ms = self.policy.lease_ms
        self._ttl_ms = self.policy.ttl_ms
        #: ``policy.on_expired``, never ``None`` here (:meth:`Policy.for_tool` filled it).
        self.on_expired: ExpiredPolicy = self.policy.on_expired or "takeover"
        self._boundary = bool(self.policy.boundary)

        self._tools: dict[tuple[str, EffectClass | None], Engine] = {}
        self._step_engine: Engine | None = None

    def stats(self) -> dict[str, int]:
        """Events so far, by kind (``{"claim": 3, "replay": 2, ...}``)."""
        return self._counter.snapshot()

    def for_tool(
        self, tool: str, hinted: EffectClass | None = None, hints: Mapping[str, bool] | None = None
    ) -> Engine:
        """The engine for one tool: this one, or (when the policy gives the tool an effect
        class, :meth:`Policy.for_tool`) a sibling on the same store, serializer, hooks and
        counters with that tool's policy. ``hinted``: the class the tool's annotations
        (``hints``) suggest, used when ``effect=`` names none for it; an
        ``effect_inferred`` event says so, once per tool."""
        sibling = self._tools.get((tool, hinted))
        if sibling is None:
            policy = self._given.for_tool(tool, hinted=hinted)
            if policy == self.policy:
                sibling = self
            else:
                sibling = Engine(
                    self.store,
                    policy,
                    serializer=self.serializer,
                    on_event=self.on_event,
                    never_terminal=self.never_terminal,
                )
                sibling._counter = self._counter
            self._tools[(tool, hinted)] = sibling
            if hinted is not None and self._given.effect_of(tool) is None:
                detail = {"effect": hinted, "hints": dict(hints or {})}
                deliver(IdempotencyEvent("effect_inferred", "", tool, detail=detail), self.on_event)
        return sibling

    def _steps(self) -> Engine:
        """The engine of the steps journaled inside this engine's calls: the same store,
        serializer, hooks and counters, with no boundary of its own (a step is its own
        boundary: one that began and never finished is uncertain) and outside any
        transaction."""
        engine = self._step_engine
        if engine is None:
            policy = self.policy.with_options(boundary=False, transactional=False)
            engine = Engine(
                self.store,
                policy,
                serializer=self.serializer,
                on_event=self.on_event,
                never_terminal=self.never_terminal,
            )
            engine._counter = self._counter
            self._step_engine = engine
        return engine

    def _run_step(self, call: _Call, name: str, fn: Callable[..., Any], *given: Any) -> Any:
        """Run (or replay) the step ``name`` of ``call`` (``ctx.step``); ``given``: its
        positional and keyword arguments."""
        args, kwargs = given
        with _naming_step(name, call.tool):
            return self._steps().run(
                action=lambda: fn(*args, **kwargs), **_step_call(call, name, fn)
            )

    async def _arun_step(self, call: _Call, name: str, fn: Callable[..., Any], *given: Any) -> Any:
        args, kwargs = given
        with _naming_step(name, call.tool):
            return await self._steps().arun(
                action=lambda: _awaited(fn(*args, **kwargs)), **_step_call(call, name, fn)
            )

    def claim_request(
        self, key: str, fingerprint: str, meta: Mapping[str, str] | None = None
    ) -> ClaimRequest:
        """The claim of one call under this engine's policy, with a fresh owner token. The
        one recipe: the engine's own first claim and a batch of sibling calls
        (:mod:`._siblings`) both use it, and a batch hands a call only the claim made with
        a request equal to the call's own."""
        if not isinstance(key, str) or not key:
            raise ValueError("the idempotency key must be a non-empty string")
        return ClaimRequest(
            key,
            new_owner(),
            fingerprint,
            self._lease_ms,
            self._ttl_ms,
            self.on_expired,
            meta,
            self._boundary,
        )

    def _call(
        self,
        key: str,
        fingerprint: str,
        tool: str | None,
        meta: Mapping[str, str] | None,
        observer: EventHook | None,
        args: Mapping[str, Any] | None,
        thread_id: str | None,
        claimed: Claimed | None,
        call_id: str | None,
        step: str | None = None,
    ) -> _Call:
        return _Call(
            self.claim_request(key, fingerprint, meta) if claimed is None else claimed.request,
            tool,
            observer,
            reconciler_for(self.policy.reconcile, tool),
            MappingProxyType(dict(args or {})),
            thread_id,
            call_id,
            step,
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
        claimed: Claimed | None = None,
        call_id: str | None = None,
        step_name: str | None = None,
    ) -> T:
        """Run ``action`` once for ``key`` and return its result, or replay the stored one.

        ``args`` and ``thread_id`` are what a reconcile hook is told about the call; the
        hook is ``policy.reconcile`` (its entry for ``tool`` when it is a mapping).
        ``claimed``: the claim a batch already made for this call (its first claim);
        ``call_id``: the tool call's id, carried by its events (``IdempotencyEvent.call_id``);
        ``step_name``: the step's name when this runs a step inside a call (``ctx.step``)."""
        call = self._call(
            key, fingerprint, tool, meta, observer, args, thread_id, claimed, call_id, step_name
        )
        flow = self._flow(call, None if claimed is None else claimed.claim)
        perform = functools.partial(self._do, call, action)
        return drive(flow, perform, IdempotencyError)  # type: ignore[no-any-return]

    def _do(self, call: _Call, action: Callable[[], Any], step: _Step) -> Any:
        store, policy = self.store, self.policy
        if step is _CLAIM:
            return store.claim(call.request)
        if isinstance(step, _RunStep):
            return self._run_action(step.ctx, call, action)
        if isinstance(step, _CompleteStep):
            if not policy.transactional:
                return store.complete(self._completion(call, step))
            return _transactional.complete(store, step.txn, self._completion(call, step))
        if isinstance(step, _ReleaseStep):
            if step.txn is not None:
                step.txn.rollback()
            return store.release(_held(call, step.ctx))
        if isinstance(step, _AbandonStep):
            return store.abandon(
                _held(call, step.ctx), **abandon_kwargs(step.reason, step.error_type)
            )
        if isinstance(step, _ReconcileStep):
            return consult(step.hook, step.call)
        assert isinstance(step, _WatchStep)
        store.watch(call.key, fence=step.fence, timeout=step.timeout)
        return None

    def _completion(self, call: _Call, step: _CompleteStep) -> CompleteRequest:
        return CompleteRequest(
            call.key,
            call.owner,
            step.ctx.fence,
            call.fingerprint,
            step.payload,
            step.failed,
            self._ttl_ms,
            call.meta,
        )

    def _run_action(
        self, ctx: IdempotencyContext, call: _Call, action: Callable[[], Any]
    ) -> _Outcome:
        txn = None
        if self.policy.transactional and ctx.protected:
            try:
                txn, ctx = _transactional.begin(self.store, ctx)
            except IdempotencyError as exc:
                return _Outcome(exc=exc)
        if ctx.protected:  # (the lease is named only if the tool marks its effect)
            store = self.store
            ctx._boundary.mark = lambda: store.mark_effect(_held(call, ctx))
            ctx._journal.run = lambda *step: self._run_step(call, *step)
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
        ok = self.store.renew(_held(call, ctx), self._lease_ms)
        if not ok:
            self._lease_lost(call, ctx)
        return ok

    def _lease_lost(self, call: _Call, ctx: IdempotencyContext) -> None:
        # The event first: a tool that sees the flag (and raises) finds it already reported.
        self._emit(call, "lease_lost", ctx.fence, ctx.attempt)
        ctx.mark_lease_lost()

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
        claimed: Claimed | None = None,
        call_id: str | None = None,
        step_name: str | None = None,
    ) -> T:
        """The async twin of :meth:`run`; ``action`` returns an awaitable."""
        call = self._call(
            key, fingerprint, tool, meta, observer, args, thread_id, claimed, call_id, step_name
        )
        flow = self._flow(call, None if claimed is None else claimed.claim)
        aperform = functools.partial(self._ado, call, action)
        return await adrive(flow, aperform, IdempotencyError)  # type: ignore[no-any-return]

    async def _ado(self, call: _Call, action: Callable[[], Awaitable[Any]], step: _Step) -> Any:
        store, policy = self.store, self.policy
        if step is _CLAIM:
            return await store.aclaim(call.request)
        if isinstance(step, _RunStep):
            return await self._arun_action(step.ctx, call, action)
        if isinstance(step, _CompleteStep):
            if not policy.transactional:
                return await store.acomplete(self._completion(call, step))
            return await _transactional.acomplete(store, step.txn, self._completion(call, step))
        if isinstance(step, _ReleaseStep):
            if step.txn is not None:
                await step.txn.rollback()
            return await store.arelease(_held(call, step.ctx))
        if isinstance(step, _AbandonStep):
            # Shielded: the caller is usually being cancelled; a second cancellation must
            # not stop the record from saying so.
            uncertain = abandon_kwargs(step.reason, step.error_type)
            return await asyncio.shield(store.aabandon(_held(call, step.ctx), **uncertain))
        if isinstance(step, _ReconcileStep):
            return await aconsult(step.hook, step.call)
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
            store, gate = self.store, ctx._boundary
            gate.mark = lambda: store.mark_effect(_held(call, ctx))
            gate.amark = lambda: store.amark_effect(_held(call, ctx))
            ctx._journal.run = lambda *step: self._run_step(call, *step)
            ctx._journal.arun = lambda *step: self._arun_step(call, *step)
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
        ok = await self.store.arenew(_held(call, ctx), self._lease_ms)
        if not ok:
            self._lease_lost(call, ctx)
        return ok
