"""Public names imported on first use; a missing optional dependency names its extra.

The package faces (``langchain_idempotent`` and ``langchain_idempotent.stores``) each keep
one table of ``name -> module`` and call :func:`load` from their ``__getattr__``, so
``import langchain_idempotent`` loads neither LangChain, LangGraph, redis-py nor psycopg.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__all__ = ["EXTRAS", "load"]

#: Top-level distribution module -> the extra that installs it.
EXTRAS: dict[str, str] = {
    "langchain": "agents",
    "psycopg": "postgres",
    "psycopg_pool": "postgres",
}


def load(package: str, module: str, name: str) -> Any:
    """``name`` from ``package.module``; an ImportError naming the extra if one is missing."""
    try:
        return getattr(import_module(f".{module}", package), name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        extra = EXTRAS.get(missing.partition(".")[0])
        if extra is None:
            raise
        raise ImportError(
            f"{name} needs the {extra!r} extra ({missing} is not installed): "
            f"pip install 'langchain-idempotent[{extra}]'",
            name=missing,
        ) from exc
