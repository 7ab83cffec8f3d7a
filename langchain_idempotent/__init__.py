"""Idempotent LangChain / LangGraph tool calls.

Wrap a tool with :func:`idempotent` and every call made inside a graph runs at most once
per idempotency key (thread, graph path, node, tool and canonical arguments) while leases
are honoured; retries, resumed threads and concurrent workers replay the stored result.

Names are imported on first use, so ``import langchain_idempotent`` (and the CLI) stays
cheap; LangChain and LangGraph load when the wrapper or the engine is first touched.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

_EXPORTS: dict[str, str] = {
    "IdempotencyContext": "context",
    "get_idempotency_context": "context",
    "idempotency_scope": "context",
    "Engine": "engine",
    "CorruptRecordError": "errors",
    "IdempotencyError": "errors",
    "InProgressError": "errors",
    "InvalidArgumentsError": "errors",
    "LeaseLostError": "errors",
    "MissingScopeError": "errors",
    "OutcomeUnknownError": "errors",
    "PayloadMismatchError": "errors",
    "ResultTooLargeError": "errors",
    "StoreUnavailableError": "errors",
    "EVENT_KINDS": "events",
    "EventCounter": "events",
    "IdempotencyEvent": "events",
    "CallInfo": "keys",
    "IdempotencyMiddleware": "middleware",
    "Policy": "policy",
    "IdempotencySettings": "settings",
    "store_from_url": "settings",
    "BaseIdempotencyStore": "stores",
    "InMemoryIdempotencyStore": "stores",
    "SqliteIdempotencyStore": "stores",
    "RedisIdempotencyStore": "stores",
    "IdempotentTool": "tool",
    "idempotent": "tool",
}

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
    "RedisIdempotencyStore",
    "ResultTooLargeError",
    "SqliteIdempotencyStore",
    "StoreUnavailableError",
    "get_idempotency_context",
    "idempotency_scope",
    "idempotent",
    "store_from_url",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'langchain_idempotent' has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:
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
    from .stores import (
        BaseIdempotencyStore,
        InMemoryIdempotencyStore,
        RedisIdempotencyStore,
        SqliteIdempotencyStore,
    )
    from .tool import IdempotentTool, idempotent
