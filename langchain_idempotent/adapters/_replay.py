"""A stored ``ToolMessage`` / ``Command`` answers the current call, not the first one.

A tool's answer is the ``ToolMessage`` whose ``tool_call_id`` is the id of the call that
ran it. When the answer is stored, that id is replaced by :data:`ANSWER`, so the record
says which message answered (:func:`mark_answer`); every caller then gets the result with
:data:`ANSWER` replaced by its own call's id (:func:`restamp`). Only the answer changes:

* its ``tool_call_id`` becomes the current call's, its ``name`` is kept, and on a replay
  its message ``id`` is dropped (``add_messages`` gives it a new one, so two answers never
  share an id);
* every other message in a ``Command``'s update (a message the tool added, or one it
  copied from the state) keeps its ``tool_call_id`` and its ``id``: ``add_messages``
  merges it with itself instead of appending a copy.

Every form of ``Command.update`` is handled: a mapping (``{"messages": [...]}``), a list
of ``(channel, value)`` pairs, and a bare list of messages (a graph whose root channel is
the message list, as LangGraph's own handoff tests use).

A record without the mark (stored by an older version, or by a call without a call id)
is re-stamped by the rule of the single answer: a top-level ``ToolMessage`` is the
answer; in a ``Command``, its only ``ToolMessage`` is (with several, none is changed).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from langchain_core.messages import ToolMessage
from langchain_core.messages.tool import ToolOutputMixin

from ._compat import injected_call_id_names

__all__ = ["ANSWER", "direct_call_id", "mark_answer", "messages_of", "restamp"]

#: The ``tool_call_id`` a stored answer carries in place of the first call's id.
ANSWER = "__idempotency_answer__"

_Stamp = Callable[[ToolMessage], ToolMessage]


def mark_answer(result: Any, tool_call_id: str | None) -> Any:
    """``result`` as it is stored: the answer to ``tool_call_id`` marked as :data:`ANSWER`."""
    if not tool_call_id:
        return result

    def mark(message: ToolMessage) -> ToolMessage:
        if message.tool_call_id != tool_call_id:
            return message
        return message.model_copy(update={"tool_call_id": ANSWER})

    return _map_messages(result, mark)


def restamp(result: Any, tool_call_id: str | None, *, replayed: bool = True) -> Any:
    """``result`` as the answer to the call ``tool_call_id``.

    On a first run only the mark is replaced (the answer is the tool's own message, id and
    all); on a replay the answer's message id is dropped as well, and an unmarked record
    is re-stamped by the rule of the single answer (see the module docstring).
    """
    if tool_call_id is None:
        return result
    changes: dict[str, Any] = {"tool_call_id": tool_call_id}
    if replayed:
        changes["id"] = None
    marked = _contains_mark(result)

    def stamp(message: ToolMessage) -> ToolMessage:
        if message.tool_call_id != ANSWER:
            return message
        return message.model_copy(update=changes)

    if marked:
        return _map_messages(result, stamp)
    if not replayed:
        return result
    if isinstance(result, ToolMessage):
        return result.model_copy(update=changes)
    if isinstance(result, list) and result and all(isinstance(r, ToolOutputMixin) for r in result):
        return [restamp(r, tool_call_id) for r in result]
    answer = _single_answer(result)
    if answer is None:
        return result
    return _map_messages(result, lambda m: m.model_copy(update=changes) if m is answer else m)


def _contains_mark(result: Any) -> bool:
    found = False

    def look(message: ToolMessage) -> ToolMessage:
        nonlocal found
        found = found or message.tool_call_id == ANSWER
        return message

    _map_messages(result, look)
    return found


def _single_answer(result: Any) -> ToolMessage | None:
    """In an unmarked ``Command``: its only ``ToolMessage``; ``None`` when there are several
    (which one answered cannot be told)."""
    messages: list[ToolMessage] = []

    def collect(message: ToolMessage) -> ToolMessage:
        messages.append(message)
        return message

    _map_messages(result, collect)
    if len(messages) == 1:
        return messages[0]
    return None


#: Answers that hold no message (exact types: a subclass may be anything).
_PLAIN = frozenset({str, dict, tuple, int, float, bool, bytes, type(None)})


def _map_messages(result: Any, fn: _Stamp) -> Any:
    """``result`` with ``fn`` applied to each ``ToolMessage`` it answers with: itself, the
    items of a list of tool outputs, or the messages of a ``Command``'s update."""
    if type(result) in _PLAIN:  # the common answer: no message in it
        return result
    if isinstance(result, ToolMessage):
        return fn(result)
    if isinstance(result, list) and result and all(isinstance(r, ToolOutputMixin) for r in result):
        return [_map_messages(r, fn) for r in result]
    from langgraph.types import Command

    if not isinstance(result, Command) or result.update is None:
        return result
    update = _map_update(result.update, fn)
    return result if update is result.update else dataclasses.replace(result, update=update)


def _map_update(update: Any, fn: _Stamp) -> Any:
    if isinstance(update, dict):
        messages = update.get("messages")
        if isinstance(messages, list | tuple | ToolMessage):
            return {**update, "messages": _map_list(messages, fn)}
        return update
    if isinstance(update, list | tuple):
        if update and all(_is_pair(item) for item in update):
            pairs = [
                (channel, _map_list(value, fn) if channel == "messages" else value)
                for channel, value in update
            ]
            return tuple(pairs) if isinstance(update, tuple) else pairs
        if any(isinstance(item, ToolMessage) for item in update):
            return _map_list(update, fn)
    return update


def _is_pair(item: Any) -> bool:
    return isinstance(item, tuple | list) and len(item) == 2 and isinstance(item[0], str)


def _map_list(messages: Any, fn: _Stamp) -> Any:
    if isinstance(messages, ToolMessage):
        return fn(messages)
    if not isinstance(messages, list | tuple):
        return messages
    mapped = [fn(m) if isinstance(m, ToolMessage) else m for m in messages]
    return tuple(mapped) if isinstance(messages, tuple) else mapped


def direct_call_id(tool: Any, tool_input: Any) -> str | None:
    """The call id of a tool invoked with plain arguments that carry it (``{"x": 1,
    "tool_call_id": "direct"}`` for a tool with an ``InjectedToolCallId`` parameter, as
    LangChain allows): the id its ``ToolMessage`` answers, so a replay answers the same."""
    if not isinstance(tool_input, dict):
        return None
    for name in injected_call_id_names(tool):
        value = tool_input.get(name)
        if isinstance(value, str) and value:
            return value
    return None


def messages_of(result: Any) -> list[Any]:
    """Every message a ``Command`` result's update carries (none for other results)."""
    from langgraph.types import Command

    if not isinstance(result, Command):
        return []
    update = result.update
    found: list[Any] = []
    if isinstance(update, dict):
        found = _as_list(update.get("messages"))
    elif isinstance(update, list | tuple):
        if update and all(_is_pair(item) for item in update):
            for channel, value in update:
                if channel == "messages":
                    found += _as_list(value)
        else:
            found = [m for m in update if hasattr(m, "type")]
    return found


def _as_list(value: Any) -> list[Any]:
    if isinstance(value, list | tuple):
        return list(value)
    return [] if value is None else [value]
