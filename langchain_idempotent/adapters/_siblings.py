"""The tool calls of one model message, claimed together: one store round trip per step.

A model that asks for N tools at once writes one ``AIMessage`` with N tool calls; LangGraph
runs them in one step, at once (``ToolNode`` maps them over a thread pool or gathers them;
``create_agent`` sends each as its own task of the same step). Each call reaches its
adapter (:class:`~langchain_idempotent.adapters.tool.IdempotentTool` or the middleware) on its own.

How siblings find each other, deterministically: every call of the step sees the same
message (the graph state's messages, the middleware's ``request.state``), so each computes
the same *step identity* — the store, the thread, and the ids of all the message's tool
calls, in order. The first call to arrive is the *leader*: it derives the keys of every
sibling on its store among the tools of its step (the list of tools wrapped with it in one
``idempotent([...])``, which is what a ``ToolNode`` is built from; for the middleware, the
tools of the call's ``request.runtime`` that it names), makes one
:meth:`~langchain_idempotent.stores.BaseIdempotencyStore.claim_many` of each sibling's
own claim (:meth:`~langchain_idempotent.core.engine.Engine.claim_request` of the engine that
runs it, with a fresh owner token), and files the answers under their keys. Every call
(the leader too) then takes its own answer — the first one filed under its key — and
hands it to the engine as :class:`~langchain_idempotent.core.engine.Claimed`: the engine's first
claim is answered without a round trip (a replay costs nothing more; a busy key waits and
claims again as usual). A call takes a claim only if it was made with a request equal to
its own (owner token aside): any other is given back and the call claims on its own, under
its own policy, as does a call whose key is not in the batch (not derivable by the
leader). Batching can only save round trips, never change an answer.

Leases: the batch takes each sibling's lease at the moment the step starts its tools,
which is when each would have claimed anyway (the calls of one step run at once). A lease
is only handed over within a *pickup window* — ``lease * min(renew_fraction,
1 - renew_fraction)`` from the claim — so the sibling's first renewal is due before the
lease runs out. A sibling that never comes for its claim in that window (it failed
earlier, the step was cancelled, the thread pool queued it) does not keep its key locked
until the lease expires: the claim is released (nothing ran) — or, for a takeover,
abandoned with the takeover's reason, so the next claimant is still told the previous run's
outcome is unknown — and a late sibling claims for itself.

A crash never strands a sibling that had not started. The leader knows which calls of the
step have reached their adapter (they *arrived*: their tool is starting). Those are claimed
with their own request. Each other sibling is claimed *before the boundary*
(``boundary=True``: its attempt starts as one that never reached its effect, whatever its
tool declares), and when it comes for a claim that runs it, it first records that it
started (the store's :meth:`~langchain_idempotent.core.store.BaseIdempotencyStore.mark_effect`,
one write, what its own claim would have cost) unless its tool marks its own boundary. If
the worker dies first, the next claim of that sibling is a free retry (``RETRY``): no
reconcile, no ``takeover=True``, never ``OutcomeUnknownError``. A replay or a busy key
needs no mark, so a step run again is still answered in one round trip. A store without
``mark_effect`` claims only the calls that arrived.

Nothing changes for a single call, for calls under approval (each is asked about before
its claim) or outside a graph (no message to find siblings in).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.engine import Claimed, Engine
from ..core.heartbeat import schedule_renewal
from ..core.record import Claim, ClaimOutcome, uncertain_kwargs
from ..core.store import BaseIdempotencyStore, ClaimRequest, Held
from ..errors import IdempotencyError

__all__ = ["Sibling", "StepCalls", "atake", "step_calls", "take"]

log = logging.getLogger("langchain_idempotent.batch")


@dataclass(frozen=True, slots=True)
class Sibling:
    """One call of the step as a batch sees it: the engine that runs it, its tool call id
    and thread, and its claim (:meth:`Engine.claim_request` of that engine; ``None``: the
    call claims nothing, as a read-only tool or a rejected identical call)."""

    engine: Engine
    call_id: str | None
    thread_id: str | None
    request: ClaimRequest | None


@dataclass(frozen=True, slots=True)
class StepCalls:
    """What a call knows of its step: the ids of all the message's tool calls, and how
    to derive the other calls (asked only by the leader, which adds itself)."""

    ids: tuple[str, ...]
    siblings: Callable[[], Iterable[Sibling]]


def step_calls(
    messages: Any,
    call_id: str | None,
    siblings: Callable[[list[dict[str, Any]]], Iterable[Sibling]],
) -> StepCalls | None:
    """The step of ``call_id``: the last AI message in ``messages`` that asked for it, when
    it asked for more than one call; else ``None`` (nothing to batch)."""
    if call_id is None or not messages:
        return None
    for message in reversed(messages):
        if getattr(message, "type", None) != "ai":  # first: only an AI message has calls
            continue
        calls = getattr(message, "tool_calls", None)
        if not calls:
            continue
        if len(calls) == 1:  # (most messages) the call alone, or another message's
            if str(calls[0].get("id")) == call_id:
                return None
            continue
        ids = tuple(str(c.get("id")) for c in calls)
        if call_id not in ids:
            continue
        if len(ids) < 2:
            return None
        return StepCalls(ids, functools.partial(siblings, list(calls)))
    return None


# -- the steps in flight ------------------------------------------------------------------

_Ident = tuple[int, str | None, tuple[str, ...]]
_Entry = tuple[ClaimRequest, Claim]


class _Batch:
    """One step's batch: filled once by its leader, emptied by its siblings."""

    __slots__ = ("arrived", "claims", "deadline", "failed", "future", "ready", "store", "timer")

    def __init__(self, store: BaseIdempotencyStore) -> None:
        self.store = store
        #: The ids of the calls that reached their adapter (their tools are starting).
        self.arrived: set[str] = set()
        self.ready = threading.Event()
        self.future: asyncio.Future[None] | None = None
        self.claims: dict[str, deque[_Entry]] = {}
        self.failed = False
        self.deadline = float("inf")
        self.timer: Any = None

    def fill(
        self, requests: Sequence[ClaimRequest], claims: Sequence[Claim], window: float
    ) -> None:
        with _lock:
            for request, claim in zip(requests, claims, strict=True):
                self.claims.setdefault(request.key, deque()).append((request, claim))
            self.deadline = time.monotonic() + window
        self.timer = schedule_renewal(window, self._expire)
        self._wake()

    def fail(self, window: float) -> None:
        """No batch (the claim raised, or nothing to batch): every sibling claims on its
        own. The step stays known for ``window``, so a late sibling does not lead again."""
        with _lock:
            self.failed = True
            self.deadline = time.monotonic() + window
        self._wake()

    def _wake(self) -> None:
        self.ready.set()
        future = self.future
        if future is not None and not future.done():
            future.get_loop().call_soon_threadsafe(_resolve, future)

    def pop(self, mine: ClaimRequest) -> _Entry | None:
        """The first claim filed under ``mine``'s key, taken out of the batch."""
        with _lock:
            if self.failed or time.monotonic() >= self.deadline:
                return None
            entries = self.claims.get(mine.key)
            if not entries:
                return None
            entry = entries.popleft()
            if not entries:
                del self.claims[mine.key]
            empty = not self.claims
        if empty:
            self._forget()
            if self.timer is not None:
                self.timer.cancel()
        return entry

    def _forget(self) -> None:
        with _lock:
            for ident, step in list(_batches.items()):
                if step is self:
                    del _batches[ident]

    def _expire(self) -> bool:
        """The pickup window is over: give back what nobody came for (scheduler thread)."""
        self._forget()
        with _lock:
            self.deadline = 0.0
            left = [entry for entries in self.claims.values() for entry in entries]
            self.claims.clear()
        for entry in left:
            _give_back_quietly(self.store, entry)
        return False  # a one-shot: never rescheduled


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _give_back(store: BaseIdempotencyStore, request: ClaimRequest, claim: Claim) -> None:
    """Undo a claim whose call never ran, as the protocol says for a run that did not start."""
    held = Held(request.key, request.owner, claim.fence)
    if claim.outcome is ClaimOutcome.TAKEOVER:
        store.abandon(held, **uncertain_kwargs(claim))
    elif claim.outcome.runs:
        store.release(held)
    log.debug("batch: gave back the unused %s claim of %r", claim.outcome.name, request.key)


