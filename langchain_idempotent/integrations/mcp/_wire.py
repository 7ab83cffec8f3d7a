"""What travels on the wire between our MCP client and server: names, checks, errors.

Both sides share this module, so a key the client sends is read by the server the same
way, and an error the server answers is mapped by the client to the same exception.

Where the key travels (``tools/call`` request):

- ``params._meta["<prefix>key"]``, ``"<prefix>fence"``, ``"<prefix>attempt"``: one
  reverse-DNS ``_meta`` prefix (:data:`META_PREFIX` by default). ``_meta`` reaches the
  server on every transport (stdio, streamable HTTP) and on a live session.
- ``params.idempotencyKey``: SEP-3182's field, sent when the server advertises
  ``capabilities.tools.idempotency``.
- the ``Idempotency-Key`` HTTP header: only on HTTP transports with a fresh session per
  call (the adapters drop headers over stdio and on a live session, so the client
  refuses ``via="header"`` there).

Errors (JSON-RPC errors whose ``error.data.type`` says what happened; SEP-3182's two
types, and ours for the rest)::

    idempotency_key_conflict      the key was used with other arguments  -> PayloadMismatchError
    idempotency_key_in_progress   another call with the key is running   -> InProgressError
    idempotency_key_invalid       the key is not a string, empty or too long
    idempotency_key_required      the tool requires a key and none came
    idempotency_store_unavailable the server's store is down; the tool did not run
                                                                         -> StoreUnavailableError
    idempotency_outcome_unknown   a previous run died after its effect   -> OutcomeUnknownError
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final, Literal

from ...errors import (
    IdempotencyError,
    InProgressError,
    OutcomeUnknownError,
    PayloadMismatchError,
    StoreUnavailableError,
)

#: Our ``_meta`` prefix (reverse DNS, ``/``-terminated, outside MCP's reserved prefixes).
META_PREFIX: Final = "dev.langchain-idempotent/"
#: The ``capabilities.tools`` field a server sets to say it deduplicates by key (SEP-3182).
CAPABILITY: Final = "idempotency"
#: The ``capabilities.extensions`` entry (SEP-2133) a server sets too: mcp 2's
#: ``ToolsCapability`` drops unknown fields, so ``tools.idempotency`` does not reach the
#: wire there.
EXTENSION: Final = META_PREFIX + "idempotency"
#: The HTTP header for ``via="header"`` (the IETF draft's name).
HEADER: Final = "Idempotency-Key"
#: The longest key accepted (SEP-3182 and the IETF draft leave it to the server; Stripe
#: accepts 255 characters).
MAX_KEY_LENGTH: Final = 255

Via = Literal["meta", "params", "header"]
_VIAS: Final = ("meta", "params", "header")

_LABEL = re.compile(r"^[A-Za-z](?:[A-Za-z0-9-]*[A-Za-z0-9])?$")
_RESERVED_LABELS: Final = ("modelcontextprotocol", "mcp")


def check_via(via: object) -> Via:
    if via not in _VIAS:
        raise ValueError(f"via must be one of {', '.join(map(repr, _VIAS))}, got {via!r}")
    return via  # type: ignore[return-value]


def check_prefix(prefix: object) -> str:
    """A valid, unreserved ``_meta`` prefix (``"com.example/"``), or a ``ValueError``.

    MCP reserves prefixes with a ``modelcontextprotocol`` or ``mcp`` label followed by
    another (``modelcontextprotocol.io/``, ``tools.mcp.com/``) and uses
    ``io.modelcontextprotocol/`` itself; any prefix with such a label is refused."""
    if not isinstance(prefix, str) or not prefix.endswith("/") or len(prefix) < 2:
        raise ValueError(
            f"the _meta prefix must be a reverse-DNS name ending in '/', like {META_PREFIX!r}; "
            f"got {prefix!r}"
        )
    labels = prefix[:-1].split(".")
    bad = [label for label in labels if not _LABEL.match(label)]
    if bad:
        raise ValueError(
            f"the _meta prefix {prefix!r} has invalid label(s) {bad}: each label starts with "
            "a letter, ends with a letter or digit, and has only letters, digits and '-'"
        )
    for i, label in enumerate(labels):
        if label.lower() in _RESERVED_LABELS:
            raise ValueError(
                f"the _meta prefix {prefix!r} is reserved by MCP (its label {labels[i]!r}); "
                f"use your own reverse-DNS name, like {META_PREFIX!r}"
            )
    return prefix


def check_key(key: object) -> str:
    """The key if it is a usable idempotency key; a ``ValueError`` that names the fault."""
    if not isinstance(key, str):
        raise ValueError(f"the idempotency key must be a string, got {type(key).__name__}")
    if not key:
        raise ValueError("the idempotency key must not be empty")
    if len(key) > MAX_KEY_LENGTH:
        raise ValueError(
            f"the idempotency key is {len(key)} characters long; at most {MAX_KEY_LENGTH} "
            "are accepted"
        )
    if not key.isprintable():
        raise ValueError("the idempotency key must contain only printable characters")
    return key


ErrorType = Literal[
    "idempotency_key_conflict",
    "idempotency_key_in_progress",
    "idempotency_key_invalid",
    "idempotency_key_required",
    "idempotency_store_unavailable",
    "idempotency_outcome_unknown",
]


def error_data(kind: ErrorType, **extra: Any) -> dict[str, Any]:
    """The ``error.data`` of a JSON-RPC error answered for an idempotent call."""
    return {"type": kind, **extra}


_ERRORS: Final[Mapping[str, type[IdempotencyError]]] = {
    "idempotency_key_conflict": PayloadMismatchError,
    "idempotency_key_in_progress": InProgressError,
    "idempotency_store_unavailable": StoreUnavailableError,
    "idempotency_outcome_unknown": OutcomeUnknownError,
}


def error_for(data: object, message: str, key: str) -> IdempotencyError | None:
    """Our exception for an MCP error's ``data`` (``None`` if it is not one of ours)."""
    if not isinstance(data, Mapping):
        return None
    cls = _ERRORS.get(str(data.get("type")))
    if cls is None:
        return None
    return cls(f"the MCP server answered: {message}", key=key)
