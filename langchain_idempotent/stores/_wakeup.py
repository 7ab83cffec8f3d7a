"""In-process wake-ups, and the watch loop of stores that poll between them.

:class:`Wakeup`: a waiter subscribes to a key *before* it checks the record, so a change
that lands between the check and the wait is never missed. Threads wait on a condition;
coroutines on a future resolved thread-safely on their own loop. ``notify(key)`` wakes
both. Nothing is kept for keys nobody waits on. The memory store notifies it on every
change; SQLite for changes made in this process; PostgreSQL from its ``LISTEN`` thread.

:class:`Poller` (``watch`` / ``awatch``): the watch of a store whose wake-ups can be
missed (another process wrote the record): read the record, sleep until a wake-up, the
lease deadline or a poll interval that doubles from ``first_poll`` up to
``poll_interval``, and read again, until the record stops being RUNNING at the waiter's
fence, its lease passes, or the watch's timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..core.record import Record

__all__ = ["LeaseProbe", "Poller", "Wakeup"]

#: Reads the record under the watched key and the store's clock (ms).
Read = Callable[[], "tuple[Record | None, int]"]
AsyncRead = Callable[[], Awaitable["tuple[Record | None, int]"]]


class _Watch:
    __slots__ = ("futures", "generation", "waiters")

    def __init__(self) -> None:
        self.generation = 0
        self.waiters = 0
        self.futures: set[asyncio.Future[None]] = set()


class Wakeup:
    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._watches: dict[str, _Watch] = {}

    def notify(self, key: str) -> None:
        with self._cond:
            watch = self._watches.get(key)
            if watch is None:
                return
            watch.generation += 1
            futures, watch.futures = watch.futures, set()
            self._cond.notify_all()
        for fut in futures:
            loop = fut.get_loop()
            if not loop.is_closed():
                loop.call_soon_threadsafe(_resolve, fut)

    def _subscribe(self, key: str) -> tuple[_Watch, int]:
        with self._cond:
            watch = self._watches.get(key)
            if watch is None:
                watch = self._watches[key] = _Watch()
            watch.waiters += 1
            return watch, watch.generation

    def _unsubscribe(self, key: str, watch: _Watch) -> None:
        with self._cond:
            watch.waiters -= 1
            if watch.waiters == 0 and self._watches.get(key) is watch:
                del self._watches[key]

    def wait(self, key: str, changed: Callable[[], bool], timeout: float) -> None:
        """Return when ``changed()`` holds or ``notify(key)`` is called, or after ``timeout``."""
        watch, seen = self._subscribe(key)
        try:
            if changed():
                return
            with self._cond:
                self._cond.wait_for(lambda: watch.generation != seen, timeout)
        finally:
            self._unsubscribe(key, watch)

    async def await_(
        self, key: str, changed: Callable[[], Awaitable[bool]], timeout: float
    ) -> None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        watch, seen = self._subscribe(key)
        try:
            with self._cond:
                if watch.generation != seen:
                    return
                watch.futures.add(fut)
            if await changed():
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(fut, timeout)
        finally:
            with self._cond:
                watch.futures.discard(fut)
            self._unsubscribe(key, watch)


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class LeaseProbe:
    """One watch's view of the record: whether it stopped being RUNNING at ``fence`` (or its
    lease passed), and when its lease ends on this host's monotonic clock."""

    __slots__ = ("changed", "fence", "lease_end")

    def __init__(self, fence: int) -> None:
        self.fence = fence
        self.changed = False
        self.lease_end = float("inf")

    def update(self, rec: Record | None, now: int) -> bool:
        if rec is None or not rec.lease_live(now) or rec.fence != self.fence:
            self.changed = True
        else:
            self.lease_end = time.monotonic() + (rec.lease_until - now) / 1000 + 0.001
        return self.changed

    def slice(self, deadline: float, delay: float) -> float | None:
        """How long to sleep next; ``None`` once the watch's own timeout has passed."""
        now = time.monotonic()
        if now >= deadline:
            return None
        return max(0.0, min(deadline - now, self.lease_end - now, delay))


@dataclass(frozen=True, slots=True)
class Poller:
    """The watch of a store whose wake-ups can be missed: ``wakeup`` is notified with a
    key's topic, and between wake-ups the record is read again on a delay that doubles
    from ``first_poll`` up to ``poll_interval``."""

    wakeup: Wakeup
    first_poll: float
    poll_interval: float

    def watch(self, topic: str, *, fence: int, timeout: float, read: Read) -> None:
        """Block until the record changes (see the module docstring); ``topic`` is what
        ``wakeup.notify`` is called with for this key."""
        deadline = time.monotonic() + max(0.0, timeout)
        probe = LeaseProbe(fence)

        def changed() -> bool:
            return probe.update(*read())

        delay = self.first_poll
        changed()  # learn the lease deadline before choosing the first sleep
        while not probe.changed:
            wait = probe.slice(deadline, delay)
            if wait is None:
                return
            self.wakeup.wait(topic, changed, wait)
            delay = min(delay * 2, self.poll_interval)

    async def awatch(self, topic: str, *, fence: int, timeout: float, read: AsyncRead) -> None:
        """The async twin of :meth:`watch`."""
        deadline = time.monotonic() + max(0.0, timeout)
        probe = LeaseProbe(fence)

        async def changed() -> bool:
            return probe.update(*await read())

        delay = self.first_poll
        await changed()
        while not probe.changed:
            wait = probe.slice(deadline, delay)
            if wait is None:
                return
            await self.wakeup.await_(topic, changed, wait)
            delay = min(delay * 2, self.poll_interval)
