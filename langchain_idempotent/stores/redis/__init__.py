"""``RedisIdempotencyStore``: many hosts, one Redis (standalone, Sentinel or Cluster).

The store and its spec are in :mod:`._store`. The other modules are its parts, each
readable on its own: :mod:`._scripts` (the Lua scripts and the wire contract),
:mod:`._clients` (building clients, retries, error translation), :mod:`._durability`
(replica acknowledgement), :mod:`._watch` (wake-ups), :mod:`._listing` (``list`` by
``SCAN``), :mod:`._describe` (what the servers say about themselves, for ``doctor``) and
:mod:`._fastpath` (an optimisation for sync clients).
"""

from ._store import RedisIdempotencyStore

__all__ = ["RedisIdempotencyStore"]
