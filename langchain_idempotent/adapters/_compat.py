"""Every touch of a private (or relied-on internal) LangChain / LangGraph API that the
adapters make, in one place. The other third parties' touches stand beside their one
user: LangGraph's msgpack serde in :mod:`..core._compat` (under the engine, which must
not load this module: it imports ``langchain_core.tools``), psycopg_pool in
:mod:`..stores.postgres._compat`, MCP in :mod:`..integrations.mcp._compat`.

Supported ranges (the ones ``pyproject.toml`` allows and CI tests): ``langchain-core``
>=1.0,<2, ``langgraph`` >=1.0,<2 (with ``langgraph-prebuilt`` 1.x), and for the
middleware ``langchain`` >=1.0,<2. Last checked with langchain-core 1.8, langgraph 1.2,
langgraph-prebuilt 1.1, langchain 1.5. ``tests/test_compat.py`` checks each touch below
and names the moved API when a release breaks one.

==============================================  ==============================================
touch                                           why
==============================================  ==============================================
``BaseTool._run`` / ``_arun`` of another tool   :class:`DirectCall`: the wrapper's own tool run
                                                is the only one (LangChain already parsed the
                                                arguments and will format the output), so the
                                                inner tool's ``_run`` is called directly
``langchain_core.tools.base.``                  which parameter of a ``_run`` takes the
``_get_runnable_config_param``                  ``RunnableConfig`` (as ``BaseTool.run`` decides)
``BaseTool._injected_args_keys``,               ``IdempotentTool`` parses a call exactly as the
``BaseTool._to_args_and_kwargs``                inner tool does (:func:`injected_args_keys`,
                                                :func:`to_args_and_kwargs`)
``langchain_core.tools.base._format_output``    a result stored by the wrapper, replayed by the
                                                middleware, becomes the ``ToolMessage``
                                                LangChain would have made
                                                (:func:`format_tool_output`)
LangGraph's ``configurable["__pregel_read"]``   the graph state's messages under
                                                ``scope="turn"``, and the ``AIMessage`` whose
                                                parallel calls claim in one batch
                                                (:mod:`._siblings`; :func:`graph_state_messages`)
``langchain_core.tools.base.``                  a direct call's ``tool_call_id`` argument is
``_is_injected_arg_type``                       the id its replay answers
                                                (:func:`injected_call_id_names`)
``configurable["__pregel_checkpointer"]``,      the outermost graph's messages for a nested
``configurable["checkpoint_map"]``              call under ``scope="turn"``
                                                (:func:`root_state_messages`)
the same two keys                               under ``on_fork="run"``: the checkpoint a
                                                task runs from, and its metadata's ``source``
                                                (``"fork"`` / ``"update"``: a time-travel
                                                branch) (:func:`forked_from`)
LangGraph's ``configurable                      the running task's scratchpad, which every
["__pregel_scratchpad"]``                       thread of one task shares: approval's
                                                per-task turns (:func:`task_scratchpad`)
``scratchpad.interrupt_counter``                the task's ``interrupt()`` position counter;
                                                its identity marks one run of the task,
                                                replaced when LangGraph re-runs it
                                                (:func:`interrupt_counter`)
LangGraph's position-matched resumes            the n-th ``interrupt()`` of a task gets the
                                                n-th answer; ``_asking`` records which call
                                                each position asked about
``langchain_core.runnables.config.``           what ``get_config()`` returns inside a tool
``var_child_runnable_config``                   run: a view that notes what it reads
                                                (:func:`child_config_var`, :mod:`._reads`)
a pydantic 1 state's ``__fields__``, an object  an object state handed whole is noted by its
state's ``__dict__``                            fields (:func:`state_fields`, :mod:`._reads`)
``langgraph.errors.GraphBubbleUp``              public, but relied on: never a result
                                                (:data:`NEVER_TERMINAL`), and let through
                                                ``ToolNode(handle_tool_errors=...)``
                                                (:class:`GraphMissingScopeError`)
==============================================  ==============================================

Whether a ``_run`` takes ``run_manager`` is read with :func:`inspect.signature` (the
standard library), not LangChain's private ``_signature_parameters``; a signature that
cannot be read (or a LangChain whose internals moved) makes :meth:`DirectCall.of`
return ``None``, and the wrapper goes through the inner tool's ``invoke`` instead.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from langchain_core.runnables.config import var_child_runnable_config
from langchain_core.tools import BaseTool, StructuredTool, Tool
from langchain_core.tools.base import _prep_run_args
from langgraph.errors import GraphBubbleUp

from ..errors import InvalidArgumentsError, MissingScopeError

if TYPE_CHECKING:
    from langchain_core.callbacks import (
        AsyncCallbackManagerForToolRun,
        CallbackManagerForToolRun,
    )
    from langchain_core.runnables import RunnableConfig

__all__ = [
    "NEVER_TERMINAL",
    "NO_INJECTIONS",
    "PREGEL_READ",
    "PREGEL_SCRATCHPAD",
    "DirectCall",
    "GraphConfigurationError",
    "GraphMissingScopeError",
    "InjectedParams",
    "forked_from",
    "format_tool_output",
    "graph_state_messages",
    "injected_args_keys",
    "injected_params",
    "interrupt_counter",
    "loud",
    "prep_run_args",
    "run_context",
    "state_channels",
    "task_scratchpad",
    "to_args_and_kwargs",
]

#: Exceptions LangGraph uses for control flow (``interrupt()``, ``Command(graph=PARENT)``):
#: never stored as a tool's result, whatever ``terminal_exceptions`` says.
NEVER_TERMINAL: tuple[type[BaseException], ...] = (GraphBubbleUp,)

#: LangGraph's internal ``configurable`` key holding a reader of the current state.
PREGEL_READ = "__pregel_read"
PREGEL_CHECKPOINTER = "__pregel_checkpointer"
#: LangGraph's internal ``configurable`` key holding the run's ``Runtime`` (its context).
PREGEL_RUNTIME = "__pregel_runtime"
#: The checkpoint sources LangGraph writes at the start of a time-travel branch: a
#: ``update_state`` (``"update"``) or a run resumed from an earlier checkpoint (``"fork"``).
FORK_SOURCES = ("fork", "update")
#: LangGraph's internal ``configurable`` key holding the running task's scratchpad.
PREGEL_SCRATCHPAD = "__pregel_scratchpad"


# -- errors the tool-error handling must not turn into a message for the model ----------


class GraphMissingScopeError(MissingScopeError, GraphBubbleUp):
    """A :class:`MissingScopeError`: no thread id, a programming error, not a tool failure.

    It is also a ``GraphBubbleUp``, which LangGraph's ``ToolNode`` re-raises under every
    ``handle_tool_errors`` setting (as it does for ``interrupt()``), so the developer sees
    it instead of the model reading it as a failed tool call.
    """


class GraphInvalidArgumentsError(InvalidArgumentsError, GraphBubbleUp):
    """An injected input with no canonical form: the application's to fix, not the
    model's (a ``GraphBubbleUp``, as :class:`GraphMissingScopeError`)."""


