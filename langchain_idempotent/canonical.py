"""Canonical arguments: the same call always gives the same bytes.

Arguments are first normalised with pydantic (models, dataclasses, enums, datetimes,
UUIDs and decimals become JSON values), then written as RFC 8785 canonical JSON with the
``rfc8785`` package: sorted keys, no whitespace, ECMAScript number form, so
``{"amount": 140}`` and ``{"amount": 140.0}`` are the same call and key order never
matters. Changing this function changes every key, so it is versioned.
"""

from __future__ import annotations

from typing import Any

import rfc8785
from pydantic_core import PydanticSerializationError, to_jsonable_python

from .errors import InvalidArgumentsError

__all__ = ["CANONICAL_VERSION", "canonical_json"]

#: Bumped whenever the canonical form changes (it is part of every key).
CANONICAL_VERSION = 1


def canonical_json(value: Any) -> bytes:
    """RFC 8785 bytes for ``value``. Raises :class:`InvalidArgumentsError` if impossible."""
    try:
        jsonable = to_jsonable_python(value, inf_nan_mode="constants")
    except (PydanticSerializationError, TypeError, ValueError) as exc:
        raise InvalidArgumentsError(
            f"tool arguments are not JSON-serialisable, so no idempotency key can be made: {exc}"
        ) from exc
    try:
        return bytes(rfc8785.dumps(jsonable))
    except rfc8785.CanonicalizationError as exc:
        raise InvalidArgumentsError(
            f"tool arguments have no canonical JSON form ({exc}); NaN, infinities and "
            "integers beyond 2**53 cannot be part of an idempotency key — pass them as strings"
        ) from exc
    except RecursionError as exc:
        raise InvalidArgumentsError("tool arguments are nested too deeply to canonicalise") from exc