_lock = threading.Lock()
_batches: dict[_Ident, _Batch] = {}


def _join(me: Sibling, step: StepCalls | None) -> tuple[_Batch, bool] | None:
    """This call's step batch, and whether this call leads it (makes the claim); ``None``
    when the call claims on its own (no step, approval, or nothing to claim)."""
    if step is None or me.engine.policy.approval or me.call_id is None or me.request is None:
        return None
    store = me.engine.store
    ident: _Ident = (id(store), me.thread_id, step.ids)
    with _lock:
        now = time.monotonic()
        for old in [i for i, s in _batches.items() if s.deadline <= now]:
            del _batches[old]  # failed steps whose window passed
        batch = _batches.get(ident)
        leader = batch is None or batch.store is not store
        if leader:
            batch = _batches[ident] = _Batch(store)
        assert batch is not None
        batch.arrived.add(me.call_id)
    return batch, leader


def _window(engine: Engine) -> float:
    policy = engine.policy
    return policy.lease_s * min(policy.renew_fraction, 1 - policy.renew_fraction)


def _requests(me: Sibling, step: StepCalls, batch: _Batch) -> tuple[list[ClaimRequest], float]:
    """The leader's claims, in the message's order: its own request and every other
    call's on the same store that claims (not under approval) — a call that has not
    arrived claimed before its boundary (see the module; left out on a store that
    cannot mark) — and the pickup window (the shortest of their engines')."""
    store = me.engine.store
    calls = {s.call_id: s for s in step.siblings()}
    calls[me.call_id] = me
    with _lock:  # read after deriving the siblings: the calls that arrived meanwhile count
        arrived = set(batch.arrived)
    marks = type(store).mark_effect is not BaseIdempotencyStore.mark_effect
    requests: list[ClaimRequest] = []
    window = float("inf")
    for call_id in dict.fromkeys(step.ids):
        sibling = calls.get(call_id)
        if (
            sibling is None
            or sibling.request is None
            or sibling.engine.store is not store
            or sibling.engine.policy.approval
        ):
            continue
        request = sibling.request
        if call_id not in arrived and not request.boundary:
            if not marks:
                continue
            request = dataclasses.replace(request, boundary=True)
        requests.append(request)
        window = min(window, _window(sibling.engine))
    return requests, window