class GraphConfigurationError(ValueError, GraphBubbleUp):
    """A tool wrapped without what its key needs (``key_state``), found at its first call."""


def loud(error: Exception) -> Exception:
    """``error`` as one that ``ToolNode``'s error handling re-raises (same message and key):
    a :class:`GraphMissingScopeError`, :class:`GraphInvalidArgumentsError` or
    :class:`GraphConfigurationError`."""
    if isinstance(error, GraphBubbleUp):
        return error
    if isinstance(error, MissingScopeError):
        return GraphMissingScopeError(str(error), key=error.key)
    if isinstance(error, InvalidArgumentsError):
        return GraphInvalidArgumentsError(str(error), key=error.key)
    return GraphConfigurationError(str(error))


# -- the graph state ------------------------------------------------------------------------


def forked_from(config: RunnableConfig) -> str | None:
    """The id of the checkpoint this task runs from when it starts a time-travel branch
    (its metadata's ``source`` is ``"fork"`` or ``"update"``), else ``None`` (also outside
    a graph or without a checkpointer). One checkpointer read."""
    configurable = config.get("configurable") or {}
    saver = configurable.get(PREGEL_CHECKPOINTER)
    checkpoint_id = (configurable.get("checkpoint_map") or {}).get("")
    thread_id = configurable.get("thread_id")
    if saver is None or not checkpoint_id or thread_id is None:
        return None
    at = {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": "",
            "checkpoint_id": checkpoint_id,
        }
    }
    saved = saver.get_tuple(at)
    if saved is None or (saved.metadata or {}).get("source") not in FORK_SOURCES:
        return None
    return str(checkpoint_id)


