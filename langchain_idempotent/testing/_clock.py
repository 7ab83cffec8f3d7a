"""A clock for stores that take one (``clock=``), moved by hand instead of by sleeping."""

from __future__ import annotations

import time
from typing import Protocol


class MovableClock(Protocol):
    """What the contract's ``clock`` fixture gives: a way to move a store's clock forward.

    :class:`FakeClock` is one (for stores that take a ``clock``); a server store whose
    clock is the server's may offer its own, or none (the contract then waits in real time).
    """

    def advance(self, ms: int) -> None:
        """Move the store's clock ``ms`` milliseconds forward, at once."""
        ...


class FakeClock:
    """Seconds, like :func:`time.time`, moved by hand: ``clock.now += 0.5`` or
    ``clock.advance(500)`` (milliseconds).

    Pass it as the ``clock`` of :class:`~langchain_idempotent.stores.InMemoryIdempotencyStore`
    or :class:`~langchain_idempotent.stores.SqliteIdempotencyStore` to test leases and
    retention without waiting. Frozen between moves by default; with ``ticking=True`` it
    also runs on with real (monotonic) time between moves, so a watch still reaches a
    lease deadline by waiting while a test jumps past other leases: the store contract's
    clock (:class:`~langchain_idempotent.testing.StoreContractTests`, fixture ``clock``).
    """

    def __init__(self, now: float = 1_700_000_000.0, *, ticking: bool = False) -> None:
        self.now = now
        self._started = time.monotonic() if ticking else None

    def __call__(self) -> float:
        if self._started is None:
            return self.now
        return self.now + (time.monotonic() - self._started)

    def advance(self, ms: int) -> None:
        self.now += ms / 1000
