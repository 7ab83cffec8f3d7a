"""Stores for idempotency records: one protocol, three backends."""

from .base import BaseIdempotencyStore
from .memory import InMemoryIdempotencyStore

__all__ = ["BaseIdempotencyStore", "InMemoryIdempotencyStore"]