def graph_state_messages(config: RunnableConfig | None) -> Any:
    """The ``messages`` channel of the running graph's state, or ``None`` outside a graph
    (also for a tool's ``run()`` called with no config at all)."""
    read = ((config or {}).get("configurable") or {}).get(PREGEL_READ)
    if read is None:
        return None
    try:
        return read("messages", False)
    except Exception:
        return None


# -- the running task (approval's turns, :mod:`._asking`) ---------------------------------


def task_scratchpad(config: RunnableConfig) -> Any:
    """The running LangGraph task's scratchpad, or ``None`` outside a graph run."""
    return (config.get("configurable") or {}).get(PREGEL_SCRATCHPAD)


def interrupt_counter(scratchpad: Any) -> Any:
    """The task's ``interrupt()`` position counter (one object per run of the task)."""
    return scratchpad.interrupt_counter


# -- BaseTool internals -------------------------------------------------------------------


def injected_args_keys(tool: BaseTool) -> frozenset[str]:
    """The arguments ``tool`` has injected (state, store, runtime, call id)."""
    return tool._injected_args_keys


def prep_run_args(
    value: Any, config: RunnableConfig | None, **kwargs: Any
) -> tuple[Any, dict[str, Any]]:
    """What ``BaseTool.invoke`` (and ``ainvoke``) hand ``run``: the tool input (a
    ``ToolCall``'s arguments) and the run's keyword arguments, the ensured ``config``
    among them."""
    return _prep_run_args(value, config, **kwargs)


