"""What a LangChain or LangGraph call puts into its idempotency key.

The recipe itself (the parts, their order, the scopes, the version) is
:mod:`langchain_idempotent.core.keys`; what a tool reads while it runs is
:mod:`langchain_idempotent.core.reads` and :mod:`._reads`; the calling call of a sub-agent
is :mod:`._calling`. Here, the LangChain side of one call's :class:`CallInfo`:

* thread id: ``configurable.idempotency_scope``, else ``configurable.thread_id``, else an
  enclosing :func:`~langchain_idempotent.idempotency_scope`; no thread → ``MissingScopeError``.
* graph path: ``checkpoint_ns`` with the task ids and LangGraph's per-task call counters
  removed (``billing:9dd2…|1|tools:41c5…`` → ``billing|tools``).
* node: ``metadata.langgraph_node``; agent: ``metadata.lc_agent_name``, the innermost
  named agent; calling call: :func:`._calling.parent_call`.
* canonical arguments: the fields of the model-visible schema (an injected parameter the
  schema still shows, such as a ``runtime`` injected by name, is none), validated through
  that schema, then RFC 8785; an argument in ``key_exclude`` stays out. One with no
  canonical form is refused naming it and ``key_exclude=``.
* inputs (:func:`key_inputs`): what the effect depends on that the model does not send
  and the library can read before the call: ``InjectedToolArg`` values,
  ``InjectedState("field")`` values, the ``key_state`` fields (an override), and the run's
  static context (``Runtime.context``) unless ``key_exclude=["context"]``. What a tool
  given the whole state, a ``ToolRuntime`` or the config reads is recorded while it runs
  (:mod:`._reads`). A store handle and the ``tool_call_id`` never enter (docs/keys.md).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from ..core._callinfo import CallInfo, KeyFunction, Scope
from ..core.canonical import canonical_json, json_arguments
from ..core.context import current_scope
from ..core.keys import (
    KEY_VERSION,
    SCOPE_CONFIG_KEY,
    TURN_CONFIG_KEY,
    AgentCollisionWarning,
    DerivedKey,
    KeyExplanation,
    explain,
    graph_path,
)
from ..core.keys import derive_key as _derive_key
from ..core.reads import InjectedInputError
from ..errors import InvalidArgumentsError
from ._calling import parent_call
from ._compat import run_context, state_channels

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig

    from ._compat import InjectedParams

__all__ = [
    "KEY_VERSION",
    "AgentCollisionWarning",
    "CallInfo",
    "DerivedKey",
    "InjectedInputError",
    "KeyExplanation",
    "KeyFunction",
    "Scope",
    "by_field_name",
    "call_info",
    "call_inputs",
    "derive_key",
    "explain_key",
    "given_state",
    "graph_path",
    "key_inputs",
    "model_schema",
    "visible_arguments",
]

__all__ += ["SCOPE_CONFIG_KEY", "TURN_CONFIG_KEY"]


def derive_key(info: CallInfo, scope: Scope | KeyFunction) -> DerivedKey:
    """The key, fingerprint and record meta for one call under ``scope``
    (:func:`langchain_idempotent.core.keys.derive_key`, the turn read from the graph)."""
    return _derive_key(info, scope, _turn_of)


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
    plan = _model_plan(schema, hidden) if isinstance(schema, type) else None
    if plan is not None:
        fields, keyed = plan
        if isinstance(tool_input, str):
            # As LangChain does: a string is the first argument (``""`` for a tool with none).
            first = next(iter(schema.model_fields), None)
            tool_input = {first: tool_input} if first is not None else {}
        visible = {k: v for k, v in tool_input.items() if k in fields}
        model = schema.model_validate(visible)
        try:
            return json_arguments(model, keyed)
        except InvalidArgumentsError as exc:
            name = next((f for f in sorted(keyed) if not _json_field(model, f)), None)
            if name is None:
                raise
            raise _refused_argument(name, getattr(model, name, None), exc) from exc
    if isinstance(tool_input, str):
        return {"__arg1": tool_input}
    props = schema.get("properties") if isinstance(schema, Mapping) else None
    if isinstance(props, Mapping):
        return {k: v for k, v in tool_input.items() if k in props and k not in hidden}
    return {k: v for k, v in tool_input.items() if k not in hidden}


def _json_field(model: BaseModel, name: str) -> bool:
    try:
        json_arguments(model, {name})
    except InvalidArgumentsError:
        return False
    return True


def _refused_argument(name: str, value: Any, exc: Exception) -> InvalidArgumentsError:
    return InvalidArgumentsError(
        f"argument {name!r} ({type(value).__name__}) has no canonical JSON form ({exc}), so "
        "no idempotency key can be made from it. Pass it as data (ids, not handles), or "
        f"key_exclude=[{name!r}] if the effect does not depend on it"
    )


def by_field_name(args_schema: Any, tool_input: Any) -> Any:
    """``tool_input`` with every argument passed by an alias of ``args_schema`` (``alias``,
    ``validation_alias``, an ``AliasChoices`` choice, an ``AliasPath``'s first step)
    renamed to its field name, as the tool will see it. The model-visible schema LangChain
    derives drops aliases, so the key is made from the field names."""
    if not isinstance(args_schema, type) or not isinstance(tool_input, Mapping):
        return tool_input
    names = _aliases_of(args_schema)
    if not names:
        return tool_input
    renamed = dict(tool_input)
    for key in tool_input:
        name = names.get(key)
        if name is not None and name not in renamed:
            renamed[name] = renamed.pop(key)
    return renamed


@functools.lru_cache(maxsize=1024)
def _model_plan(schema: type[Any], hidden: frozenset[str]) -> tuple[set[str], set[str]] | None:
    """For a pydantic model schema: its field names and those that enter the key (all but
    ``hidden``), read once per schema and hidden set (shared: callers must not mutate
    them); ``None`` for any other class."""
    if not issubclass(schema, BaseModel):
        return None
    fields = _field_set(schema)
    return fields, (fields - hidden if hidden else fields)


@functools.lru_cache(maxsize=1024)
def _field_set(schema: type[BaseModel]) -> set[str]:
    """The field names of a model-visible schema (read once per schema class; shared, so
    callers must not mutate it)."""
    return set(schema.model_fields)


@functools.lru_cache(maxsize=1024)
def _aliases_of(schema: type[Any]) -> dict[str, str] | None:
    """:func:`_field_names_by_alias` of a pydantic model class; ``None`` for any other
    class (read once per class)."""
    if not issubclass(schema, BaseModel):
        return None
    return _field_names_by_alias(schema)


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
    value = configurable.get(SCOPE_CONFIG_KEY)  # an explicit scope first, then the thread
    if value is None or value == "":
        value = configurable.get("thread_id")
        if value is None or value == "":
            return current_scope()
    return str(value)


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
    exclude: Sequence[str] = (),
) -> CallInfo:
    """What one call is; ``inputs`` are its injected inputs (:func:`key_inputs`),
    ``hidden`` the injected parameters that are no model argument, ``exclude`` the
    arguments kept out of the key (``key_exclude``)."""
    try:
        args = visible_arguments(schema, tool_input, hidden.union(exclude) if exclude else hidden)
    except InvalidArgumentsError as exc:
        raise InvalidArgumentsError(f"tool {tool!r}: {exc}") from exc
    inputs = inputs or {}
    configurable = config.get("configurable") or {}
    metadata = config.get("metadata") or {}
    ns = configurable.get("checkpoint_ns") or metadata.get("langgraph_checkpoint_ns")
    ns = ns if isinstance(ns, str) else ""
    node = metadata.get("langgraph_node")
    agent = metadata.get("lc_agent_name")
    # By position (keywords cost a third more, on every call): CallInfo's order.
    return CallInfo(
        tool,
        args,
        _canonical_args(tool, args, exclude),
        namespace,
        _thread_id(config),
        graph_path(ns),
        str(node) if node is not None else None,  # node
        tool_call_id,
        config,
        str(agent) if agent else None,  # agent_name
        ns,  # checkpoint_ns
        parent_call(ns),
        inputs,
        _canonical_inputs(tool, inputs) if inputs else b"{}",
    )


def _canonical_args(tool: str, args: Mapping[str, Any], exclude: Sequence[str]) -> bytes:
    """RFC 8785 bytes of the arguments that enter the key; one with no canonical form is
    refused naming it and the option that keeps it out."""
    keyed = {k: v for k, v in args.items() if k not in exclude} if exclude else args
    try:
        return canonical_json(keyed)
    except InvalidArgumentsError as exc:
        name = next((k for k, v in keyed.items() if not _canonical(v)), None)
        if name is None:
            raise
        raise InvalidArgumentsError(
            f"tool {tool!r}: {_refused_argument(name, keyed[name], exc)}"
        ) from exc


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
    if not (params.values or params.state_fields or params.whole_state or key_state):
        # No injected value, state field or key_state (most tools): the context alone.
        context = run_context(config)
        return {CONTEXT: context} if context is not None and CONTEXT not in exclude else {}
    given = args if isinstance(args, Mapping) else {}
    if state is None:
        state = given_state(params, given)
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


def given_state(params: InjectedParams, args: Any) -> Any:
    """The whole graph state a call hands its tool (a whole ``InjectedState`` argument, a
    ``ToolRuntime``'s ``.state``), or ``None``."""
    if not params.whole_state:
        return None
    given = args if isinstance(args, Mapping) else {}
    for param in params.whole_state:
        value = given.get(param)
        state = getattr(value, "state", None) if param == params.runtime else value
        if state is not None:
            return state
    return None


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
        return explain(call, chosen, _turn_of)
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
    return explain(info, chosen, _turn_of)


def _turn_of(info: CallInfo) -> str | None:
    """The user turn of a call under ``scope="turn"``."""
    return _turn_id(info.config, nested=bool(info.parent_call or "|" in info.graph_path))


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
