"""Idempotent LangChain / LangGraph tool calls.

Layout (``docs/development.md`` has the module map): ``core/`` the record protocol and
the engine, ``adapters/`` LangChain and LangGraph, ``integrations/`` MCP, remote agents
and OpenTelemetry, ``stores/`` the backends, ``cli/`` the operator's commands,
``testing/`` the store contract. Every module has one import path: the one of its file.

Wrap a tool with :func:`idempotent` and every call made inside a graph runs at most once
per idempotency key (thread, graph path, node, tool and canonical arguments) while leases
are honoured; retries, resumed threads and concurrent workers replay the stored result.

``__version__`` is the installed distribution's version, read from its metadata on first
use. Every public name is listed once, in ``_EXPORTS`` below, and imported on first use, so
``import langchain_idempotent`` (and the CLI's ``--help``) loads neither LangChain,
LangGraph, redis-py nor psycopg. A name whose optional dependency is missing raises an
ImportError naming the extra to install (``agents`` for :class:`IdempotencyMiddleware`,
``postgres`` for :class:`PostgresIdempotencyStore`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._lazy import exports

#: Public name -> the module that defines it. ``__all__`` is this table's keys; the
#: ``TYPE_CHECKING`` imports below repeat it for type checkers (a test keeps them equal).
_EXPORTS: dict[str, str] = {
    # the wrapper, the middleware and what a tool sees
    "idempotent": "adapters.tool",
    "IdempotentTool": "adapters.tool",
    "IdempotencyMiddleware": "adapters.middleware",
    "get_idempotency_context": "core.context",
    "idempotency_scope": "core.context",
    "IdempotencyContext": "core.context",
    "Policy": "core.policy",
    "PolicyOptions": "core.policy",
    "ReconcileCall": "core.reconcile",
    "ResultEncryption": "core.encryption",
    # stores
    "BaseIdempotencyStore": "core.store",
    "InMemoryIdempotencyStore": "stores.memory",
    "SqliteIdempotencyStore": "stores.sqlite",
    "RedisIdempotencyStore": "stores.redis",
    "PostgresIdempotencyStore": "stores.postgres",
    # errors
    "IdempotencyError": "errors",
    "InProgressError": "errors",
    "PayloadMismatchError": "errors",
    "LeaseLostError": "errors",
    "StoreUnavailableError": "errors",
    "MissingScopeError": "errors",
    "OutcomeUnknownError": "errors",
    "InvalidArgumentsError": "errors",
    "UnstorableResultError": "errors",
    "ResultTooLargeError": "errors",
    "CorruptRecordError": "errors",
    # deployment, and what hooks are handed
    "store_from_env": "settings",
    "CallInfo": "core._callinfo",
    "IdempotencyEvent": "core.events",
}

__all__ = list(_EXPORTS)

_load, __dir__ = exports(__name__, _EXPORTS)

#: The installed distribution's version (``importlib.metadata``), read on first use: the
#: bare annotation binds nothing, so the first access goes through ``__getattr__``.
__version__: str


def __getattr__(name: str) -> Any:
    if name == "__version__":  # read from the installed metadata on first use, then kept
        from importlib.metadata import PackageNotFoundError, version

        try:
            value = version("langchain-idempotent")
        except PackageNotFoundError:  # a checkout on sys.path that was never installed
            value = "0+unknown"
        globals()["__version__"] = value
        return value
    return _load(name)


if TYPE_CHECKING:
    from .adapters.middleware import IdempotencyMiddleware as IdempotencyMiddleware
    from .adapters.tool import IdempotentTool as IdempotentTool
    from .adapters.tool import idempotent as idempotent
    from .core._callinfo import CallInfo as CallInfo
    from .core.context import IdempotencyContext as IdempotencyContext
    from .core.context import get_idempotency_context as get_idempotency_context
    from .core.context import idempotency_scope as idempotency_scope
    from .core.encryption import ResultEncryption as ResultEncryption
    from .core.events import IdempotencyEvent as IdempotencyEvent
    from .core.policy import Policy as Policy
    from .core.policy import PolicyOptions as PolicyOptions
    from .core.reconcile import ReconcileCall as ReconcileCall
    from .core.store import BaseIdempotencyStore as BaseIdempotencyStore
    from .errors import CorruptRecordError as CorruptRecordError
    from .errors import IdempotencyError as IdempotencyError
    from .errors import InProgressError as InProgressError
    from .errors import InvalidArgumentsError as InvalidArgumentsError
    from .errors import LeaseLostError as LeaseLostError
    from .errors import MissingScopeError as MissingScopeError
    from .errors import OutcomeUnknownError as OutcomeUnknownError
    from .errors import PayloadMismatchError as PayloadMismatchError
    from .errors import ResultTooLargeError as ResultTooLargeError
    from .errors import StoreUnavailableError as StoreUnavailableError
    from .errors import UnstorableResultError as UnstorableResultError
    from .settings import store_from_env as store_from_env
    from .stores.memory import InMemoryIdempotencyStore as InMemoryIdempotencyStore
    from .stores.postgres import (
        PostgresIdempotencyStore as PostgresIdempotencyStore,
    )
    from .stores.redis import RedisIdempotencyStore as RedisIdempotencyStore
    from .stores.sqlite import SqliteIdempotencyStore as SqliteIdempotencyStore
