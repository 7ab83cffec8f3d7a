"""Canonical arguments: the same call always gives the same bytes.

Arguments are first normalised with pydantic (models, dataclasses, enums, datetimes,
UUIDs and decimals become JSON values), then written as RFC 8785 canonical JSON with the
``rfc8785`` package: sorted keys, no whitespace, ECMAScript number form, so
``{"amount": 140}`` and ``{"amount": 140.0}`` are the same call and key order never
matters. Changing this function changes every key, so it is versioned.

Most tool arguments are already plain JSON: strings, safe integers, booleans, ``None``,
lists and objects with string keys. For those, RFC 8785's bytes are exactly what the
standard library's C encoder writes with sorted keys and no whitespace (the same escapes;
sorting by code point equals sorting by UTF-16 code unit while no key holds a character
beyond U+FFFF), so :func:`canonical_json` takes that path and leaves everything else —
floats, big integers, other types, lone surrogates — to pydantic and ``rfc8785``. A
property test holds the two paths to the same bytes (``tests/test_keys.py``).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable
from typing import Any

import rfc8785
from pydantic import BaseModel, RootModel
from pydantic_core import PydanticSerializationError, to_jsonable_python

from ..errors import InvalidArgumentsError

__all__ = ["CANONICAL_VERSION", "canonical_json", "json_arguments"]

#: Bumped whenever the canonical form changes (it is part of every key).
CANONICAL_VERSION = 1


def canonical_json(value: Any) -> bytes:
    """RFC 8785 bytes for ``value``. Raises :class:`InvalidArgumentsError` if impossible."""
    if _plain(value, 0):
        try:
            return _PLAIN(value).encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: rfc8785 refuses it with its reason
            pass
    return _general(value)


def _general(value: Any) -> bytes:
    """RFC 8785 bytes of any value pydantic can make JSON of (the path of every value
    that is not plain)."""
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


def _plain_encoder() -> Callable[[Any], str]:
    """The encoder of plain values: sorted keys, no whitespace, characters as they are.
    The C encoder made once (``JSONEncoder.encode`` makes one per call) when it writes a
    sample as ``rfc8785`` does, else the standard encoder."""
    standard = json.JSONEncoder(
        ensure_ascii=False,
        check_circular=False,
        allow_nan=False,
        sort_keys=True,
        separators=(",", ":"),
    ).encode
    # The C parts behind ``JSONEncoder`` (typeshed does not list them).
    make = getattr(json.encoder, "c_make_encoder", None)
    escape = getattr(json.encoder, "c_encode_basestring", None)
    if make is None or escape is None:  # pragma: no cover - CPython always has _json
        return standard
    try:
        chunks = make(None, None, escape, None, ":", ",", True, False, False)

        def encode(value: Any) -> str:
            return "".join(chunks(value, 0))

        sample = {"b": [1, None, True], "a": '\n\x01"é'}
        if encode(sample) != rfc8785.dumps(sample).decode():  # pragma: no cover
            return standard
    except (TypeError, ValueError):  # pragma: no cover - its signature changed
        return standard
    return encode


_PLAIN = _plain_encoder()
_SAFE = 2**53 - 1  # RFC 8785's integer domain: an IEEE 754 double's exact integers
_DEPTH = 64  # deeper values take the general path (which refuses what is too deep)


def _plain(value: Any, depth: int) -> bool:
    """Whether ``value`` is plain JSON that the fast path writes exactly as RFC 8785 does:
    ``str``, ``bool``, ``None``, an ``int`` within ±(2**53 - 1), and lists and dicts of
    them whose keys are strings with no character beyond U+FFFF (exact types only)."""
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return True
    if kind is int:
        return bool(-_SAFE <= value <= _SAFE)
    if depth >= _DEPTH:
        return False
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str or not (key.isascii() or max(key) <= "\uffff"):
                return False
            kind = type(item)  # a scalar is checked here, without a call (most arguments)
            if kind is str or kind is bool or item is None:
                continue
            if kind is int:
                if -_SAFE <= item <= _SAFE:
                    continue
                return False
            if not _plain(item, depth + 1):
                return False
        return True
    if kind is list:
        return all(_plain(item, depth + 1) for item in value)
    return False


def json_arguments(model: BaseModel, fields: set[str]) -> dict[str, Any]:
    """The validated arguments as JSON values; :class:`InvalidArgumentsError` if they have
    no canonical form (not serialisable, nested too deeply, NaN or an infinity anywhere).

    Pydantic's JSON mode writes a NaN or an infinity under an ``Any`` field as ``null``,
    which would give ``[nan]`` and ``[None]`` one key: they are refused instead.

    Most arguments are strings, safe integers, booleans and ``None`` of a model that
    serialises its fields as they are (:func:`_dumps_as_is`): those values are their own
    JSON form, taken as they are, with no dump (the two dumps below cost a tenth of a key).
    """
    order = _dumps_as_is(type(model))
    if order is not None:
        values = model.__dict__
        scalars = {name: values[name] for name in order if name in fields}
        for value in scalars.values():
            kind = type(value)
            if not (
                kind is str
                or kind is bool
                or value is None
                or (kind is int and -_SAFE <= value <= _SAFE)
            ):
                break
        else:
            return scalars
    try:
        _refuse_non_finite(model.model_dump(mode="python", include=fields))
        return model.model_dump(mode="json", include=fields)
    except InvalidArgumentsError:
        raise
    except (PydanticSerializationError, ValueError, RecursionError) as exc:
        raise InvalidArgumentsError(
            f"tool arguments have no canonical JSON form, so no idempotency key can be made: {exc}"
        ) from exc


@functools.lru_cache(maxsize=1024)
def _dumps_as_is(cls: type[BaseModel]) -> tuple[str, ...] | None:
    """The field names of ``cls`` in order when its ``model_dump`` writes a field's plain
    value (a ``str``, ``int``, ``bool`` or ``None``) as it is in both modes, keyed by the
    field's name; ``None`` when anything may change it: a custom serializer anywhere in its
    schema (``field_serializer``, ``PlainSerializer``, ``model_serializer``), an excluded
    field, aliases in dumps, a root model or an overridden ``model_dump``."""
    if cls.model_dump is not BaseModel.model_dump or issubclass(cls, RootModel):
        return None
    if cls.model_config.get("serialize_by_alias"):
        return None
    fields = cls.model_fields
    for info in fields.values():
        if info.exclude or getattr(info, "exclude_if", None) is not None:
            return None
    try:
        schema = cls.__pydantic_core_schema__
        if not isinstance(schema, dict) or _has_serialization(schema):
            return None
    except Exception:  # a schema not built yet: take the dumps
        return None
    return tuple(fields)


def _has_serialization(node: Any) -> bool:
    """Whether a core schema names a serialization of its own anywhere."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if "serialization" in item:
                return True
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return False


#: The containers :func:`_refuse_non_finite` looks into besides ``dict`` (a tuple of types:
#: ``isinstance`` with a ``X | Y`` union costs several times more, on every call's key).
_SEQUENCES = (list, tuple, set, frozenset)


def _refuse_non_finite(value: Any) -> None:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                raise InvalidArgumentsError(
                    f"tool arguments contain {item!r}, which has no canonical JSON form; NaN "
                    "and infinities cannot be part of an idempotency key — pass them as strings"
                )
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, _SEQUENCES):
            stack.extend(item)
