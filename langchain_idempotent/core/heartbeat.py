"""Lease renewal for long-running tools, without a thread per call.

Sync: one daemon thread per process (started on first use, restarted after ``fork``)
keeps a heap of due renewals. Scheduling is a heap push; a tool that finishes before its
first renewal is due costs nothing more: when a cancelled renewal falls due, the thread
sweeps out every cancelled one and sleeps until the next live one, so under steady load
it wakes about twice per renewal period, not once per finished call. Async: a timer on
the running loop (``loop.call_later``) that starts a renewal task only if the tool is
still running.

A renewal callback returns ``False`` when the lease is gone; it is then not rescheduled.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable

__all__ = ["AsyncRenewal", "Renewal", "schedule_renewal"]

log = logging.getLogger("langchain_idempotent.core.heartbeat")


class Renewal:
    """A scheduled renewal; ``cancel()`` when the tool finishes."""

    __slots__ = ("cancelled", "every", "renew")

    def __init__(self, every: float, renew: Callable[[], bool]) -> None:
        self.every = every
        self.renew = renew
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True
        self.renew = _gone  # let go of the call (its closure) now, not when it falls due


def _gone() -> bool:
    return False


#: The heap is swept of cancelled renewals whenever it reaches this size (and then twice
#: the size it was left with), so it stays proportional to the tools still running
#: instead of every call of the last ``every`` seconds.
_SWEEP_AT = 1024


class _Scheduler:
    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        """Fresh state; also run in a forked child, where another thread of the parent may
        have held the lock at ``fork()`` (it would stay locked forever)."""
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._heap: list[tuple[float, int, Renewal]] = []
        self._seq = itertools.count()
        self._pid = -1
        self._sleeping_until = float("inf")  # when the thread will next wake by itself
        self._sweep_at = _SWEEP_AT

    def add(self, renewal: Renewal) -> None:
        due = time.monotonic() + renewal.every
        with self._lock:  # the condition's own lock, held without its Python-level wrapper
            if self._pid != os.getpid():
                self._heap.clear()  # after fork: the parent's thread is gone
                self._pid = os.getpid()
                threading.Thread(
                    target=self._loop, name="idempotency-renewals", daemon=True
                ).start()
            if len(self._heap) >= self._sweep_at:
                self._sweep()
            heapq.heappush(self._heap, (due, next(self._seq), renewal))
            if due < self._sleeping_until:  # only wake the thread if it would oversleep
                self._sleeping_until = due
                self._cond.notify()

    def _sweep(self) -> None:
        """Drop the cancelled renewals (the lock held)."""
        heap = self._heap
        heap[:] = [entry for entry in heap if not entry[2].cancelled]
        heapq.heapify(heap)
        self._sweep_at = max(_SWEEP_AT, 2 * len(heap))

    def _loop(self) -> None:
        while True:
            with self._cond:
                while True:
                    # A cancelled entry that falls due sweeps out every cancelled one: the
                    # thread then sleeps until the next live renewal (or until ``add``
                    # wakes it for a new one), not once for every call that finished.
                    if self._heap and self._heap[0][0] <= time.monotonic():
                        _, _, renewal = heapq.heappop(self._heap)
                        if renewal.cancelled:
                            self._sweep()
                            continue
                        break
                    if self._heap:
                        self._sleeping_until = self._heap[0][0]
                        self._cond.wait(self._sleeping_until - time.monotonic())
                    else:
                        self._sleeping_until = float("inf")
                        self._cond.wait()
            try:
                keep = renewal.renew()
            except Exception:  # a store error: try again at the next tick
                log.warning("lease renewal failed; retrying", exc_info=True)
                keep = True
            if keep and not renewal.cancelled:
                with self._cond:
                    due = time.monotonic() + renewal.every
                    heapq.heappush(self._heap, (due, next(self._seq), renewal))


_scheduler = _Scheduler()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_scheduler._reset)


def schedule_renewal(every: float, renew: Callable[[], bool]) -> Renewal:
    renewal = Renewal(every, renew)
    _scheduler.add(renewal)
    return renewal


class AsyncRenewal:
    """Renew on the running loop every ``every`` seconds until cancelled."""

    __slots__ = ("_every", "_handle", "_renew", "_task")

    def __init__(self, every: float, renew: Callable[[], Awaitable[bool]]) -> None:
        self._every = every
        self._renew = renew
        self._task: asyncio.Task[None] | None = None
        self._handle = asyncio.get_running_loop().call_later(every, self._start)

    def _start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            try:
                if not await self._renew():
                    return
            except Exception:
                log.warning("lease renewal failed; retrying", exc_info=True)
            await asyncio.sleep(self._every)

    def cancel(self) -> None:
        self._handle.cancel()
        if self._task is not None:
            self._task.cancel()
