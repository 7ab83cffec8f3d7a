"""A clock for stores that take one (``clock=``), moved by hand instead of by sleeping."""

from __future__ import annotations


class FakeClock:
    """Seconds, like :func:`time.time`, moved by hand: ``clock.now += 0.5``.

    Pass it as the ``clock`` of :class:`~langchain_idempotent.stores.InMemoryIdempotencyStore`
    or :class:`~langchain_idempotent.stores.SqliteIdempotencyStore` to test leases and
    retention without waiting.
    """

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
