"""Idempotency keys: which calls are "the same effect".

``key = sha256(version, namespace, scope, thread_id, graph path, node, agent, calling
call, tool, canonical arguments, inputs[, scope part])``, every part length-prefixed so no
two tuples collide; :func:`explain_key` shows the parts of one key.

* version: ``v<canonicaliser>.k<key format>`` (:data:`KEY_VERSION`); changing either
  rule changes every key, so each is versioned.
* thread id: ``configurable.idempotency_scope``, else ``configurable.thread_id``, else an
  enclosing :func:`~langchain_idempotent.idempotency_scope`; no thread → ``MissingScopeError``.
* graph path: ``checkpoint_ns`` with the task ids and LangGraph's per-task call counters
  removed (``billing:9dd2…|1|tools:41c5…`` → ``billing|tools``): task ids change when the
  LLM step re-runs, and the counter grows each time a retried task invokes the same
  subgraph again, so neither may be part of "the same effect".
* node: ``metadata.langgraph_node`` (inside a subgraph only the leaf name, hence the path).
* agent: ``metadata.lc_agent_name``, the innermost named agent (``create_agent(name=...)``,
  deepagents' sub-agents); a subgraph mounted as a node is already told apart by its path.
* calling call: for a call made while another memoized call runs (a sub-agent invoked
  from inside a wrapped tool, deepagents' ``task``), that call's key; inside a tool the
  library does not wrap, that tool run's name, model-visible arguments, graph path and
  own calling call (a LangChain configure hook, :func:`watch_calling_tools`, reads them
  from ``on_tool_start``). A retry of the calling call derives the same key, so the
  sub-agent's effects replay; two calling calls (other tools, other arguments) never
  share one, so two sub-agents never collide.
* canonical arguments: the fields of the model-visible schema (an injected parameter the
  schema still shows, such as a ``runtime`` injected by name, is none), validated through
  that schema, then RFC 8785.
* inputs (:func:`key_inputs`): what the effect depends on that the model does not send:
  ``InjectedToolArg`` values, ``InjectedState("field")`` values, the ``key_state`` fields
  of a tool given the whole state (such a tool is refused without ``key_state``:
  :func:`check_key_state`), and the run's static context (``Runtime.context``) unless
  ``key_exclude=["context"]``; RFC 8785 too, and a value with no canonical form is
  refused naming it. A store handle, the ``tool_call_id`` and the rest of a
  ``ToolRuntime`` never enter: a handle has no value of its own, and a call id changes
  when the LLM step re-runs (docs/keys.md has the table).

Scopes (what one effect is):

======== ============================================ ======================================
scope    key adds                                     trade-off
======== ============================================ ======================================
thread   nothing (default)                            a deliberate repeat in a later user turn
                                                      is suppressed (replayed)
turn     the id of the last human message of the      a new user turn may repeat the call
         outermost graph (a sub-agent's own input
         message is made afresh by its caller)
call     the ``tool_call_id`` (arguments leave the    a retry through a re-run LLM step gets a
         key and become the fingerprint)              new id and runs again
function whatever the function returns (the arguments the function decides
         become the fingerprint)
======== ============================================ ======================================

The fingerprint (a hash of tool, canonical arguments and inputs) is stored with the
record: under ``call`` or a key function, the same key with other arguments or inputs is
rejected.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import threading
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from ..core._callinfo import CallInfo, KeyFunction, Scope
from ..core.canonical import CANONICAL_VERSION, canonical_json, json_arguments
from ..core.context import current_scope
from ..errors import InvalidArgumentsError, MissingScopeError

#: ``(namespace, custom key)`` → the agent name that first used it, to warn when a key
#: function merges two agents (bounded; per process).
_seen_keys: dict[tuple[str, str], str] = {}
_seen_lock = threading.Lock()
_SEEN_LIMIT = 10_000


class InjectedInputError(InvalidArgumentsError):
    """An input the model does not send (an injected value, a state field, the run's
    context) has no canonical form: the application's to fix, never the model's."""


class AgentCollisionWarning(UserWarning):
    """A key function gave two agents that the library tells apart the same key."""


if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig

    from ._compat import InjectedParams

__all__ = [
    "KEY_VERSION",
    "AgentCollisionWarning",
    "CallInfo",
    "DerivedKey",
    "KeyExplanation",
    "KeyFunction",
    "Scope",
    "by_field_name",
    "call_info",
    "call_inputs",
    "calling",
    "check_key_state",
    "derive_key",
    "explain_key",
    "graph_path",
    "key_inputs",
    "model_schema",
    "visible_arguments",
]

#: ``configurable`` key that gives a scope explicitly (outside graphs, or to override).
SCOPE_CONFIG_KEY = "idempotency_scope"
#: ``configurable`` key that names the user turn explicitly under ``scope="turn"``.
TURN_CONFIG_KEY = "idempotency_turn"

#: Bumped whenever the parts of a key or their rules change (it is part of every key).
#: 1: thread, graph path without task ids, node, tool, arguments. 2: the graph path also
#: drops per-task call counters; the agent's name and the calling call join the key;
#: ``turn`` is the outermost graph's turn.
#: 3: the inputs the model does not send (``InjectedToolArg`` values, ``InjectedState``
#: fields, ``key_state`` fields, the run's static context) join the key and the
#: fingerprint; an injected ``runtime`` parameter never counts as a model argument.
KEY_VERSION = 3

#: The key and ``checkpoint_ns`` of the memoized call whose tool is running now.
_calling: ContextVar[tuple[str, str] | None] = ContextVar(
    "langchain_idempotent_calling", default=None
)


@contextlib.contextmanager
def calling(key: str, checkpoint_ns: str) -> Iterator[None]:
    """While a memoized call's tool runs: calls made inside it in a graph it started (a
    sub-agent the tool invokes: another ``checkpoint_ns``) carry ``key`` as their
    :attr:`CallInfo.parent_call`. A tool called directly by the tool is no sub-agent."""
    token = _calling.set((key, checkpoint_ns))
    try:
        yield
    finally:
        _calling.reset(token)


@dataclass(frozen=True, slots=True)
class DerivedKey:
    key: str
    fingerprint: str
    meta: Mapping[str, str]


def graph_path(checkpoint_ns: str | None) -> str:
    """``"outer:9dd2…|tools:41c5…"`` → ``"outer|tools"``; ``"billing:9dd2…|1|tools:41c5…"``
    → ``"billing|tools"`` (a call counter is the same subgraph invoked again by a retry)."""
    if not checkpoint_ns:
        return ""
    return "|".join(
        part.split(":", 1)[0] for part in checkpoint_ns.split("|") if part and not part.isdigit()
    )


class _SingleInput(dict[str, Any]):
    """The JSON schema LangChain shows the model for a legacy single-input ``Tool``."""


def model_schema(tool: Any) -> Any:
    """What the model fills in for ``tool``: its ``tool_call_schema``; for a legacy
    single-input ``Tool`` (no ``args_schema``) the one string LangChain shows the model as
    ``__arg1`` (such a tool's ``tool_call_schema`` describes its ``_run`` instead)."""
    if getattr(tool, "args_schema", None) is None and isinstance(tool, _legacy_tool()):
        return _SingleInput(
            type="object",
            title=tool.name,
            description=tool.description,
            properties={"__arg1": {"title": "__arg1", "type": "string"}},
            required=["__arg1"],
        )
    return tool.tool_call_schema


@functools.cache
def _legacy_tool() -> type[Any]:
    """LangChain's single-input ``Tool`` class (imported on first use)."""
    from langchain_core.tools import Tool

    return Tool


def visible_arguments(
    schema: Any, tool_input: str | Mapping[str, Any], hidden: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """The model-visible arguments, validated and normalised through ``schema``; the
    ``hidden`` (injected) parameters are validated but left out, though the schema shows
    them (a ``runtime`` injected by name stays in ``tool_call_schema``).

    Raises :class:`pydantic.ValidationError` when the arguments do not fit the schema
    (the caller lets the tool report it the usual way).
    """
    if isinstance(schema, _SingleInput):
        # A single-input tool takes a string, or a mapping with one value under any name.
        if isinstance(tool_input, Mapping) and len(tool_input) == 1:
            tool_input = next(iter(tool_input.values()))
        if isinstance(tool_input, Mapping):
            return dict(tool_input)  # the tool itself refuses this
        return {"__arg1": tool_input}
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        fields = _field_set(schema)
        if isinstance(tool_input, str):
            # As LangChain does: a string is the first argument (``""`` for a tool with none).
            first = next(iter(schema.model_fields), None)
            tool_input = {first: tool_input} if first is not None else {}
        visible = {k: v for k, v in tool_input.items() if k in fields}
        return json_arguments(schema.model_validate(visible), fields - hidden if hidden else fields)
    if isinstance(tool_input, str):
        return {"__arg1": tool_input}
    props = schema.get("properties") if isinstance(schema, Mapping) else None
    if isinstance(props, Mapping):
        return {k: v for k, v in tool_input.items() if k in props and k not in hidden}
    return {k: v for k, v in tool_input.items() if k not in hidden}


def by_field_name(args_schema: Any, tool_input: Any) -> Any:
    """``tool_input`` with every argument passed by an alias of ``args_schema`` (``alias``,
    ``validation_alias``, an ``AliasChoices`` choice, an ``AliasPath``'s first step)
    renamed to its field name, as the tool will see it. The model-visible schema LangChain
    derives drops aliases, so the key is made from the field names."""
    if not (isinstance(args_schema, type) and issubclass(args_schema, BaseModel)):
        return tool_input
    if not isinstance(tool_input, Mapping):
        return tool_input
    names = _field_names_by_alias(args_schema)
    if not names:
        return tool_input
    renamed = dict(tool_input)
    for key in tool_input:
        name = names.get(key)
        if name is not None and name not in renamed:
            renamed[name] = renamed.pop(key)
    return renamed


@functools.lru_cache(maxsize=1024)
def _field_set(schema: type[BaseModel]) -> set[str]:
    """The field names of a model-visible schema (read once per schema class; shared, so
    callers must not mutate it)."""
    return set(schema.model_fields)


@functools.lru_cache(maxsize=1024)
def _field_names_by_alias(schema: type[BaseModel]) -> dict[str, str]:
    """Field name by alias (read once per schema class; callers must not mutate it)."""
    from pydantic import AliasChoices, AliasPath

    names: dict[str, str] = {}
    for name, info in schema.model_fields.items():
        for alias in (info.alias, info.validation_alias):
            choices = alias.choices if isinstance(alias, AliasChoices) else [alias]
            for choice in choices:
                if isinstance(choice, AliasPath) and isinstance(choice.path[0], str):
                    choice = choice.path[0]
                if isinstance(choice, str) and choice != name:
                    names.setdefault(choice, name)
    return names


def _thread_id(config: RunnableConfig) -> str | None:
    configurable = config.get("configurable") or {}
    for value in (configurable.get(SCOPE_CONFIG_KEY), configurable.get("thread_id")):
        if value is not None and value != "":
            return str(value)
    return current_scope()


def call_info(
    *,
    tool: str,
    schema: Any,
    tool_input: str | Mapping[str, Any],
    tool_call_id: str | None,
    config: RunnableConfig,
    namespace: str,
    inputs: Mapping[str, Any] | None = None,
    hidden: frozenset[str] = frozenset(),
) -> CallInfo:
    """What one call is; ``inputs`` are its injected inputs (:func:`key_inputs`),
    ``hidden`` the injected parameters that are no model argument."""
    args = visible_arguments(schema, tool_input, hidden)
    inputs = inputs or {}
    configurable = config.get("configurable") or {}
    metadata = config.get("metadata") or {}
    ns = configurable.get("checkpoint_ns") or metadata.get("langgraph_checkpoint_ns")
    ns = ns if isinstance(ns, str) else ""
    node = metadata.get("langgraph_node")
    agent = metadata.get("lc_agent_name")
    return CallInfo(
        tool=tool,
        args=args,
        canonical_args=canonical_json(args),
        namespace=namespace,
        thread_id=_thread_id(config),
        graph_path=graph_path(ns),
        node=str(node) if node is not None else None,
        tool_call_id=tool_call_id,
        config=config,
        agent_name=str(agent) if agent else None,
        checkpoint_ns=ns,
        parent_call=_parent_call(ns),
        inputs=inputs,
        canonical_inputs=_canonical_inputs(tool, inputs) if inputs else b"{}",
    )


#: The name in ``key_exclude`` that keeps the run's static context out of the key.
CONTEXT = "context"


def key_inputs(
    params: InjectedParams,
    args: Mapping[str, Any],
    *,
    state: Any = None,
    context: Any = None,
    key_state: Sequence[str] | None = None,
    exclude: Sequence[str] = (),
) -> dict[str, Any]:
    """The inputs of one call that the model does not send but the effect depends on:
    ``args``, the ``InjectedToolArg`` values (from the call's arguments); ``state``, each
    ``InjectedState("field")`` and each ``key_state`` field (from the arguments the tool
    gets, else from ``state``, the graph state); ``context``, the run's static context.
    Names in ``exclude`` (parameters, or ``"context"``) stay out. A store handle, the
    ``tool_call_id`` and the rest of a ``ToolRuntime`` never enter (docs/keys.md)."""
    values = {p: args[p] for p in params.values if p in args and p not in exclude}
    fields: dict[str, Any] = {}
    for param, name in params.state_fields:
        if param in exclude:
            continue
        if param in args:
            fields[name] = args[param]
        elif _has(state, name):
            fields[name] = _get(state, name)
    for name in key_state or ():
        if _has(state, name):
            fields[name] = _get(state, name)
    out: dict[str, Any] = {}
    if values:
        out["args"] = values
    if fields:
        out["state"] = fields
    if context is not None and CONTEXT not in exclude:
        out["context"] = context
    return out


def call_inputs(
    params: InjectedParams,
    args: str | Mapping[str, Any],
    config: RunnableConfig,
    *,
    state: Any = None,
    key_state: Sequence[str] | None = None,
    exclude: Sequence[str] = (),
) -> dict[str, Any]:
    """:func:`key_inputs` of one call as a tool gets it: from its arguments (ToolNode puts
    the injected values there), the whole state the tool is given (else ``state``, else
    the graph's channels) and the run's static context (from ``config``)."""
    from ._compat import run_context, state_channels

    given = args if isinstance(args, Mapping) else {}
    if state is None:
        for param in params.whole_state:
            value = given.get(param)
            state = getattr(value, "state", None) if param == params.runtime else value
            if state is not None:
                break
    if state is None:
        wanted = [f for p, f in params.state_fields if p not in given]
        wanted += list(key_state or ())
        state = state_channels(config, tuple(wanted)) if wanted else None
    return key_inputs(
        params,
        given,
        state=state,
        context=run_context(config),
        key_state=key_state,
        exclude=exclude,
    )


def _has(state: Any, name: str) -> bool:
    if isinstance(state, Mapping):
        return name in state
    return state is not None and hasattr(state, name)


def _get(state: Any, name: str) -> Any:
    return state[name] if isinstance(state, Mapping) else getattr(state, name)


def _canonical_inputs(tool: str, inputs: Mapping[str, Any]) -> bytes:
    """RFC 8785 bytes of ``inputs``; an input with no canonical form (a connection, a
    lock) is refused with its name and the option that keeps it out of the key."""
    try:
        return canonical_json(inputs)
    except InvalidArgumentsError as exc:
        where, fix = _uncanonical(inputs)
        raise InjectedInputError(
            f"tool {tool!r}: {where} is part of the idempotency key but has no canonical "
            f"JSON form ({exc}). Give the value as data (ids, not handles), or pass {fix} "
            "if the effect does not depend on it"
        ) from exc


def _uncanonical(inputs: Mapping[str, Any]) -> tuple[str, str]:
    """Which input has no canonical form, and the option that keeps it out of the key."""
    for name, value in (inputs.get("args") or {}).items():
        if not _canonical(value):
            return f"injected parameter {name!r}", f"key_exclude=[{name!r}]"
    for name, value in (inputs.get("state") or {}).items():
        if not _canonical(value):
            fix = f"key_exclude=[<its parameter>] (or drop {name!r} from key_state)"
            return f"state field {name!r}", fix
    return "the run's static context", f"key_exclude=[{CONTEXT!r}]"


def _canonical(value: Any) -> bool:
    try:
        canonical_json(value)
    except InvalidArgumentsError:
        return False
    return True


def check_key_state(
    tool: str, params: InjectedParams, *, scope: Any, key_state: Sequence[str] | None
) -> None:
    """Refuse a tool that is given the whole graph state (``InjectedState`` without a
    field, a ``ToolRuntime``) while nothing says which of it the effect depends on: the
    library cannot see what it reads, and a replay to another input (another customer)
    would be a wrong answer. Under ``scope="call"`` or a key function the key is not
    made from the inputs, so there is nothing to refuse."""
    if not params.whole_state or key_state is not None or callable(scope) or scope == "call":
        return
    raise ValueError(
        f"tool {tool!r} is given the whole graph state ({', '.join(params.whole_state)}), "
        "so the library cannot see which of it the effect depends on: a memoized answer "
        "could be replayed to another input (another customer). Say which state fields "
        "enter the key with key_state=['customer_id', ...], or key_state=() if the state "
        "it reads never changes the effect; or use InjectedState('field') for each field "
        "it reads, or a key function (scope=lambda call: ...)"
    )


def _parent_call(checkpoint_ns: str) -> str | None:
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
            identity = _digest("caller", outer[0] if outer else "", graph_path(ns), name, args)
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


def is_calling_tools(handler: object) -> bool:
    """Whether ``handler`` is the library's own tracker of calling tools."""
    return bool(_tracker) and handler is _tracker[0]


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


def _digest(*parts: str | bytes) -> str:
    """SHA-256 over the parts, each as ``<length>:<bytes>`` (hashed in one update)."""
    data = [p if isinstance(p, bytes) else p.encode("utf-8", "surrogatepass") for p in parts]
    return hashlib.sha256(b"".join([b"%d:" % len(d) + d for d in data])).hexdigest()


@dataclass(frozen=True, slots=True)
class KeyExplanation:
    """Which parts made a key, in the order they are hashed (see :func:`explain_key`)."""

    key: str
    scope: str
    parts: tuple[tuple[str, str], ...]

    def __str__(self) -> str:
        width = max(len(name) for name, _ in self.parts)
        lines = [f"key    {self.key}", f"scope  {self.scope}"]
        lines += [f"  {name:<{width}}  {value or '(none)'}" for name, value in self.parts]
        return "\n".join(lines)


def derive_key(info: CallInfo, scope: Scope | KeyFunction) -> DerivedKey:
    """The key, fingerprint and record meta for one call under ``scope``."""
    key = _key_of(*_key_parts(info, scope))
    fingerprint = _digest("fp", info.tool, info.canonical_args, info.canonical_inputs)[:32]
    meta = {
        "namespace": info.namespace,
        "thread_id": info.thread_id or "",
        "tool": info.tool,
        "node": info.node or "",
        "graph_path": info.graph_path,
        "agent": info.agent_name or "",
        "parent_call": info.parent_call or "",
        "key_version": str(KEY_VERSION),
    }
    return DerivedKey(key, fingerprint, meta)


def explain_key(
    call: CallInfo | Any,
    tool_input: str | Mapping[str, Any] | None = None,
    config: RunnableConfig | None = None,
    *,
    scope: Scope | KeyFunction | None = None,
    namespace: str | None = None,
) -> KeyExplanation:
    """Which parts made a key: the key and its parts in the order they are hashed
    (``print()`` it for a table). Raises what :func:`derive_key` raises.

    ``call`` is a :class:`CallInfo` (a key function or an approval predicate has one), or a
    tool (an :class:`~langchain_idempotent.IdempotentTool` brings its scope and namespace)
    with the ``tool_input`` it is invoked with (a ``ToolCall`` or its arguments, injected
    values included, as ToolNode passes them) and the
    ``config`` it runs under (``{"configurable": {"thread_id": ..., "checkpoint_ns": ...},
    "metadata": {"langgraph_node": ..., "lc_agent_name": ...}}``)::

        print(explain_key(wrapped_refund, {"invoice_id": "INV-7", "amount": 140},
                          {"configurable": {"thread_id": "t-1"}}))
    """
    policy = getattr(call, "policy", None)
    chosen: Scope | KeyFunction = scope or getattr(policy, "scope", None) or "thread"
    if isinstance(call, CallInfo):
        return _explain(call, chosen)
    if tool_input is None:
        raise TypeError("explain_key(tool, tool_input, config): give the call's input")
    tool_call_id = None
    args: Any = tool_input
    if isinstance(tool_input, Mapping) and tool_input.get("type") == "tool_call":
        args, tool_call_id = tool_input.get("args", {}), tool_input.get("id")
    from ._compat import injected_params

    params = injected_params(getattr(call, "inner", call))
    config = config or {}
    info = call_info(
        tool=call.name,
        schema=model_schema(call),
        tool_input=args,
        tool_call_id=tool_call_id,
        config=config,
        namespace=namespace or str(getattr(policy, "namespace", "default")),
        inputs=call_inputs(
            params,
            args,
            config,
            key_state=getattr(policy, "key_state", None),
            exclude=getattr(policy, "key_exclude", ()),
        ),
        hidden=params.hidden,
    )
    return _explain(info, chosen)


def _explain(info: CallInfo, scope: Scope | KeyFunction) -> KeyExplanation:
    name, named = _key_parts(info, scope)
    key = _key_of(name, named)
    parts = tuple(
        (part, value.decode("utf-8", "replace") if isinstance(value, bytes) else value)
        for part, value in named
    )
    return KeyExplanation(key, name, parts)


#: The version part of every key (:data:`CANONICAL_VERSION` and :data:`KEY_VERSION`).
_VERSION = f"v{CANONICAL_VERSION}.k{KEY_VERSION}"


def _key_parts(
    info: CallInfo, scope: Scope | KeyFunction
) -> tuple[str, list[tuple[str, str | bytes]]]:
    """The scope's name and the named parts of the key, in the order they are hashed; the
    text of an explanation is built from them only when one is asked for."""
    version = _VERSION
    if callable(scope):
        user_key = scope(info)
        if not isinstance(user_key, str) or not user_key:
            raise InvalidArgumentsError(
                f"the key function for tool {info.tool!r} must return a non-empty string, "
                f"got {user_key!r}"
            )
        _check_key_function(info, user_key)
        return "custom", [("version", version), ("namespace", info.namespace), ("custom", user_key)]
    if info.thread_id is None:
        raise MissingScopeError(
            f"tool {info.tool!r} was called without a thread id, so there is nothing to make "
            "its idempotency key from. Inside LangGraph, compile the graph with a checkpointer "
            "and invoke it with config={'configurable': {'thread_id': ...}}; outside a graph, "
            "wrap the call in `with idempotency_scope('order-123'):` or pass "
            f"config={{'configurable': {{'{SCOPE_CONFIG_KEY}': 'order-123'}}}}"
        )
    named: list[tuple[str, str | bytes]] = [
        ("version", version),
        ("namespace", info.namespace),
        ("scope", scope),
        ("thread_id", info.thread_id),
        ("graph_path", info.graph_path),
        ("node", info.node or ""),
        ("agent", info.agent_name or ""),
        ("parent_call", info.parent_call or ""),
        ("tool", info.tool),
    ]
    if scope == "thread":
        named += [("arguments", info.canonical_args), ("inputs", info.canonical_inputs)]
    elif scope == "call":
        if not info.tool_call_id:
            raise MissingScopeError(
                f"tool {info.tool!r} uses scope='call' but was invoked without a tool call id; "
                "invoke it with a ToolCall ({'name', 'args', 'id', 'type': 'tool_call'}) or "
                "use scope='thread'"
            )
        named += [("tool_call_id", info.tool_call_id), ("inputs", info.canonical_inputs)]
    else:
        turn = _turn_id(info.config, nested=bool(info.parent_call or "|" in info.graph_path))
        if turn is None:
            raise MissingScopeError(
                f"tool {info.tool!r} uses scope='turn' but no user turn was found: the graph "
                "state has no human message; pass config={'configurable': "
                f"{{'{TURN_CONFIG_KEY}': ...}}}} to name the turn"
            )
        named += [
            ("arguments", info.canonical_args),
            ("inputs", info.canonical_inputs),
            ("turn", turn),
        ]
    return scope, named


def _key_of(scope: str, named: list[tuple[str, str | bytes]]) -> str:
    """The key hashed from :func:`_key_parts` (a custom key hashes its marker too)."""
    if scope == "custom":
        (_, version), (_, namespace), (_, user_key) = named
        return _digest(version, namespace, "custom", user_key)
    return _digest(*[value for _, value in named])


def _check_key_function(info: CallInfo, user_key: str) -> None:
    """Warn when a key function gives two agents one key although the library tells them
    apart by name: one agent's effect would be replayed to the other. (Two calls of one
    agent sharing a business key, from different calling calls, are what such a key is
    for: no warning.)"""
    agent = info.agent_name or ""
    with _seen_lock:
        first = _seen_keys.setdefault((info.namespace, user_key), agent)
        if len(_seen_keys) > _SEEN_LIMIT:
            _seen_keys.pop(next(iter(_seen_keys)))
    if first == agent:
        return

    def name(agent: str) -> str:
        return repr(agent) if agent else "an unnamed agent"

    warnings.warn(
        f"the key function for tool {info.tool!r} gave the same key {user_key!r} to two "
        f"agents the library tells apart: {name(first)} and {name(agent)}; one agent's "
        "effect will be replayed to the other. Put call.agent_name into the key if they "
        "are different effects.",
        AgentCollisionWarning,
        stacklevel=2,
    )


def _turn_id(config: RunnableConfig, *, nested: bool) -> str | None:
    """``idempotency_turn``, else the id of the last human message of the outermost graph
    (for a nested call, read from the thread's root checkpoint), else of this graph."""
    configurable = config.get("configurable") or {}
    explicit = configurable.get(TURN_CONFIG_KEY)
    if explicit is not None:
        return str(explicit)
    from ._compat import graph_state_messages, root_state_messages

    if nested:
        outer = turn_from_messages(root_state_messages(config))
        if outer is not None:
            return outer
    return turn_from_messages(graph_state_messages(config))


def turn_from_messages(messages: Any) -> str | None:
    """The id of the last human message (``#n`` if it has none), or ``None`` if there is none."""
    count = 0
    last: str | None = None
    for message in messages or ():
        if getattr(message, "type", None) == "human":
            count += 1
            last = getattr(message, "id", None)
    if count == 0:
        return None
    return last or f"#{count}"
