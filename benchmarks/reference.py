"""The reference approach the library replaces, as the benchmarks time it.

The recipe itself (GET, SET NX lock, run, MULTI/EXEC SET result + DEL lock; on any way out
of the action a plain DEL of the lock and re-raise) lives once, in :mod:`graphs.reference`;
here it runs on the benchmark's own ``redis.Redis`` client with the recipe's TTLs (a 45 s
lock, results kept 86,400 s), and ``run(key, action)`` takes a key the benchmark chose.

Its faults are kept on purpose (they are what the benchmarks count): the window between
the GET and the SET NX lets a second worker run after the first has finished, and the
unconditional DEL removes another worker's lock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis

from graphs.reference import RedisKV
from graphs.reference import ReferenceIdempotency as _Recipe

__all__ = ["LOCK_SECONDS", "RESULT_SECONDS", "ReferenceIdempotency"]

LOCK_SECONDS = 45
RESULT_SECONDS = 86400


class ReferenceIdempotency:
    """The reference recipe on ``client``: ``run(key, action)``."""

    def __init__(self, client: redis.Redis) -> None:
        self._recipe = _Recipe(RedisKV(client), lock_ttl=LOCK_SECONDS, result_ttl=RESULT_SECONDS)

    def run(self, key: str, action: Callable[[], Any]) -> Any:
        return self._recipe.run_key(key, action)
