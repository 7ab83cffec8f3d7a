"""Stores for idempotency records: one protocol, three backends."""

from .base import BaseIdempotencyStore
from .memory import InMemoryIdempotencyStore
from .redis import RedisIdempotencyStore
from .sqlite import SqliteIdempotencyStore

__all__ = [
    "BaseIdempotencyStore",
    "InMemoryIdempotencyStore",
    "RedisIdempotencyStore",
    "SqliteIdempotencyStore",
]
