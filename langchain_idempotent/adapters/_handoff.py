"""Handoff and control-flow tools: what memoizing a tool that answers with a ``Command``
made from the graph state means.

A *handoff* reads the graph state (an ``InjectedState`` or ``ToolRuntime`` parameter)
and returns a ``Command`` (``langgraph-swarm`` / ``langgraph-supervisor``'s
``transfer_to_*`` copy the whole message history into it; deepagents' ``task`` answers
with the sub-agent's result). A memoized ``Command`` is the first call's: replayed
as-is it would write the first call's snapshot of the state over the current one (the
current ``AIMessage`` gone, answers pointing at the wrong calls). So one option says
what replay means for such a tool:

``handoff="rerun"`` (the default for a handoff)
    The tool runs on every call, with no key and no record: its answer is the current
    state's. For pure control flow (``transfer_to_*``): it has no effect to repeat. It is
    the safe default because it never answers with another state's snapshot; what a
    handoff's sub-agent does through wrapped tools is memoized under their own keys
    (their calling call is the handoff's call), so a re-run handoff replays those effects.

``handoff="replay"``
    Memoized like any tool; a replay answers the current call (only the stored answer is
    re-stamped). For a tool whose ``Command`` carries only its own answer and values it
    computed — deepagents' ``task``, whose finished sub-agent run is then replayed
    instead of run again. A first run whose ``Command`` also carries messages it did not
    make (a copy of the history) is returned but not stored, with a warning: replaying it
    would be the snapshot this option exists to prevent.
"""

from __future__ import annotations

import logging
import typing
from typing import Any, Literal

from ..core.engine import Unmemoized
from ._compat import reads_graph_state
from ._replay import ANSWER, messages_of

__all__ = ["Handoff", "check_handoff", "is_handoff", "stored_handoff"]

Handoff = Literal["rerun", "replay"]

log = logging.getLogger("langchain_idempotent")


def is_handoff(tool: Any) -> bool:
    """Whether ``tool``'s function reads the graph state and is declared to return a
    ``Command``."""
    from langgraph.types import Command

    for fn in (getattr(tool, "func", None), getattr(tool, "coroutine", None)):
        if fn is None:
            continue
        try:
            hints = typing.get_type_hints(fn, include_extras=True)
        except Exception:  # unresolvable annotations: cannot tell
            continue
        returns = hints.pop("return", None)
        if _mentions(returns, Command) and any(reads_graph_state(h) for h in hints.values()):
            return True
    return False


def _mentions(hint: Any, cls: type) -> bool:
    if hint is cls or typing.get_origin(hint) is cls:
        return True
    return any(_mentions(arg, cls) for arg in typing.get_args(hint))


def check_handoff(tool: Any, handoff: Handoff | None) -> Handoff | None:
    """What replay means for ``tool``: ``handoff``, or ``"rerun"`` for a handoff given
    none (``None`` for any other tool); an unknown value is refused."""
    if handoff is not None and handoff not in ("rerun", "replay"):
        raise ValueError(f"handoff must be 'rerun' or 'replay', got {handoff!r}")
    if handoff is None and tool is not None and is_handoff(tool):
        return "rerun"
    return handoff


def stored_handoff(result: Any, tool: str, tool_call_id: str | None) -> Any:
    """Under ``handoff="replay"``: a ``Command`` that carries messages besides its answer
    to ``tool_call_id`` is returned but not stored."""
    answers = (tool_call_id, ANSWER)
    extra = [m for m in messages_of(result) if getattr(m, "tool_call_id", None) not in answers]
    if not extra:
        return result
    log.warning(
        "tool %r returned a Command carrying %d message(s) besides its answer (a copy of "
        "the state); it is not memoized, so no replay writes that snapshot back. Use "
        "handoff='rerun' for such a tool",
        tool,
        len(extra),
    )
    return Unmemoized(result)
