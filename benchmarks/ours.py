"""How the benchmarks reach ``langchain_idempotent``: its engine, stores and tool wrapper.

Every import is guarded, so the harness and the baseline cases run while parts of the
library are still missing: a missing part turns its rows into "not available: <reason>".
"""

from __future__ import annotations

import importlib
import os
from typing import Any

__all__ = [
    "StoreKind",
    "engine_error",
    "make_engine",
    "make_store",
    "wrap",
    "wrapper_error",
]

StoreKind = str  # "redis" | "sqlite" | "memory"

LEASE_S = 30.0
WAIT_TIMEOUT_S = 60.0


def _why(exc: ImportError) -> str:
    return "not available: " + str(exc).split(" (")[0]


def _lib(name: str) -> Any:
    """``langchain_idempotent.<name>``; raises ImportError when it is not there (yet)."""
    import langchain_idempotent

    found = getattr(langchain_idempotent, name, None)
    if found is None and name in _MODULES:  # written but not exported yet
        try:
            module = importlib.import_module(f"langchain_idempotent.stores.{_MODULES[name]}")
        except ImportError:
            module = None
        found = getattr(module, name, None)
    if found is None:
        raise ImportError(f"cannot import name {name!r} from 'langchain_idempotent'")
    return found


_MODULES = {
    "RedisIdempotencyStore": "redis",
    "SqliteIdempotencyStore": "sqlite",
    "InMemoryIdempotencyStore": "memory",
}

_STORES = {
    "redis": "RedisIdempotencyStore",
    "sqlite": "SqliteIdempotencyStore",
    "memory": "InMemoryIdempotencyStore",
}


def engine_error(kind: StoreKind | None = None) -> str | None:
    """Why ``Engine`` (and the store of ``kind``) cannot be used, or ``None`` if it can."""
    try:
        _lib("Engine")
        _lib("Policy")
        if kind is not None:
            _lib(_STORES[kind])
    except ImportError as exc:
        return _why(exc)
    return None


def wrapper_error() -> str | None:
    """Why ``idempotent`` cannot be used, or ``None`` if it can."""
    try:
        _lib("idempotent")
    except ImportError as exc:
        return _why(exc)
    return None


def make_store(kind: StoreKind, *, redis_url: str, workdir: str) -> Any:
    """A store of ``kind``: Redis at ``redis_url``, SQLite in ``workdir``, or in memory."""
    cls = _lib(_STORES[kind])
    if kind == "redis":
        return cls.from_url(redis_url)
    if kind == "sqlite":
        return cls(os.path.join(workdir, "bench.sqlite"))
    return cls()


def wrap(tool: Any, store: Any) -> Any:
    """``idempotent(tool, store=store)`` with the default policy."""
    return _lib("idempotent")(tool, store=store)


def make_engine(store: Any) -> Any:
    """The engine every "ours" case uses: default lease and wait timeout, nothing else."""
    return _lib("Engine")(store, _lib("Policy")(lease=LEASE_S, wait_timeout=WAIT_TIMEOUT_S))