def to_args_and_kwargs(
    tool: BaseTool, tool_input: str | dict[str, Any], tool_call_id: str | None
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``tool``'s own parsing of one input (its schema, its single-input rules)."""
    return tool._to_args_and_kwargs(tool_input, tool_call_id)


def format_tool_output(content: Any, artifact: Any, tool_call_id: str | None, name: str) -> Any:
    """What ``BaseTool.run`` returns for a successful result: a ``ToolMessage`` for a tool
    call (content stringified as LangChain does), the value itself otherwise."""
    from langchain_core.tools.base import _format_output

    return _format_output(content, artifact, tool_call_id, name, "success")


_ENTRY_POINTS = ("invoke", "ainvoke", "run", "arun")
#: The entry points of LangChain's own tool classes. ``StructuredTool`` and ``Tool``
#: override ``ainvoke`` only to run a sync-only tool's ``invoke`` in an executor, which
#: their ``_arun`` does for ``_run`` as well.
_KNOWN = {
    name: {getattr(kind, name) for kind in (BaseTool, StructuredTool, Tool)}
    for name in _ENTRY_POINTS
}


@dataclass(frozen=True, slots=True)
class _Params:
    """Which of ``run_manager`` and a ``RunnableConfig`` parameter a method takes."""

    run_manager: bool
    config: str | None

    @classmethod
    def of(cls, method: Callable[..., Any]) -> _Params:
        from langchain_core.tools.base import _get_runnable_config_param

        return cls(
            run_manager="run_manager" in inspect.signature(method).parameters,
            config=_get_runnable_config_param(method),
        )

    def kwargs(
        self, tool_kwargs: Mapping[str, Any], run_manager: Any, config: Any
    ) -> dict[str, Any]:
        out = dict(tool_kwargs)
        if self.run_manager:
            out["run_manager"] = run_manager
        if self.config is not None:
            out[self.config] = config
        return out


@dataclass(frozen=True, slots=True)
class DirectCall:
    """How to call one tool's ``_run`` and ``_arun`` with already parsed arguments, adding
    its ``run_manager`` and ``RunnableConfig`` parameters exactly when ``BaseTool.run``
    would (read once per wrapped tool, not on every call).

    Tools whose class overrides ``invoke``, ``ainvoke``, ``run`` or ``arun`` (beyond
    LangChain's own ``StructuredTool`` and ``Tool``) get ``None`` from :meth:`of`: their
    override may do work that ``_run`` does not, so they are called through ``invoke``.
    """

    tool: BaseTool
    sync: _Params
    async_: _Params
    #: Whether the config given to ``_run`` / ``_arun`` can reach the tool's own code: not
    #: for a ``StructuredTool`` whose function and coroutine take no ``RunnableConfig``
    #: (its ``_run`` hands the config to nothing else), so no view of it is made.
    hands_config: bool = True

    @classmethod
    def of(cls, tool: BaseTool) -> DirectCall | None:
        kind = type(tool)
        if any(getattr(kind, name) not in _KNOWN[name] for name in _ENTRY_POINTS):
            return None
        try:
            from langchain_core.tools.base import _get_runnable_config_param

            sync = _Params.of(tool._run)
            # As BaseTool.arun: a tool without its own _arun runs _run in an executor.
            uses_run = kind._arun is BaseTool._arun
            async_ = _Params.of(tool._run if uses_run else tool._arun)
            hands = sync.config is not None or async_.config is not None
            if hands and kind is StructuredTool:
                functions = (getattr(tool, "func", None), getattr(tool, "coroutine", None))
                hands = any(_get_runnable_config_param(f) for f in functions if f is not None)
        except (ImportError, AttributeError, TypeError, ValueError, NameError):
            return None  # a LangChain whose internals moved: go through invoke
        return cls(tool, sync, async_, hands)

    def run(
        self,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        *,
        config: RunnableConfig,
        run_manager: CallbackManagerForToolRun | None,
    ) -> Any:
        return self.tool._run(*args, **self.sync.kwargs(kwargs, run_manager, config))

    async def arun(
        self,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        *,
        config: RunnableConfig,
        run_manager: AsyncCallbackManagerForToolRun | None,
    ) -> Any:
        return await self.tool._arun(*args, **self.async_.kwargs(kwargs, run_manager, config))


def state_fields(state: Any) -> Any:
    """An object state's fields as a mapping (pydantic 2 and 1 models, dataclasses, plain
    objects), so a model class the canonicaliser does not know still has a digest."""
    names = getattr(type(state), "model_fields", None) or getattr(state, "__fields__", None)
    if names is None and dataclasses.is_dataclass(state):
        names = [f.name for f in dataclasses.fields(state)]
    if names is None:
        return vars(state) if hasattr(state, "__dict__") else state
    return {name: getattr(state, name, None) for name in names}


def child_config_var() -> Any:
    """The ``ContextVar`` that ``get_config()`` reads (the running child run's config)."""
    return var_child_runnable_config


def root_state_messages(config: RunnableConfig) -> Any:
    """The ``messages`` channel of the thread's outermost graph, read from its checkpoint
    (the one this step started from when LangGraph's ``checkpoint_map`` names it, else the
    latest), or ``None`` without a checkpointer or such a channel."""
    configurable = config.get("configurable") or {}
    saver = configurable.get(PREGEL_CHECKPOINTER)
    thread_id = configurable.get("thread_id")
    if saver is None or not hasattr(saver, "get_tuple") or thread_id is None:
        return None
    root: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": ""}
    checkpoint_map = configurable.get("checkpoint_map")
    if isinstance(checkpoint_map, dict) and checkpoint_map.get(""):
        root["checkpoint_id"] = checkpoint_map[""]
    try:
        saved = saver.get_tuple({"configurable": root})
        if saved is None and "checkpoint_id" in root:
            del root["checkpoint_id"]
            saved = saver.get_tuple({"configurable": root})
    except Exception:  # a saver that cannot answer here (an async-only one): no outer turn
        return None
    if saved is None:
        return None
    return saved.checkpoint.get("channel_values", {}).get("messages")


def injected_call_id_names(tool: Any) -> list[str]:
    """The parameters of ``tool`` annotated ``InjectedToolCallId`` (its schema's and its
    function's: a custom ``args_schema`` leaves it out), as LangChain finds them."""
    import typing

    from langchain_core.tools import InjectedToolCallId
    from langchain_core.tools.base import _is_injected_arg_type, get_all_basemodel_annotations

    hints: dict[str, Any] = {}
    schema = getattr(tool, "args_schema", None)
    if isinstance(schema, type):
        hints.update(get_all_basemodel_annotations(schema))
    for fn in (getattr(tool, "func", None), getattr(tool, "coroutine", None)):
        if fn is not None:
            try:
                hints.update(typing.get_type_hints(fn, include_extras=True))
            except Exception:  # unresolvable annotations: nothing to learn from them
                continue
    return [
        name
        for name, hint in hints.items()
        if _is_injected_arg_type(hint, injected_type=InjectedToolCallId)
    ]


def reads_graph_state(hint: Any) -> bool:
    """Whether a parameter annotated ``hint`` is handed the graph state: ``InjectedState``
    (LangGraph's marker, as ToolNode finds it) or a ``ToolRuntime``."""
    import typing

    from langchain_core.tools.base import _is_injected_arg_type
    from langgraph.prebuilt import InjectedState, ToolRuntime

    if _is_injected_arg_type(hint, injected_type=InjectedState):
        return True
    for candidate in (hint, typing.get_origin(hint), *typing.get_args(hint)):
        if isinstance(candidate, type) and issubclass(candidate, ToolRuntime):
            return True
    return False


# -- injected inputs (the key's "inputs" part, :mod:`.keys`) --------------------------------


@dataclass(frozen=True, slots=True)
class InjectedParams:
    """Which parameters of a tool are injected, and what each is, as ToolNode finds them
    (read once per tool)."""

    #: ``InjectedToolArg`` parameters the application fills in (``user_id``): by value.
    values: tuple[str, ...] = ()
    #: ``(parameter, state field)`` of each ``InjectedState("field")``.
    state_fields: tuple[tuple[str, str], ...] = ()
    #: Parameters given the whole graph state: ``InjectedState`` without a field, or a
    #: ``ToolRuntime`` (its ``.state``), also one injected by the name ``runtime``.
    whole_state: tuple[str, ...] = ()
    #: The parameter that gets the ``ToolRuntime`` (annotated, or by the name ``runtime``).
    runtime: str | None = None
    #: ``InjectedToolArg`` parameters typed ``RunnableConfig`` (memory-agent's ``config``):
    #: handed a view of the config, keyed by what the tool reads of it, not by value.
    configs: tuple[str, ...] = ()
    #: Every injected parameter (store, call id and runtime too): never a model argument.
    hidden: frozenset[str] = frozenset()
    #: State channels declared ``UntrackedValue`` in the state type the tool is given:
    #: run-local values LangGraph never checkpoints (a session handle), no inputs.
    untracked: frozenset[str] = frozenset()


NO_INJECTIONS = InjectedParams()


def injected_params(tool: BaseTool) -> InjectedParams:
    """The injected parameters of ``tool`` (ToolNode's private ``_get_all_injected_args``
    for state, store and runtime; langchain-core's ``_is_injected_arg_type`` for the
    rest). A tool whose annotations cannot be read has none the library can see."""
    import typing

    from langchain_core.tools.base import _is_injected_arg_type, get_all_basemodel_annotations
    from langgraph.prebuilt.tool_node import _get_all_injected_args

    try:
        found = _get_all_injected_args(tool)
        hints: dict[str, Any] = {}
        for fn in (getattr(tool, "func", None), getattr(tool, "coroutine", None)):
            if fn is not None:
                hints.update(typing.get_type_hints(fn, include_extras=True))
        declared = dict(hints)  # the function's own: a schema drops a ToolRuntime's types
        schema = tool.get_input_schema()
        if isinstance(schema, type):
            hints.update(get_all_basemodel_annotations(schema))
    except Exception:  # unresolvable annotations: nothing to learn from them
        return NO_INJECTIONS
    call_ids = set(injected_call_id_names(tool))
    injected = {name for name, hint in hints.items() if _is_injected_arg_type(hint)}
    injected |= set(found.state) | call_ids
    for name in (found.store, found.runtime):
        if name is not None:
            injected.add(name)
    special = set(found.state) | call_ids | {found.store, found.runtime}
    special |= {name for name in injected if _is_store_handle(hints.get(name))}
    configs = {name for name in injected - special if _is_config(hints.get(name))}
    special |= configs
    whole = [name for name, state_field in found.state.items() if not state_field]
    if found.runtime is not None and not _runtime_for_interceptors(tool):
        whole.append(found.runtime)
    return InjectedParams(
        values=tuple(sorted(injected - special)),
        state_fields=tuple(sorted((p, f) for p, f in found.state.items() if f)),
        whole_state=tuple(sorted(whole)),
        runtime=found.runtime,
        configs=tuple(sorted(configs)),
        hidden=frozenset(injected),
        untracked=frozenset(f for name in whole for f in _untracked_channels(declared.get(name))),
    )


def _is_store_handle(hint: Any) -> bool:
    """An injected parameter typed as a LangGraph ``BaseStore`` (memory-agent's
    ``store: Annotated[BaseStore, InjectedToolArg]``, filled in by the application): a
    handle like ToolNode's ``InjectedStore``, never a key input."""
    import typing

    from langgraph.store.base import BaseStore

    base = typing.get_args(hint)[0] if typing.get_origin(hint) is typing.Annotated else hint
    return isinstance(base, type) and issubclass(base, BaseStore)


def _is_config(hint: Any) -> bool:
    """An injected parameter typed ``RunnableConfig`` (a TypedDict: compared as the type)."""
    import typing

    from langchain_core.runnables import RunnableConfig

    return hint is not None and RunnableConfig in (hint, *typing.get_args(hint))


def _untracked_channels(hint: Any) -> set[str]:
    """The fields of the state type in ``hint`` (``ToolRuntime[Context, State]``,
    ``Annotated[State, InjectedState]``) that are declared ``UntrackedValue``."""
    import typing

    from langgraph.channels.untracked_value import UntrackedValue

    out: set[str] = set()
    for candidate in typing.get_args(hint):
        origin = typing.get_origin(candidate) or candidate
        if not isinstance(origin, type) or origin.__module__ == "builtins":
            continue
        try:
            fields = typing.get_type_hints(origin, include_extras=True)
        except Exception:  # unresolvable annotations: none known
            continue
        for name, field_hint in fields.items():
            for inner in (field_hint, *typing.get_args(field_hint)):
                meta = getattr(inner, "__metadata__", ())
                if any(m is UntrackedValue or isinstance(m, UntrackedValue) for m in meta):
                    out.add(name)
    return out


#: Where langchain-mcp-adapters defines the function of the tools it makes from an MCP
#: server's: their ``runtime`` is handed to the client's tool interceptors only.
_MCP_ADAPTER_MODULE = "langchain_mcp_adapters.tools"


def _runtime_for_interceptors(tool: BaseTool) -> bool:
    """Whether ``tool`` is one langchain-mcp-adapters made, whose ``ToolRuntime`` parameter
    only reaches the client's interceptors (the key interceptor reads the call's key, not
    the state): its effect is the MCP call's arguments, so the runtime is no whole-state
    read. An interceptor that copies state into the request needs ``key_state=[...]``."""
    fn = getattr(tool, "coroutine", None) or getattr(tool, "func", None)
    return getattr(fn, "__module__", None) == _MCP_ADAPTER_MODULE


def run_context(config: RunnableConfig) -> Any:
    """The run's static context (``Runtime.context``, what ``context_schema`` describes and
    ``graph.invoke(..., context=...)`` gives), or ``None`` outside a graph run."""
    runtime = (config.get("configurable") or {}).get(PREGEL_RUNTIME)
    return getattr(runtime, "context", None)


def state_channels(config: RunnableConfig, fields: tuple[str, ...]) -> dict[str, Any]:
    """The named channels of the running graph's state (those it has), or none outside
    a graph."""
    read = (config.get("configurable") or {}).get(PREGEL_READ)
    if read is None or not fields:
        return {}
    try:
        values = read(list(fields), False)
    except Exception:
        return {}
    return dict(values) if isinstance(values, Mapping) else {}
