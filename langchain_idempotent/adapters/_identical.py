"""Identical calls in one batch (one ``AIMessage`` asking for the same tool with the same
arguments more than once): what ``identical_calls=`` does with the second and later ones.

``"share"`` (the default): they have one key, so they share one effect (the first runs,
the others wait for it and replay its result). ``"run"``: the k-th identical call of the
message gets a key of its own (the shared key and ``k``), so each runs once, and a retry
of the same message still finds each one's record. ``"reject"``: the later ones are
answered with an error ``ToolMessage`` and run nothing.

The batch is the last ``AIMessage`` of the graph's ``messages`` that holds this call's
``tool_call_id``; calls are identical when their names and arguments are equal (as the
model sent them: ``{"amount": 140}`` and ``{"amount": 140.0}`` are equal here too).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Literal

from langchain_core.messages import AIMessage, ToolMessage

from .keys import DerivedKey

__all__ = ["IdenticalCalls", "has_twin", "position", "rejection", "separate"]

#: What ``identical_calls=`` accepts.
IdenticalCalls = Literal["share", "run", "reject"]


def _batch(messages: Any, tool_call_id: str | None) -> tuple[list[Any], int] | None:
    """The tool calls of the last ``AIMessage`` that holds ``tool_call_id``, and its index."""
    if tool_call_id is None or not isinstance(messages, list):
        return None
    for message in reversed(messages):
        if not isinstance(message, AIMessage):
            continue
        ids = [tc.get("id") for tc in message.tool_calls]
        if tool_call_id in ids:
            return message.tool_calls, ids.index(tool_call_id)
    return None


def position(messages: Any, tool_call_id: str, tool: str, args: Any) -> int:
    """How many identical calls come before this one in its batch (0: the first, or no
    batch to look at)."""
    found = _batch(messages, tool_call_id)
    if found is None:
        return 0
    calls, index = found
    return sum(1 for tc in calls[:index] if tc["name"] == tool and _same(tc["args"], args))


def has_twin(messages: Any, tool_call_id: str | None) -> bool:
    """Whether the batch of call ``tool_call_id`` holds another call identical to it (a
    *twin*: under ``"share"`` they share one effect, but each is its own call to answer)."""
    found = _batch(messages, tool_call_id)
    if found is None:
        return False
    calls, index = found
    me = calls[index]
    others = calls[:index] + calls[index + 1 :]
    return any(tc["name"] == me["name"] and _same(tc["args"], me["args"]) for tc in others)


def _same(a: Any, b: Any) -> bool:
    return isinstance(a, Mapping) and isinstance(b, Mapping) and dict(a) == dict(b)


def separate(derived: DerivedKey, part: str) -> DerivedKey:
    """A key of its own for a call the shared key must not cover: the k-th identical call
    (``identical_calls="run"``, part ``identical:<k>``) or a call on a time-travel branch
    (``on_fork="run"``, part ``fork:<checkpoint id>``). Fingerprint and meta are kept."""
    digest = hashlib.sha256(f"{derived.key}\x00{part}".encode()).hexdigest()
    return replace(derived, key=digest)


def rejection(tool: str, tool_call_id: str | None, k: int) -> ToolMessage:
    """The answer to a refused identical call (``identical_calls="reject"``)."""
    return ToolMessage(
        content=(
            f"refused: this is identical call number {k + 1} to {tool} with the same "
            "arguments in one message; only the first one runs (identical_calls='reject'). "
            "Ask again in a new message if the effect must happen more than once."
        ),
        tool_call_id=tool_call_id or "",
        name=tool,
        status="error",
    )
