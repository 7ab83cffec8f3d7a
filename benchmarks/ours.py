"""How the benchmarks reach ``langchain_idempotent``: its engine, stores and tool wrapper.

Every "ours" case goes through these three functions, so all of them use the same store
construction and the same policy (default lease and wait timeout).
"""

from __future__ import annotations

import os
from typing import Any, Literal

from langchain_core.tools import BaseTool

from langchain_idempotent import (
    BaseIdempotencyStore,
    InMemoryIdempotencyStore,
    Policy,
    RedisIdempotencyStore,
    SqliteIdempotencyStore,
    idempotent,
)
from langchain_idempotent.core.engine import Engine

__all__ = ["StoreKind", "make_engine", "make_store", "wrap"]

StoreKind = Literal["redis", "sqlite", "memory"]

LEASE_S = 30.0
WAIT_TIMEOUT_S = 60.0


def make_store(kind: str, *, redis_url: str, workdir: str) -> BaseIdempotencyStore:
    """A store of ``kind``: Redis at ``redis_url`` (``redis_execute``: its sync calls
    through redis-py's ``execute_command``, the held-connection fast path off), SQLite in
    ``workdir``, or in memory."""
    if kind == "redis":
        return RedisIdempotencyStore.from_url(redis_url)
    if kind == "redis_execute":
        store = RedisIdempotencyStore.from_url(redis_url)
        store._clients.sync()  # made once; the fast path it set up is dropped for good
        store._clients.fast = None
        return store
    if kind == "sqlite":
        return SqliteIdempotencyStore(os.path.join(workdir, "bench.sqlite"))
    if kind == "memory":
        return InMemoryIdempotencyStore()
    raise ValueError(f"unknown store kind {kind!r}; expected 'redis', 'sqlite' or 'memory'")


def wrap(tool: BaseTool, store: BaseIdempotencyStore) -> Any:
    """``idempotent(tool, store=store)`` with the default policy."""
    return idempotent(tool, store=store)


def make_engine(store: BaseIdempotencyStore, *, boundary: bool = False) -> Engine:
    """The engine every "ours" case uses: default lease and wait timeout, nothing else
    (``boundary=True`` for the cases whose action runs inside ``side_effect()``)."""
    return Engine(store, Policy(lease=LEASE_S, wait_timeout=WAIT_TIMEOUT_S, boundary=boundary))
