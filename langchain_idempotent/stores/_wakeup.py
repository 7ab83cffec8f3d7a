"""In-process wake-ups for stores without a server-side notification (memory, SQLite).

A waiter subscribes to a key *before* it checks the record, so a change that lands
between the check and the wait is never missed. Threads wait on a condition;
coroutines on a future resolved thread-safely on their own loop. ``notify(key)`` wakes
both. Nothing is kept for keys nobody waits on.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable

__all__ = ["Wakeup"]


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
