"""Results as bytes: LangGraph's ``JsonPlusSerializer`` in strict mode, never pickle.

A payload is ``<tag>\\n<data>`` where the tag is the serializer's type (``msgpack``,
``null``, ``bytes``, ``bytearray``) or ``tuple`` for a top-level tuple (``(content,
artifact)``). Only LangGraph's safe types (messages, ``Command``, datetimes, UUIDs, ...)
and the types a user allows are revived; anything else is refused at write time with a
clear error, so a replay always returns what the first run returned. A record whose
payload cannot be decoded raises :class:`CorruptRecordError`; a ``pickle`` tag is refused
outright — decoding never imports or calls user code beyond the allow-list.

Failures (exceptions the user marks terminal) are stored as a small map of the
exception's type, message and string arguments, and re-raised from that on replay.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from pydantic import BaseModel

from .errors import CorruptRecordError, ResultTooLargeError

__all__ = ["DEFAULT_MAX_RESULT_BYTES", "ResultSerializer", "StoredFailure"]

DEFAULT_MAX_RESULT_BYTES = 1 << 20
_TAGS = frozenset({"msgpack", "null", "bytes", "bytearray", "tuple"})


class StoredFailure:
    """A terminal error as stored: ``type`` is ``module:qualname``."""

    __slots__ = ("args", "message", "type")

    def __init__(self, type: str, message: str, args: list[str]) -> None:
        self.type = type
        self.message = message
        self.args = args

    @classmethod
    def of(cls, exc: BaseException) -> StoredFailure:
        t = type(exc)
        return cls(f"{t.__module__}:{t.__qualname__}", str(exc), [str(a) for a in exc.args])

    def rebuild(self, known: Iterable[type[BaseException]]) -> BaseException:
        """The exception to raise on replay: the original class if the user listed it."""
        for cls in known:
            if f"{cls.__module__}:{cls.__qualname__}" == self.type:
                try:
                    return cls(*self.args)
                except Exception:  # the class wants other arguments
                    break
        from langchain_core.tools import ToolException

        return ToolException(f"{self.type.split(':')[-1]}: {self.message} (replayed)")


class ResultSerializer:
    """Encode results and failures for the store; decode them on replay."""

    def __init__(
        self,
        *,
        allowed_types: Iterable[type | tuple[str, str]] = (),
        max_bytes: int = DEFAULT_MAX_RESULT_BYTES,
    ) -> None:
        allowed = [
            t if isinstance(t, tuple) else (t.__module__, t.__qualname__) for t in allowed_types
        ]
        self._serde = JsonPlusSerializer(
            pickle_fallback=False, allowed_msgpack_modules=allowed or None
        )
        self.max_bytes = max_bytes

    # -- results -----------------------------------------------------------------------

    def dumps(self, value: Any, *, key: str | None = None) -> bytes:
        """Encode ``value``; raise if it would not come back as itself or is too large."""
        try:
            tag, data = self._dump(value)
        except Exception as exc:
            raise ValueError(
                f"the tool result of type {type(value).__name__} cannot be stored: {exc}"
            ) from exc
        payload = tag.encode() + b"\n" + data
        if len(payload) > self.max_bytes:
            raise ResultTooLargeError(
                f"the tool result is {len(payload):,} bytes, over max_result_bytes="
                f"{self.max_bytes:,}; return a smaller result (e.g. a reference to the data) "
                "or raise max_result_bytes",
                key=key,
            )
        revived = self._load(tag, data, key)
        # Equal as decoded is the common case; otherwise compare shapes (tuples come back
        # as lists, models and dataclasses compare by type and fields).
        if revived != value and _as_lists(revived) != _as_lists(value):
            raise ValueError(
                f"the tool result of type {type(value).__name__} would not replay as itself "
                "(a type in it is not in the allow-list): pass allowed_types=[YourType] to "
                "idempotent(...) for pydantic models and dataclasses you return"
            )
        return payload

    def _dump(self, value: Any) -> tuple[str, bytes]:
        if type(value) is tuple:
            _, data = self._serde.dumps_typed(list(value))
            return "tuple", data
        tag, data = self._serde.dumps_typed(value)
        if tag not in _TAGS:
            raise ValueError(f"unsupported encoding {tag!r}")
        return tag, data

    def loads(self, payload: bytes | None, *, key: str | None = None) -> Any:
        if payload is None:
            raise CorruptRecordError("the record is completed but holds no payload", key=key)
        tag, sep, data = bytes(payload).partition(b"\n")
        if not sep:
            raise CorruptRecordError("the stored payload has no type tag", key=key)
        return self._load(tag.decode("ascii", "replace"), data, key)

    def _load(self, tag: str, data: bytes, key: str | None) -> Any:
        if tag not in _TAGS:
            raise CorruptRecordError(
                f"refusing to decode a stored payload of type {tag[:40]!r}", key=key
            )
        try:
            if tag == "tuple":
                return tuple(self._serde.loads_typed(("msgpack", data)))
            return self._serde.loads_typed((tag, data))
        except Exception as exc:
            raise CorruptRecordError(
                f"the stored payload cannot be decoded: {exc}", key=key
            ) from exc

    # -- failures ----------------------------------------------------------------------

    def dumps_failure(self, exc: BaseException) -> bytes:
        f = StoredFailure.of(exc)
        doc = {"type": f.type, "message": f.message[:10_000], "args": f.args}
        return b"msgpack\n" + self._serde.dumps_typed(doc)[1]

    def loads_failure(self, payload: bytes | None, *, key: str | None = None) -> StoredFailure:
        doc = self.loads(payload, key=key)
        if (
            not isinstance(doc, dict)
            or not isinstance(doc.get("type"), str)
            or not isinstance(doc.get("message"), str)
        ):
            raise CorruptRecordError("the stored failure is malformed", key=key)
        args = doc.get("args")
        return StoredFailure(
            doc["type"], doc["message"], [str(a) for a in args] if isinstance(args, list) else []
        )


_SCALARS = frozenset({str, int, float, bool, bytes, type(None)})


def _as_lists(value: Any) -> Any:
    """A comparable shape: tuples nested anywhere come back as lists, so compare them as
    lists; models and dataclasses compare by type and fields."""
    if type(value) in _SCALARS:
        return value
    if isinstance(value, tuple | list):
        return [_as_lists(v) for v in value]
    if isinstance(value, dict):
        return {k: _as_lists(v) for k, v in value.items()}
    if isinstance(value, BaseModel):
        return (type(value), {k: _as_lists(getattr(value, k)) for k in type(value).model_fields})
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (
            type(value),
            {f.name: _as_lists(getattr(value, f.name)) for f in dataclasses.fields(value)},
        )
    return value
