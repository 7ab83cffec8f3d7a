"""What LangChain and LangGraph hand a tool, as views that note what the tool reads.

A memoized call's tool is handed, in place of what ToolNode or the caller gave it:

* the graph state (a whole ``InjectedState``, ``ToolRuntime.state``) as a
  :class:`~langchain_idempotent.core.reads.ReadingDict` over its channels; a state that is
  no ``dict`` (a pydantic or dataclass state) is noted whole, as ``state``. Channels the
  graph declares ``UntrackedValue`` (run-local handles LangGraph never checkpoints, such
  as ``ShellToolMiddleware``'s session) are not noted: a resumed run does not have them.
* the config (a ``RunnableConfig`` parameter, ``ToolRuntime.config``, and what
  ``get_config()`` / ``get_runtime()`` return inside the tool): ``configurable`` noted
  key by key, except the framework's own per-run knobs (:func:`framework_knob`);
  ``recursion_limit``, ``max_concurrency``, ``run_name`` and ``tags`` when read; the
  ``metadata`` and callbacks never (tracing, not inputs).

The run's static context, ``InjectedToolArg`` values and ``InjectedState("field")``
values are known before the call and enter the key itself (:mod:`.keys`); a store
handle, the ``tool_call_id``, the stream writer and the tools are no inputs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..core.keys import SCOPE_CONFIG_KEY, TURN_CONFIG_KEY
from ..core.reads import ABSENT, ReadingDict, Reads, value_digest
from ..errors import InvalidArgumentsError
from ._compat import child_config_var, state_channels, state_fields

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig

    from ._compat import InjectedParams

__all__ = [
    "config_context",
    "current_digests",
    "framework_knob",
    "handed",
    "seeing_request",
    "view_config",
]

#: ``configurable`` keys LangGraph, the Agent Server and this library set per run or per
#: thread (langgraph-api ``models/run.py``: ``run_id``, ``graph_id``, ``assistant_id``,
#: ``cron_id``, ``langgraph_request_id``, the checkpoint's own keys) or that LangChain
#: reads on every run (``model``): not inputs of an effect (the thread is already in the
#: key), and a double-texted run changes them.
_KNOBS = frozenset(
    {
        "thread_id",
        "checkpoint_id",
        "checkpoint_ns",
        "checkpoint_map",
        "run_id",
        "graph_id",
        "assistant_id",
        "cron_id",
        "langgraph_request_id",
        "langsmith-trace",
        "baggage",
        "model",  # LangChain's configurable chat model (every ensure_config reads it)
        SCOPE_CONFIG_KEY,
        TURN_CONFIG_KEY,
    }
)
#: The Agent Server's authenticated user is an object: a read of it is noted as a read
#: of its id.
_ALIASES = {"langgraph_auth_user": "langgraph_auth_user_id"}
#: The top-level config entries that are noted when read (the rest is plumbing).
_CONFIG_READ = frozenset({"recursion_limit", "max_concurrency", "run_name", "tags"})


def framework_knob(key: str) -> bool:
    """Whether a ``configurable`` key is the framework's own (``__pregel_*``,
    ``__request_start_time_ms__``, ``checkpoint_ns``, ``run_id``, ...), not an input."""
    return key in _KNOBS or key.startswith(("__", "langsmith_", "langsmith-"))


def _not_read(key: str) -> bool:
    return key not in _CONFIG_READ


def view_config(config: Mapping[str, Any] | None, reads: Reads) -> Any:
    """``config`` (a ``RunnableConfig``) as a view that notes the tool's reads (its
    ``configurable`` too); no config stays none."""
    if config is None or isinstance(config, ReadingDict):
        return config
    configurable = config.get("configurable") or {}
    conf = ReadingDict(configurable, reads, "configurable", skip=framework_knob, alias=_ALIASES)
    values = {**config, "configurable": conf}
    return ReadingDict(config, reads, "config", skip=_not_read, values=values, whole=False)


def _view_state(state: Any, reads: Reads, untracked: frozenset[str]) -> Any:
    if isinstance(state, ReadingDict):
        return state
    if isinstance(state, dict):
        return ReadingDict(state, reads, "state", skip=untracked)
    if state is not None:
        reads.note("state", state_fields(state))  # a pydantic or dataclass state: read whole
    return state


def _view_runtime(runtime: Any, reads: Reads, untracked: frozenset[str]) -> Any:
    if not dataclasses.is_dataclass(runtime) or isinstance(runtime, type):
        return runtime
    changes: dict[str, Any] = {}
    if hasattr(runtime, "state"):
        changes["state"] = _view_state(runtime.state, reads, untracked)
    config = getattr(runtime, "config", None)
    if isinstance(config, dict):
        changes["config"] = view_config(config, reads)
    return dataclasses.replace(runtime, **changes) if changes else runtime


def handed(
    values: Mapping[str, Any], params: InjectedParams, reads: Reads
) -> dict[str, Any] | None:
    """The tool's injected values (``values``: its arguments by name) with the whole
    state, the ``ToolRuntime`` and an injected ``RunnableConfig`` replaced by views;
    ``None`` when it is handed none of them."""
    if not params.whole_state and not params.configs:
        return None
    out = dict(values)
    for name in params.configs:
        if isinstance(out.get(name), Mapping):
            out[name] = view_config(out[name], reads)
    for name in params.whole_state:
        if name not in out:
            continue
        if name == params.runtime:
            out[name] = _view_runtime(out[name], reads, params.untracked)
        else:
            out[name] = _view_state(out[name], reads, params.untracked)
    return out


class config_context:
    """While the tool runs, ``get_config()`` (and so ``get_runtime()``) returns a view of
    the tool run's config that notes into ``reads`` (``None``: as it is). (A plain class:
    entered on every call, where a generator-based context manager costs more.)"""

    __slots__ = ("_reads", "_token")

    def __init__(self, reads: Reads | None) -> None:
        self._reads = reads
        self._token: Any = None

    def __enter__(self) -> None:
        var = child_config_var()
        current = var.get()
        if self._reads is not None and isinstance(current, dict):
            self._token = var.set(view_config(current, self._reads))

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            child_config_var().reset(self._token)


class _SeeingTool:
    """A tool that ToolNode invokes with a view of its config (the middleware's way to
    hand a tool views: ToolNode passes the config, the middleware only the request)."""

    __slots__ = ("_reads", "_tool")

    def __init__(self, tool: Any, reads: Reads) -> None:
        self._tool = tool
        self._reads = reads

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tool, name)

    def invoke(self, input: Any, config: Any = None, **kwargs: Any) -> Any:
        return self._tool.invoke(input, view_config(config or {}, self._reads), **kwargs)

    async def ainvoke(self, input: Any, config: Any = None, **kwargs: Any) -> Any:
        return await self._tool.ainvoke(input, view_config(config or {}, self._reads), **kwargs)


def seeing_request(request: Any, params: InjectedParams, reads: Reads | None) -> Any:
    """A middleware's ``ToolCallRequest`` whose tool is handed views: its runtime (state
    and config, which ToolNode injects from) and the config ToolNode invokes it with."""
    if reads is None or request.tool is None:
        return request
    changes: dict[str, Any] = {"tool": _SeeingTool(request.tool, reads)}
    if request.runtime is not None:
        changes["runtime"] = _view_runtime(request.runtime, reads, params.untracked)
    return request.override(**changes)


def current_digests(paths: Mapping[str, str], config: RunnableConfig, state: Any) -> dict[str, str]:
    """The digests of what a call would read now at ``paths`` (a stored answer's reads):
    ``state`` is the graph state the call is given (else the running graph's, read through
    LangGraph), ``config`` its config."""
    roots: dict[str, Any] = {"config": config, "configurable": config.get("configurable") or {}}
    wanted = sorted(p.split(".", 1)[1] for p in paths if p.startswith("state."))
    if state is None and (wanted or "state" in paths):
        state = state_channels(config, tuple(wanted)) or None
    out: dict[str, str] = {}
    for path in paths:
        root, _, key = path.partition(".")
        if root == "state" and not key:
            whole = None if state is None else state_fields(state)
            out[path] = _digest_or_absent(state is not None, whole)
            continue
        source = state if root == "state" else roots.get(root)
        if isinstance(source, Mapping):
            present = key in source
            value = source.get(key) if present else None
        else:
            present = source is not None and hasattr(source, key)
            value = getattr(source, key, None)
        out[path] = _digest_or_absent(present, value)
    return out


def _digest_or_absent(present: bool, value: Any) -> str:
    if not present:
        return ABSENT
    try:
        return value_digest(value)
    except InvalidArgumentsError:
        return "?"  # differs from every digest: never the stored answer's