def _plan(
    me: Sibling, step: StepCalls | None, batch: _Batch
) -> tuple[list[ClaimRequest], float] | None:
    """The leader's claims and pickup window, or ``None`` (the batch failed: fewer than two
    calls to claim, or a sibling's key could not be derived — that sibling will say why)."""
    assert step is not None  # _join refuses a call with no step
    try:
        requests, window = _requests(me, step, batch)
    except Exception:
        log.debug("batch: a sibling's key could not be derived; no batch", exc_info=True)
        requests, window = [], 0.0
    if len(requests) < 2:
        batch.fail(_window(me.engine))
        return None
    return requests, window


def _failed(me: Sibling, batch: _Batch, exc: BaseException) -> None:
    """The batch claim raised: every sibling claims on its own, and meets a store error in
    the engine's flow (``fail_open`` and all). A cancellation is raised on."""
    batch.fail(_window(me.engine))
    if not isinstance(exc, Exception):
        raise exc
    log.debug("batch: claim_many failed (%s); each call claims on its own", exc)


def _handed(batch: _Batch, mine: ClaimRequest) -> tuple[Claimed | None, _Entry | None, Held | None]:
    """This call's claim from the batch, if it was made with a request equal to ``mine``
    (owner token aside, and ``boundary`` where it was claimed before its boundary); else
    ``None`` and the claim to give back (made under another policy: the call claims on its
    own, under its own). Third: the lease to mark as started before the call runs (a claim
    made before the boundary that runs a tool which marks none itself), else ``None``."""
    entry = batch.pop(mine)
    if entry is None:
        return None, None, None
    request, claim = entry
    if request != dataclasses.replace(mine, owner=request.owner, boundary=request.boundary) or (
        mine.boundary and not request.boundary
    ):
        log.debug("batch: %r was claimed under another policy; it claims on its own", mine.key)
        return None, entry, None
    start = None
    if request.boundary and not mine.boundary and claim.outcome.runs:
        start = Held(request.key, request.owner, claim.fence)
    # The engine claims again (after a busy key) with the call's own request.
    return Claimed(dataclasses.replace(request, boundary=mine.boundary), claim), None, start


