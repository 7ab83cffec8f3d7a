"""What the policy and a key function know of one tool call, with no framework under it.

:class:`CallInfo`, :data:`Scope` and :data:`KeyFunction` are the vocabulary the policy
(:mod:`.policy`: ``scope=``, ``approval=``) shares with the adapters' key derivation
(:mod:`..adapters.keys`, which builds a :class:`CallInfo` from a LangChain call and re-exports
these three). Here, below both, so the policy and the engine stand on no LangChain
module; ``RunnableConfig`` is named for type checkers only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ._frozen import fast_init

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig

__all__ = ["CallInfo", "KeyFunction", "Scope"]

#: What one effect is (see :mod:`..adapters.keys`); a :data:`KeyFunction` decides it instead.
Scope = Literal["thread", "turn", "call"]


@fast_init
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
    #: The innermost named agent (``metadata["lc_agent_name"]``), if any.
    agent_name: str | None = None
    #: ``checkpoint_ns`` as LangGraph gave it (task ids and counters included).
    checkpoint_ns: str = ""
    #: The key of the memoized call this call runs inside (a sub-agent's caller), if any.
    parent_call: str | None = None
    #: The inputs the model does not send that enter the key (``keys.key_inputs``):
    #: ``{"args": {...}, "state": {...}, "context": ...}``, each part only when present.
    inputs: Mapping[str, Any] = field(default_factory=dict)
    canonical_inputs: bytes = b"{}"


#: A user key function: gets the call's :class:`CallInfo`, returns a non-empty string that
#: identifies the effect (the arguments then become the fingerprint).
KeyFunction = Callable[[CallInfo], str]
