"""The key recipe: which calls are "the same effect", with no framework under it.

``key = sha256(version, namespace, scope, thread_id, graph path, node, agent, calling
call, tool, canonical arguments, inputs[, scope part])``, every part length-prefixed so
no two tuples collide; :func:`explain` shows the parts of one key. What a LangChain or
LangGraph call puts into each part (the :class:`~._callinfo.CallInfo`) is read in
:mod:`..adapters.keys`; the reads a tool makes while it runs and the key of a call whose
reads differ from a stored answer's are :mod:`.reads`.

* version: ``v<canonicaliser>.k<key format>`` (:data:`KEY_VERSION`); changing either
  rule changes every key, so each is versioned.
* thread id, graph path (``checkpoint_ns`` without task ids and call counters), node,
  agent, calling call, tool: :class:`~._callinfo.CallInfo`'s fields.
* canonical arguments and inputs: RFC 8785 bytes (:mod:`.canonical`).

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

import functools
import hashlib
import operator
import threading
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..errors import InvalidArgumentsError, MissingScopeError
from ._callinfo import CallInfo, KeyFunction, Scope
from ._frozen import fast_init
from .canonical import CANONICAL_VERSION

__all__ = [
    "FORMATS",
    "HONOURED_VERSION",
    "KEY_VERSION",
    "AgentCollisionWarning",
    "DerivedKey",
    "KeyExplanation",
    "derive_key",
    "digest",
    "explain",
    "graph_path",
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
#: 4: what the tool reads of the state, the config and ``configurable`` is recorded with
#: its answer; a call whose reads differ is another effect, keyed by the stored key and
#: the digest of its reads (:mod:`.reads`). A record stored under format 3 carries no
#: reads and could be replayed to a call whose reads differ, so the format changes.
KEY_VERSION = 4

#: The earlier key format this release still honours, ``None`` when there is none (0.1.0,
#: the first release, has nothing to honour). The policy (docs/keys.md, "Keys are a
#: contract"): a release that changes the format bumps :data:`KEY_VERSION`, keeps the
#: previous format's recipe in :data:`FORMATS` and names it here, so every call also holds
#: its key under the previous format (:attr:`DerivedKey.previous`) and old and new workers
#: of a rolling deploy run an effect once; the release after it, one retention window
#: later, drops the previous recipe.
HONOURED_VERSION: int | None = None


@functools.cache
def version_part(key_version: int) -> str:
    """The version part of a key of format ``key_version`` (and :data:`CANONICAL_VERSION`)."""
    return f"v{CANONICAL_VERSION}.k{key_version}"


#: The version part of every key (:data:`CANONICAL_VERSION` and :data:`KEY_VERSION`).
VERSION = version_part(KEY_VERSION)

#: ``(namespace, custom key)`` → the agent name that first used it, to warn when a key
#: function merges two agents (bounded; per process: a warning, never an answer).
_seen_keys: dict[tuple[str, str], str] = {}
_seen_lock = threading.Lock()
_SEEN_LIMIT = 10_000


class AgentCollisionWarning(UserWarning):
    """A key function gave two agents that the library tells apart the same key."""


@fast_init
@dataclass(frozen=True, slots=True)
class DerivedKey:
    key: str
    fingerprint: str
    meta: Mapping[str, str]
    #: The same call under :data:`HONOURED_VERSION`'s format, while a release honours one.
    previous: DerivedKey | None = None


@dataclass(frozen=True, slots=True)
class KeyExplanation:
    """Which parts made a key, in the order they are hashed (see :func:`explain`)."""

    key: str
    scope: str
    parts: tuple[tuple[str, str], ...]

    def __str__(self) -> str:
        width = max(len(name) for name, _ in self.parts)
        lines = [f"key    {self.key}", f"scope  {self.scope}"]
        lines += [f"  {name:<{width}}  {value or '(none)'}" for name, value in self.parts]
        return "\n".join(lines)


#: How the ``turn`` scope finds the user turn of a call (the adapters read it from the
#: graph's messages); ``None`` when there is none.
TurnOf = Callable[[CallInfo], "str | None"]


def graph_path(checkpoint_ns: str | None) -> str:
    """``"outer:9dd2…|tools:41c5…"`` → ``"outer|tools"``; ``"billing:9dd2…|1|tools:41c5…"``
    → ``"billing|tools"`` (a call counter is the same subgraph invoked again by a retry)."""
    if not checkpoint_ns:
        return ""
    if "|" not in checkpoint_ns:  # one level (a ToolNode's "tools:<task id>"): no join
        return "" if checkpoint_ns.isdigit() else checkpoint_ns.partition(":")[0]
    return "|".join(
        part.split(":", 1)[0] for part in checkpoint_ns.split("|") if part and not part.isdigit()
    )


#: ``b"<n>:"`` for the lengths most parts have: formatting bytes costs a key more than
#: hashing it (two digests, a dozen parts, on every call).
_LENGTHS = tuple(b"%d:" % n for n in range(256))


#: Short text parts (tool names, namespaces, graph paths, nodes, the version part) as
#: framed bytes: most parts of a key repeat from call to call, and encoding and framing a
#: part costs more than looking it up. Bounded: emptied when full (a thread id per call).
_FRAMED: dict[str, bytes] = {}
_FRAMED_LIMIT = 4096
_FRAMED_LONGEST = 128


def digest(*parts: str | bytes) -> str:
    """SHA-256 over the parts, each as ``<length>:<bytes>`` (hashed in one update; one
    loop, each part framed once, a short text part looked up in :data:`_FRAMED`)."""
    framed: list[bytes] = []
    add = framed.append
    cache = _FRAMED
    for part in parts:
        if type(part) is str:
            known = cache.get(part)
            if known is None:
                known = _framed(part.encode("utf-8", "surrogatepass"))
                if len(part) <= _FRAMED_LONGEST:
                    if len(cache) >= _FRAMED_LIMIT:
                        cache.clear()
                    cache[part] = known
            add(known)
        else:
            data = part if isinstance(part, bytes) else part.encode("utf-8", "surrogatepass")
            n = len(data)
            add(_LENGTHS[n] if n < 256 else b"%d:" % n)
            add(data)
    return hashlib.sha256(b"".join(framed)).hexdigest()


def _framed(data: bytes) -> bytes:
    n = len(data)
    return (_LENGTHS[n] if n < 256 else b"%d:" % n) + data


def derive_key(info: CallInfo, scope: Scope | KeyFunction, turn_of: TurnOf) -> DerivedKey:
    """The key, fingerprint and record meta for one call under ``scope``; ``previous``, the
    same under the honoured earlier format (:data:`HONOURED_VERSION`), if any."""
    derived = _derive(KEY_VERSION, info, scope, turn_of)
    if HONOURED_VERSION is None:
        return derived
    previous = _derive(HONOURED_VERSION, info, scope, turn_of)
    return DerivedKey(derived.key, derived.fingerprint, derived.meta, previous)


def _derive(
    version: int, info: CallInfo, scope: Scope | KeyFunction, turn_of: TurnOf
) -> DerivedKey:
    """One call's key under key format ``version`` (a recipe of :data:`FORMATS`)."""
    key = _key_of(*FORMATS[version](info, scope, turn_of, version_part(version)))
    fingerprint = digest("fp", info.tool, info.canonical_args, info.canonical_inputs)[:32]
    meta = {
        "namespace": info.namespace,
        "thread_id": info.thread_id or "",
        "tool": info.tool,
        "node": info.node or "",
        "graph_path": info.graph_path,
        "agent": info.agent_name or "",
        "parent_call": info.parent_call or "",
        "key_version": str(version),
    }
    return DerivedKey(key, fingerprint, meta)


