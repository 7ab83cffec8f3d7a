"""``RedisIdempotencyStore``: many hosts, one Redis (standalone, Sentinel or Cluster).

The store and its spec are in :mod:`._store`. The other modules are its parts, each
readable on its own: :mod:`._scripts` (the Lua scripts and the wire contract),
:mod:`._clients` (building clients, retries, replica acknowledgement, error translation),
:mod:`._listing` (``list`` by ``SCAN``) and :mod:`._fastpath` (an optimisation for sync
clients).
"""

from ._store import RedisIdempotencyStore

__all__ = ["RedisIdempotencyStore"]
