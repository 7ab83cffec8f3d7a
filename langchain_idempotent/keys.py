"""Idempotency keys: which calls are "the same effect".

``key = sha256(version, namespace, scope, thread_id, graph path, node, tool, canonical
arguments[, scope part])``, every part length-prefixed so no two tuples collide.

* thread id: ``configurable.idempotency_scope``, else ``configurable.thread_id``, else an
  enclosing :func:`~langchain_idempotent.idempotency_scope`; no thread → ``MissingScopeError``.
* graph path: ``checkpoint_ns`` with the task ids removed (``outer|tools``, never
  ``outer:9dd2…``): task ids change when the LLM step re-runs.
* node: ``metadata.langgraph_node`` (inside a subgraph only the leaf name, hence the path).
* canonical arguments: only the fields of the model-visible schema (injected state, store,
  runtime and call ids never enter the key), validated through that schema, then RFC 8785.

Scopes (what one effect is):

======== ============================================ ======================================
scope    key adds                                     trade-off
======== ============================================ ======================================
thread   nothing (default)                            a deliberate repeat in a later user turn
                                                      is suppressed (replayed)
turn     the id of the last human message             a new user turn may repeat the call
call     the ``tool_call_id`` (arguments leave the    a retry through a re-run LLM step gets a
         key and become the fingerprint)              new id and runs again
function whatever the function returns (the arguments the function decides
         become the fingerprint)
======== ============================================ ======================================

The fingerprint (a hash of tool and canonical arguments) is stored with the record: under
``call`` or a key function, the same key with other arguments is rejected.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel

from .canonical import CANONICAL_VERSION, canonical_json, json_arguments
from .context import current_scope
from .errors import InvalidArgumentsError, MissingScopeError

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig

__all__ = [
    "CallInfo",
    "DerivedKey",
    "KeyFunction",
    "Scope",
    "by_field_name",
    "call_info",
    "derive_key",
    "graph_path",
    "model_schema",
    "visible_arguments",
]

#: What one effect is (see the table above); a :data:`KeyFunction` decides it instead.
Scope = Literal["thread", "turn", "call"]

#: ``configurable`` key that gives a scope explicitly (outside graphs, or to override).
SCOPE_CONFIG_KEY = "idempotency_scope"
#: ``configurable`` key that names the user turn explicitly under ``scope="turn"``.
TURN_CONFIG_KEY = "idempotency_turn"


@dataclass(frozen=True, slots=True)
class CallInfo:
    """Everything known about one tool call; what a key function receives."""

    tool: str
    #: The model-visible arguments, validated through the tool's schema.
    args: Mapping[str, Any]
    canonical_args: bytes
    namespace: str
    thread_id: str | None
    graph_path: str
    node: str | None
    tool_call_id: str | None
    config: RunnableConfig = field(repr=False, compare=False)


#: A user key function: gets the call's :class:`CallInfo`, returns a non-empty string that
#: identifies the effect (the arguments then become the fingerprint).
KeyFunction = Callable[[CallInfo], str]


@dataclass(frozen=True, slots=True)
class DerivedKey:
    key: str
    fingerprint: str
    meta: Mapping[str, str]


def graph_path(checkpoint_ns: str | None) -> str:
    """``"outer:9dd2…|tools:41c5…"`` → ``"outer|tools"``."""
    if not checkpoint_ns:
        return ""
    return "|".join(part.split(":", 1)[0] for part in checkpoint_ns.split("|") if part)


class _SingleInput(dict[str, Any]):
    """The JSON schema LangChain shows the model for a legacy single-input ``Tool``."""


def model_schema(tool: Any) -> Any:
    """What the model fills in for ``tool``: its ``tool_call_schema``; for a legacy
    single-input ``Tool`` (no ``args_schema``) the one string LangChain shows the model as
    ``__arg1`` (such a tool's ``tool_call_schema`` describes its ``_run`` instead)."""
    from langchain_core.tools import Tool

    if isinstance(tool, Tool) and tool.args_schema is None:
        return _SingleInput(
            type="object",
            title=tool.name,
            description=tool.description,
            properties={"__arg1": {"title": "__arg1", "type": "string"}},
            required=["__arg1"],
        )
    return tool.tool_call_schema


def visible_arguments(schema: Any, tool_input: str | Mapping[str, Any]) -> dict[str, Any]:
    """The model-visible arguments, validated and normalised through ``schema``.

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
        fields = schema.model_fields
        if isinstance(tool_input, str):
            # As LangChain does: a string is the first argument (``""`` for a tool with none).
            tool_input = {next(iter(fields)): tool_input} if fields else {}
        visible = {k: v for k, v in tool_input.items() if k in fields}
        return json_arguments(schema.model_validate(visible), set(fields))
    if isinstance(tool_input, str):
        return {"__arg1": tool_input}
    props = schema.get("properties") if isinstance(schema, Mapping) else None
    if isinstance(props, Mapping):
        return {k: v for k, v in tool_input.items() if k in props}
    return dict(tool_input)


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


def _field_names_by_alias(schema: type[BaseModel]) -> dict[str, str]:
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
) -> CallInfo:
    args = visible_arguments(schema, tool_input)
    configurable = config.get("configurable") or {}
    metadata = config.get("metadata") or {}
    ns = configurable.get("checkpoint_ns") or metadata.get("langgraph_checkpoint_ns")
    node = metadata.get("langgraph_node")
    return CallInfo(
        tool=tool,
        args=args,
        canonical_args=canonical_json(args),
        namespace=namespace,
        thread_id=_thread_id(config),
        graph_path=graph_path(ns if isinstance(ns, str) else None),
        node=str(node) if node is not None else None,
        tool_call_id=tool_call_id,
        config=config,
    )


def _digest(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        data = part.encode("utf-8", "surrogatepass") if isinstance(part, str) else part
        h.update(b"%d:" % len(data))
        h.update(data)
    return h.hexdigest()


def derive_key(info: CallInfo, scope: Scope | KeyFunction) -> DerivedKey:
    """The key, fingerprint and record meta for one call under ``scope``."""
    fingerprint = _digest("fp", info.tool, info.canonical_args)[:32]
    meta = {
        "namespace": info.namespace,
        "thread_id": info.thread_id or "",
        "tool": info.tool,
        "node": info.node or "",
        "graph_path": info.graph_path,
    }
    version = f"v{CANONICAL_VERSION}"
    if callable(scope):
        user_key = scope(info)
        if not isinstance(user_key, str) or not user_key:
            raise InvalidArgumentsError(
                f"the key function for tool {info.tool!r} must return a non-empty string, "
                f"got {user_key!r}"
            )
        return DerivedKey(_digest(version, info.namespace, "custom", user_key), fingerprint, meta)
    if info.thread_id is None:
        raise MissingScopeError(
            f"tool {info.tool!r} was called without a thread id, so there is nothing to make "
            "its idempotency key from. Inside LangGraph, compile the graph with a checkpointer "
            "and invoke it with config={'configurable': {'thread_id': ...}}; outside a graph, "
            "wrap the call in `with idempotency_scope('order-123'):` or pass "
            f"config={{'configurable': {{'{SCOPE_CONFIG_KEY}': 'order-123'}}}}"
        )
    base = (
        version,
        info.namespace,
        scope,
        info.thread_id,
        info.graph_path,
        info.node or "",
        info.tool,
    )
    if scope == "thread":
        return DerivedKey(_digest(*base, info.canonical_args), fingerprint, meta)
    if scope == "call":
        if not info.tool_call_id:
            raise MissingScopeError(
                f"tool {info.tool!r} uses scope='call' but was invoked without a tool call id; "
                "invoke it with a ToolCall ({'name', 'args', 'id', 'type': 'tool_call'}) or "
                "use scope='thread'"
            )
        return DerivedKey(_digest(*base, info.tool_call_id), fingerprint, meta)
    turn = _turn_id(info.config)
    if turn is None:
        raise MissingScopeError(
            f"tool {info.tool!r} uses scope='turn' but no user turn was found: the graph "
            "state has no human message; pass config={'configurable': "
            f"{{'{TURN_CONFIG_KEY}': ...}}}} to name the turn"
        )
    return DerivedKey(_digest(*base, info.canonical_args, turn), fingerprint, meta)


def _turn_id(config: RunnableConfig) -> str | None:
    """The id of the last human message in the graph state (or ``idempotency_turn``)."""
    configurable = config.get("configurable") or {}
    explicit = configurable.get(TURN_CONFIG_KEY)
    if explicit is not None:
        return str(explicit)
    from ._compat import graph_state_messages

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