def explain(info: CallInfo, scope: Scope | KeyFunction, turn_of: TurnOf) -> KeyExplanation:
    """Which parts made ``info``'s key under ``scope``, in the order they are hashed."""
    name, named = FORMATS[KEY_VERSION](info, scope, turn_of, VERSION)
    key = _key_of(name, named)
    parts = tuple(
        (part, value.decode("utf-8", "replace") if isinstance(value, bytes) else value)
        for part, value in named
    )
    return KeyExplanation(key, name, parts)


def _key_parts(
    info: CallInfo, scope: Scope | KeyFunction, turn_of: TurnOf, version: str
) -> tuple[str, list[tuple[str, str | bytes]]]:
    """Key format 4: the scope's name and the named parts of the key, in the order they are
    hashed (``version``, its version part, first); the text of an explanation is built from
    them only when one is asked for."""
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
        turn = turn_of(info)
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


#: A key format's recipe: the scope's name and the named parts, given the version part.
Recipe = Callable[
    [CallInfo, "Scope | KeyFunction", TurnOf, str], tuple[str, list[tuple[str, "str | bytes"]]]
]

#: Key format -> its recipe: today's, and the one :data:`HONOURED_VERSION` names, if any.
FORMATS: dict[int, Recipe] = {4: _key_parts}


_second = operator.itemgetter(1)


def _key_of(scope: str, named: list[tuple[str, str | bytes]]) -> str:
    """The key hashed from :func:`_key_parts` (a custom key hashes its marker too)."""
    if scope == "custom":
        (_, version), (_, namespace), (_, user_key) = named
        return digest(version, namespace, "custom", user_key)
    return digest(*map(_second, named))


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
