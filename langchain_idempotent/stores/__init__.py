"""Stores for idempotency records: one protocol (``base``), one backend per module.

Each backend is a sibling module named after what it stands on (``memory``, ``sqlite``,
``redis``, ``postgres``) and is imported on first use, as LangGraph keeps ``cache/redis``
apart from ``cache/base``: importing the base (and so the engine) never loads redis-py or
psycopg. ``PostgresIdempotencyStore`` needs the ``postgres`` extra.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import exports

#: Public name -> the module of this package that defines it; ``__all__`` is its keys.
_STORES: dict[str, str] = {
    "BaseIdempotencyStore": ".core.store",
    "ClaimRequest": ".core.store",
    "CompleteRequest": ".core.store",
    "Held": ".core.store",
    "InMemoryIdempotencyStore": "memory",
    "SqliteIdempotencyStore": "sqlite",
    "RedisIdempotencyStore": "redis",
    "PostgresIdempotencyStore": "postgres",
    "parse_store_url": "_url",
}

__all__ = list(_STORES)


__getattr__, __dir__ = exports(__name__, _STORES)


if TYPE_CHECKING:
    from ..core.store import BaseIdempotencyStore as BaseIdempotencyStore
    from ..core.store import ClaimRequest as ClaimRequest
    from ..core.store import CompleteRequest as CompleteRequest
    from ..core.store import Held as Held
    from ._url import parse_store_url as parse_store_url
    from .memory import InMemoryIdempotencyStore as InMemoryIdempotencyStore
    from .postgres import (
        PostgresIdempotencyStore as PostgresIdempotencyStore,
    )
    from .redis import RedisIdempotencyStore as RedisIdempotencyStore
    from .sqlite import SqliteIdempotencyStore as SqliteIdempotencyStore
