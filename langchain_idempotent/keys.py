"""Idempotency keys: which calls are "the same effect".

``key = sha256(version, namespace, scope, thread_id, graph path, node, agent, calling
call, tool, canonical arguments[, scope part])``, every part length-prefixed so no two
tuples collide; :func:`explain_key` shows the parts of one key.

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
  from inside a wrapped tool, deepagents' ``task``), that call's key. A retry of the
  calling call derives the same key, so the sub-agent's effects replay; two calling calls
  (other tools, other arguments) never share one, so two sub-agents never collide.
* canonical arguments: only the fields of the model-visible schema (injected state, store,
  runtime and call ids never enter the key), validated through that schema, then RFC 8785.

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

The fingerprint (a hash of tool and canonical arguments) is stored with the record: under
``call`` or a key function, the same key with other arguments is rejected.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import threading
import warnings
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from ._callinfo import CallInfo, KeyFunction, Scope
from .canonical import CANONICAL_VERSION, canonical_json, json_arguments
from .context import current_scope
from .errors import InvalidArgumentsError, MissingScopeError

#: ``(namespace, custom key)`` → the agent name that first used it, to warn when a key
#: function merges two agents (bounded; per process).
_seen_keys: dict[tuple[str, str], str] = {}
_seen_lock = threading.Lock()
_SEEN_LIMIT = 10_000


class AgentCollisionWarning(UserWarning):
    """A key function gave two agents that the library tells apart the same key."""


if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig

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
    "calling",
    "derive_key",
    "explain_key",
    "graph_path",
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
KEY_VERSION = 2

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
        fields = _field_set(schema)
        if isinstance(tool_input, str):
            # As LangChain does: a string is the first argument (``""`` for a tool with none).
            first = next(iter(schema.model_fields), None)
            tool_input = {first: tool_input} if first is not None else {}
        visible = {k: v for k, v in tool_input.items() if k in fields}
        return json_arguments(schema.model_validate(visible), fields)
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
) -> CallInfo:
    args = visible_arguments(schema, tool_input)
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
    )


def _parent_call(checkpoint_ns: str) -> str | None:
    outer = _calling.get()
    if outer is None or outer[1] == checkpoint_ns:
        return None
    return outer[0]


def _digest(*parts: str | bytes) -> str:
    """SHA-256 over the parts, each as ``<length>:<bytes>`` (hashed in one update)."""
    chunks: list[bytes] = []
    for part in parts:
        data = part.encode("utf-8", "surrogatepass") if isinstance(part, str) else part
        chunks += (b"%d:" % len(data), data)
    return hashlib.sha256(b"".join(chunks)).hexdigest()


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
    fingerprint = _digest("fp", info.tool, info.canonical_args)[:32]
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
    with the ``tool_input`` it is invoked with (a ``ToolCall`` or its arguments) and the
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
    info = call_info(
        tool=call.name,
        schema=model_schema(call),
        tool_input=args,
        tool_call_id=tool_call_id,
        config=config or {},
        namespace=namespace or str(getattr(policy, "namespace", "default")),
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
        named.append(("arguments", info.canonical_args))
    elif scope == "call":
        if not info.tool_call_id:
            raise MissingScopeError(
                f"tool {info.tool!r} uses scope='call' but was invoked without a tool call id; "
                "invoke it with a ToolCall ({'name', 'args', 'id', 'type': 'tool_call'}) or "
                "use scope='thread'"
            )
        named.append(("tool_call_id", info.tool_call_id))
    else:
        turn = _turn_id(info.config, nested=bool(info.parent_call or "|" in info.graph_path))
        if turn is None:
            raise MissingScopeError(
                f"tool {info.tool!r} uses scope='turn' but no user turn was found: the graph "
                "state has no human message; pass config={'configurable': "
                f"{{'{TURN_CONFIG_KEY}': ...}}}} to name the turn"
            )
        named += [("arguments", info.canonical_args), ("turn", turn)]
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
