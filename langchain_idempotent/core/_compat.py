"""Every touch of LangGraph's msgpack serde internals that the codec (:mod:`._codec`)
relies on, beside it.

Only ``langgraph.checkpoint.serde`` (the ``langgraph-checkpoint`` distribution) is
touched. Its ``_msgpack`` module imports nothing, so building a :class:`~._codec.Codec`
loads no LangChain; ``jsonplus``, which imports ``langchain_core.load``, is imported
late, the first time a value needs LangGraph's own encoding of a leaf type or a stored
``Send`` is rebuilt. ``tests/test_compat.py`` checks each touch below and names the moved
API when a release breaks one.

=================================================  =============================================
touch                                              why
=================================================  =============================================
``jsonplus.EXT_CONSTRUCTOR_SINGLE_ARG`` ... (the   the extension codes a stored value carries,
five ``EXT_*`` codes the codec reads and writes)   pinned here: they are part of the records'
                                                   format, so a LangGraph that renumbered them
                                                   must not change what old records mean
``langgraph.checkpoint.serde._msgpack.``           LangGraph's own allow-list of the types a
``SAFE_MSGPACK_TYPES``                             checkpoint may revive
                                                   (:func:`safe_msgpack_types`)
``jsonplus._msgpack_default``                      LangGraph's encoding of the leaf types it
                                                   knows (UUID, Decimal, Enum, ...)
                                                   (:func:`langgraph_msgpack_default`)
``jsonplus._send_from_args``                       a ``Send`` from its stored arguments, with
                                                   its ``timeout`` (:func:`send_from_args`)
=================================================  =============================================
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "EXT_CONSTRUCTOR_KW_ARGS",
    "EXT_CONSTRUCTOR_POS_ARGS",
    "EXT_CONSTRUCTOR_SINGLE_ARG",
    "EXT_METHOD_SINGLE_ARG",
    "EXT_PYDANTIC_V2",
    "langgraph_msgpack_default",
    "safe_msgpack_types",
    "send_from_args",
]

# LangGraph's extension codes (``langgraph.checkpoint.serde.jsonplus``), which the codec
# also reads and writes; a test checks that LangGraph still uses these numbers.
EXT_CONSTRUCTOR_SINGLE_ARG = 0
EXT_CONSTRUCTOR_POS_ARGS = 1
EXT_CONSTRUCTOR_KW_ARGS = 2
EXT_METHOD_SINGLE_ARG = 3
EXT_PYDANTIC_V2 = 5


def safe_msgpack_types() -> frozenset[tuple[str, str]]:
    """LangGraph's own allow-list of ``(module, name)`` a checkpoint may revive."""
    from langgraph.checkpoint.serde._msgpack import SAFE_MSGPACK_TYPES

    return frozenset((str(m), str(n)) for m, n, *_ in SAFE_MSGPACK_TYPES)


def langgraph_msgpack_default(obj: Any) -> Any:
    """LangGraph's msgpack extension for ``obj`` (UUID, Decimal, Enum, datetime, ...)."""
    from langgraph.checkpoint.serde import jsonplus

    return jsonplus._msgpack_default(obj)


def send_from_args(args: Any) -> Any:
    """A ``Send`` from its stored positional arguments (with its ``timeout``, if any)."""
    from langgraph.checkpoint.serde import jsonplus

    return jsonplus._send_from_args(args)