def _started(
    store: BaseIdempotencyStore, claimed: Claimed | None, start: Held | None
) -> Claimed | None:
    """``claimed`` once its start is recorded (``start``), or ``None`` (the call claims on
    its own) when the lease is gone or the store refused: running without the mark would
    make a crash look like one before the call started."""
    if start is None:
        return claimed
    try:
        if store.mark_effect(start):
            return claimed
    except IdempotencyError:
        log.debug("batch: the start of %r could not be recorded; it claims on its own", start.key)
        _release_quietly(store, start)
    return None


async def _astarted(
    store: BaseIdempotencyStore, claimed: Claimed | None, start: Held | None
) -> Claimed | None:
    if start is None:
        return claimed
    try:
        if await store.amark_effect(start):
            return claimed
    except IdempotencyError:
        log.debug("batch: the start of %r could not be recorded; it claims on its own", start.key)
        await asyncio.to_thread(_release_quietly, store, start)
    return None


def _release_quietly(store: BaseIdempotencyStore, held: Held) -> None:
    with contextlib.suppress(IdempotencyError):
        store.release(held)


def _give_back_quietly(store: BaseIdempotencyStore, entry: _Entry | None) -> None:
    if entry is not None:
        with contextlib.suppress(IdempotencyError):
            _give_back(store, *entry)


def take(me: Sibling, step: StepCalls | None) -> Claimed | None:
    """This call's claim from its step's batch (made now if this call leads), or ``None``:
    the call claims on its own."""
    joined = _join(me, step)
    if joined is None:
        return None
    batch, leader = joined
    if leader:
        plan = _plan(me, step, batch)
        if plan is None:
            return None
        requests, window = plan
        try:
            claims = me.engine.store.claim_many(requests)
        except BaseException as exc:
            _failed(me, batch, exc)
            return None
        batch.fill(requests, claims, window)
    elif not batch.ready.wait(timeout=me.engine.policy.lease_s):
        return None
    assert me.request is not None  # _join refuses a call that claims nothing
    claimed, other, start = _handed(batch, me.request)
    _give_back_quietly(batch.store, other)
    return _started(batch.store, claimed, start)


async def atake(me: Sibling, step: StepCalls | None) -> Claimed | None:
    """:func:`take` for async callers: the leader awaits ``aclaim_many``; siblings on the
    same loop await it without blocking the loop."""
    joined = _join(me, step)
    if joined is None:
        return None
    batch, leader = joined
    if leader:
        batch.future = asyncio.get_running_loop().create_future()
        await asyncio.sleep(0)  # the step's other calls, gathered with this one, arrive
        plan = _plan(me, step, batch)
        if plan is None:
            return None
        requests, window = plan
        try:
            claims = await me.engine.store.aclaim_many(requests)
        except BaseException as exc:
            _failed(me, batch, exc)
            return None
        batch.fill(requests, claims, window)
    else:
        future = batch.future
        timeout = me.engine.policy.lease_s
        if future is not None and future.get_loop() is asyncio.get_running_loop():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(future), timeout)
        elif not batch.ready.is_set():
            await asyncio.to_thread(batch.ready.wait, timeout)
        if not batch.ready.is_set():
            return None
    assert me.request is not None
    claimed, other, start = _handed(batch, me.request)
    if other is not None:
        await asyncio.to_thread(_give_back_quietly, batch.store, other)
    return await _astarted(batch.store, claimed, start)
