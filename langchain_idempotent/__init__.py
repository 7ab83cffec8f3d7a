"""Idempotent LangChain / LangGraph tool calls.

Wrap a tool with :func:`idempotent` and every call made inside a graph runs at most once
per idempotency key (thread, graph path, node, tool and canonical arguments) while leases
are honoured; retries, resumed threads and concurrent workers replay the stored result.
"""

from .context import IdempotencyContext, get_idempotency_context, idempotency_scope
from .engine import Engine
from .errors import (
    CorruptRecordError,
    IdempotencyError,
    InProgressError,
    InvalidArgumentsError,
    LeaseLostError,
    MissingScopeError,
    OutcomeUnknownError,
    PayloadMismatchError,
    ResultTooLargeError,
    StoreUnavailableError,
)
from .events import EVENT_KINDS, EventCounter, IdempotencyEvent
from .keys import CallInfo
from .middleware import IdempotencyMiddleware
from .policy import Policy
from .settings import IdempotencySettings, store_from_url
from .stores import BaseIdempotencyStore, InMemoryIdempotencyStore
from .tool import IdempotentTool, idempotent

__all__ = [
    "EVENT_KINDS",
    "BaseIdempotencyStore",
    "CallInfo",
    "CorruptRecordError",
    "Engine",
    "EventCounter",
    "IdempotencyContext",
    "IdempotencyError",
    "IdempotencyEvent",
    "IdempotencyMiddleware",
    "IdempotencySettings",
    "IdempotentTool",
    "InMemoryIdempotencyStore",
    "InProgressError",
    "InvalidArgumentsError",
    "LeaseLostError",
    "MissingScopeError",
    "OutcomeUnknownError",
    "PayloadMismatchError",
    "Policy",
    "ResultTooLargeError",
    "StoreUnavailableError",
    "get_idempotency_context",
    "idempotency_scope",
    "idempotent",
    "store_from_url",
]
