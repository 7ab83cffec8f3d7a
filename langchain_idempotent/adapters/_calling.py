"""The calling call: which memoized (or unwrapped) tool call a sub-agent runs inside.

A call made while another call's tool runs (a sub-agent invoked from inside a tool,
deepagents' ``task``) carries that call's identity as its key's ``parent_call``, so a
retry of the calling call derives the same keys below it and two calling calls never
share one. For a memoized call it is the call's key (:func:`calling`); inside a tool the
library does not wrap, the tool run's name, model-visible arguments, graph path and own
calling call, read from ``on_tool_start`` by a LangChain callback handler installed once
per process as a configure hook (:func:`watch_calling_tools`).

Process state, and why: :data:`_calling` is a ``ContextVar`` (per task, what runs inside a
tool); :data:`_tracker` holds the one handler LangChain's configure hook hands to every
run, so it must be one object for the process.
"""

from __future__ import annotations

import threading
from contextvars import ContextVar
from typing import Any

from ..core.canonical import canonical_json
from ..core.keys import digest, graph_path
from ..errors import InvalidArgumentsError

__all__ = [
    "calling",
    "calling_tools_tracker",
    "parent_call",
    "watch_calling_tools",
]

#: The key and ``checkpoint_ns`` of the memoized call whose tool is running now.
_calling: ContextVar[tuple[str, str] | None] = ContextVar(
    "langchain_idempotent_calling", default=None
)


class calling:
    """While a memoized call's tool runs: calls made inside it in a graph it started (a
    sub-agent the tool invokes: another ``checkpoint_ns``) carry ``key`` as their
    ``CallInfo.parent_call``. A tool called directly by the tool is no sub-agent. (A plain
    class: entered on every call, where a generator-based context manager costs more.)"""

    __slots__ = ("_called", "_token")

    def __init__(self, key: str, checkpoint_ns: str) -> None:
        self._called = (key, checkpoint_ns)

    def __enter__(self) -> None:
        self._token = _calling.set(self._called)

    def __exit__(self, *exc: object) -> None:
        _calling.reset(self._token)


def parent_call(checkpoint_ns: str) -> str | None:
    """The calling call of a call made in the graph ``checkpoint_ns``, if any."""
    outer = _calling.get()
    if outer is None or outer[1] == checkpoint_ns:
        return None
    return outer[0]


def _calling_tools() -> Any:
    """The one handler that names the calling call of a sub-agent invoked from inside a
    tool this library does not wrap (made on first use: importing the key model loads no
    callback machinery).

    At every tool run's start, the tool's name, its model-visible arguments (the
    ``inputs`` LangChain reports, injected ones filtered out), its graph path and its own
    calling call become :data:`_calling` for what runs inside it (LangChain copies the
    context into the tool run after ``on_tool_start``); the tool run's end restores it.
    It handles tool events only, inline."""
    if _tracker:
        return _tracker[0]
    from langchain_core.callbacks import BaseCallbackHandler

    class CallingTools(BaseCallbackHandler):
        run_inline = True
        ignore_llm = ignore_chain = ignore_retriever = ignore_chat_model = True
        ignore_custom_event = ignore_retry = True

        def __init__(self) -> None:
            self._before: dict[Any, tuple[str, str] | None] = {}

        def on_tool_start(
            self,
            serialized: dict[str, Any],
            input_str: str,
            *,
            run_id: Any,
            metadata: dict[str, Any] | None = None,
            inputs: dict[str, Any] | None = None,
            **kwargs: Any,
        ) -> None:
            ns = (metadata or {}).get("langgraph_checkpoint_ns")
            ns = ns if isinstance(ns, str) else ""
            outer = _calling.get()
            try:
                args: str | bytes = canonical_json(inputs if inputs is not None else input_str)
            except InvalidArgumentsError:
                args = input_str
            name = str((serialized or {}).get("name") or kwargs.get("name") or "")
            identity = digest("caller", outer[0] if outer else "", graph_path(ns), name, args)
            self._before[run_id] = outer
            _calling.set((f"{name}:{identity[:32]}", ns))

        def _ended(self, run_id: Any) -> None:
            if run_id in self._before:
                _calling.set(self._before.pop(run_id))

        def on_tool_end(self, output: Any, *, run_id: Any, **kwargs: Any) -> None:
            self._ended(run_id)

        def on_tool_error(self, error: BaseException, *, run_id: Any, **kwargs: Any) -> None:
            self._ended(run_id)

    _tracker.append(CallingTools())
    return _tracker[0]


_tracker: list[Any] = []
_watching = threading.Lock()


def calling_tools_tracker() -> object:
    """The library's own tracker of calling tools (``None`` before it is installed)."""
    return _tracker[0] if _tracker else None


def watch_calling_tools() -> None:
    """Install the tracker of calling tools (:func:`_calling_tools`) on every LangChain
    run from now on, with a LangChain configure hook (once per process; called when a
    tool is wrapped or a middleware is made)."""
    if _tracker:
        return
    with _watching:
        if _tracker:
            return
        from langchain_core.tracers.context import register_configure_hook

        handler = _calling_tools()
        var: ContextVar[Any] = ContextVar("langchain_idempotent_calling_tools", default=handler)
        register_configure_hook(var, inheritable=True)
