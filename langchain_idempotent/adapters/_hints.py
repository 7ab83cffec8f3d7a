"""The effect class an MCP tool's annotations suggest (docs/mcp.md#effect-classes-from-annotations).

An MCP server annotates its tools with ``readOnlyHint``, ``destructiveHint`` and
``idempotentHint``. Both LangChain loaders keep them on the tool's ``metadata``:
``langchain-mcp-adapters`` flat (``{"readOnlyHint": True, ...}``, unset hints ``None``),
LangChain's own ``langchain.mcp`` under ``metadata["mcp"]["tool"]["annotations"]`` (unset
hints left out); either spelling (``readOnlyHint`` or ``read_only_hint``, mcp 1 and 2).

Only a hint stated ``true`` chooses a class; a missing hint says nothing (MCP's own defaults,
``destructiveHint: true`` among them, describe an unannotated tool, which keeps today's
default), and ``false`` chooses nothing either:

================================  ==================
hints stated ``true``             class
================================  ==================
``readOnlyHint``                  ``read``
``destructiveHint`` (not read)    ``unsafe``
``idempotentHint`` (neither)      ``keyed``
none                              no class (default)
================================  ==================

A destructive tool that is also idempotent is ``unsafe``: a hint from a server never
loosens the protection another hint asks for. ``effect=`` given for the tool always wins.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from langchain_core.tools import BaseTool

from ..core.engine import Engine
from ..core.policy import EffectClass

__all__ = ["engine_for", "hinted_effect", "mcp_hints"]

#: Each hint, by its MCP name, with the snake_case spelling mcp 2 dumps.
_HINTS = {
    "readOnlyHint": "read_only_hint",
    "destructiveHint": "destructive_hint",
    "idempotentHint": "idempotent_hint",
}


def mcp_hints(tool: BaseTool) -> dict[str, bool]:
    """The effect hints ``tool``'s MCP annotations state (``true`` or ``false``)."""
    metadata: Any = tool.metadata
    if not isinstance(metadata, Mapping):
        return {}
    nested = metadata.get("mcp")
    if isinstance(nested, Mapping):  # langchain.mcp
        metadata = (nested.get("tool") or {}).get("annotations") or {}
    hints = {}
    for name, snake in _HINTS.items():
        value = metadata.get(name, metadata.get(snake))
        if isinstance(value, bool):
            hints[name] = value
    return hints


def hinted_effect(hints: Mapping[str, bool]) -> EffectClass | None:
    """The class the hints choose (the table above); ``None``: none."""
    if hints.get("readOnlyHint") is True:
        return "read"
    if hints.get("destructiveHint") is True:
        return "unsafe"
    if hints.get("idempotentHint") is True:
        return "keyed"
    return None


def engine_for(engine: Engine, tool: BaseTool) -> Engine:
    """``engine`` for ``tool``: its ``effect=``, else the class its annotations choose."""
    hints = mcp_hints(tool)
    return engine.for_tool(tool.name, hinted_effect(hints), hints)
