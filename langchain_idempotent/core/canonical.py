"""Canonical arguments: the same call always gives the same bytes.

Arguments are first normalised with pydantic (models, dataclasses, enums, datetimes,
UUIDs and decimals become JSON values), then written as RFC 8785 canonical JSON with the
``rfc8785`` package: sorted keys, no whitespace, ECMAScript number form, so
``{"amount": 140}`` and ``{"amount": 140.0}`` are the same call and key order never
matters. Changing this function changes every key, so it is versioned.
"""

from __future__ import annotations

import math
from typing import Any

import rfc8785
from pydantic import BaseModel
from pydantic_core import PydanticSerializationError, to_jsonable_python

from ..errors import InvalidArgumentsError

__all__ = ["CANONICAL_VERSION", "canonical_json", "json_arguments"]

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


def json_arguments(model: BaseModel, fields: set[str]) -> dict[str, Any]:
    """The validated arguments as JSON values; :class:`InvalidArgumentsError` if they have
    no canonical form (not serialisable, nested too deeply, NaN or an infinity anywhere).

    Pydantic's JSON mode writes a NaN or an infinity under an ``Any`` field as ``null``,
    which would give ``[nan]`` and ``[None]`` one key: they are refused instead.
    """
    try:
        _refuse_non_finite(model.model_dump(mode="python", include=fields))
        return model.model_dump(mode="json", include=fields)
    except InvalidArgumentsError:
        raise
    except (PydanticSerializationError, ValueError, RecursionError) as exc:
        raise InvalidArgumentsError(
            f"tool arguments have no canonical JSON form, so no idempotency key can be made: {exc}"
        ) from exc


def _refuse_non_finite(value: Any) -> None:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise InvalidArgumentsError(
                f"tool arguments contain {item!r}, which has no canonical JSON form; NaN and "
                "infinities cannot be part of an idempotency key — pass them as strings"
            )
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple | set | frozenset):
            stack.extend(item)
