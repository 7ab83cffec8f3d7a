"""Public names imported on first use; a missing optional dependency names its extra.

The package faces (``langchain_idempotent`` and ``langchain_idempotent.stores``) each keep
one table of ``name -> module`` and call :func:`load` from their ``__getattr__``, so
``import langchain_idempotent`` loads neither LangChain, LangGraph, redis-py nor psycopg.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any

__all__ = ["EXTRAS", "exports", "load", "needs_extra"]

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
        named = needs_extra(exc, name)
        if named is None:
            raise
        raise named from exc


def needs_extra(exc: ModuleNotFoundError, what: str) -> ImportError | None:
    """The error to raise for ``exc`` when an extra installs the missing module: it names
    the extra and its ``pip install`` line (``None``: no extra installs it)."""
    missing = exc.name or ""
    extra = EXTRAS.get(missing.partition(".")[0])
    if extra is None:
        return None
    return ImportError(
        f"{what} needs the {extra!r} extra ({missing} is not installed): "
        f"pip install 'langchain-idempotent[{extra}]'",
        name=missing,
    )


def exports(
    package: str, table: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of a face: a name of ``table`` is loaded from its
    module on first use and kept in the package's namespace; ``dir()`` shows exactly
    ``table``'s names."""
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = load(package, module, name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(table)

    return __getattr__, __dir__
