"""Results as bytes: LangGraph's ``JsonPlusSerializer`` in strict mode, never pickle.

A payload is ``<tag>\\n<data>`` where the tag is the serializer's type (``msgpack``,
``null``, ``bytes``, ``bytearray``) or ``tuple`` for a top-level tuple (``(content,
artifact)``). Only LangGraph's safe types (messages, ``Command``, datetimes, UUIDs, ...)
and the types a user allows (enums, pydantic models, dataclasses) are revived.

Every result is decoded once at write time and compared with the original *by type and
value*, all the way down: a ``str``-``Enum`` member that would come back as a plain
``str`` is refused, as is anything else that would not replay as itself (nested tuples
are the one tolerated change: they come back as lists). ``NaN`` and infinities are stored
and replay as themselves. A refused result raises :class:`UnstorableResultError` (or
:class:`ResultTooLargeError`), whose message names our option (``allowed_types=``) and,
when the key is known, the command that clears the record; LangGraph's own "Blocked
deserialization" log line for that trial decode is kept out of the logs. The engine stores
the error in the result's place, and :meth:`StoredFailure.rebuild` raises it again, same
type and message, on every replay.

A record whose payload cannot be decoded raises :class:`CorruptRecordError`; a ``pickle``
tag is refused outright — decoding never imports or calls user code beyond the allow-list.

Failures (exceptions the user marks terminal) are stored as a small map of the
exception's type, message and string arguments, and re-raised from that on replay.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from decimal import Decimal
from enum import Enum
from typing import Any

from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from pydantic import BaseModel

from ._limits import DEFAULT_MAX_RESULT_BYTES
from .errors import CorruptRecordError, ResultTooLargeError, UnstorableResultError

__all__ = ["DEFAULT_MAX_RESULT_BYTES", "ResultSerializer", "StoredFailure"]

_TAGS = frozenset({"msgpack", "null", "bytes", "bytearray", "tuple"})

#: Our own errors that the engine stores in place of a result, by stored type name.
_UNSTORABLE: dict[str, type[UnstorableResultError]] = {
    f"{cls.__module__}:{cls.__qualname__}": cls
    for cls in (UnstorableResultError, ResultTooLargeError)
}

# -- LangGraph's advice stays out of our refusals ----------------------------------------
# Decoding a type outside the allow-list makes LangGraph log "Blocked deserialization of
# ... Add to allowed_msgpack_modules", naming its setting. During the trial decode at write
# time the refusal is ours to explain (it names ``allowed_types=``), so that line is
# dropped, in this thread or task only.

_trial_decode: ContextVar[bool] = ContextVar("langchain_idempotent_trial_decode", default=False)


class _DropBlockedWarningDuringTrial(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (_trial_decode.get() and str(record.msg).startswith("Blocked deserialization"))


logging.getLogger("langgraph.checkpoint.serde.jsonplus").addFilter(_DropBlockedWarningDuringTrial())


@contextmanager
def _trial() -> Iterator[None]:
    token = _trial_decode.set(True)
    try:
        yield
    finally:
        _trial_decode.reset(token)


class StoredFailure:
    """A stored failure: ``type`` is ``module:qualname``; ``key`` is the record's key."""

    __slots__ = ("args", "key", "message", "type")

    def __init__(self, type: str, message: str, args: list[str], key: str | None = None) -> None:
        self.type = type
        self.message = message
        self.args = args
        self.key = key

    @classmethod
    def of(cls, exc: BaseException) -> StoredFailure:
        t = type(exc)
        return cls(f"{t.__module__}:{t.__qualname__}", str(exc), [str(a) for a in exc.args])

    def rebuild(self, known: Iterable[type[BaseException]]) -> BaseException:
        """The exception to raise on replay.

        A refused result replays as the same :class:`UnstorableResultError` (same class,
        message and key) its first caller got; a terminal failure as the original class if
        the user listed it in ``known``; anything else as a ``ToolException``.
        """
        unstorable = _UNSTORABLE.get(self.type)
        if unstorable is not None:
            return unstorable(self.message, key=self.key)
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
        """Encode ``value``; raise :class:`UnstorableResultError` if it would not come back
        as itself (by type and value) and :class:`ResultTooLargeError` if it is too large."""
        try:
            tag, data = self._dump(value)
        except Exception as exc:
            raise _refusal(
                UnstorableResultError,
                f"the tool result of type {type(value).__name__} cannot be stored: {exc}",
                key,
            ) from exc
        payload = tag.encode() + b"\n" + data
        if len(payload) > self.max_bytes:
            raise _refusal(
                ResultTooLargeError,
                f"the tool result is {len(payload):,} bytes, over max_result_bytes="
                f"{self.max_bytes:,}; return a smaller result (e.g. a reference to the data) "
                "or raise max_result_bytes",
                key,
            )
        try:
            with _trial():
                revived = self._load(tag, data, key)
        except CorruptRecordError as exc:
            raise _refusal(
                UnstorableResultError,
                f"the tool result of type {type(value).__name__} cannot be stored: "
                f"it would not decode ({exc})",
                key,
            ) from exc
        problem = _difference(value, revived, "result")
        if problem is not None:
            raise _refusal(
                UnstorableResultError, f"the tool result would not replay as itself: {problem}", key
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
            doc["type"],
            doc["message"],
            [str(a) for a in args] if isinstance(args, list) else [],
            key=key,
        )


def _refusal(
    cls: type[UnstorableResultError], cause: str, key: str | None
) -> UnstorableResultError:
    """The error for a refused result; with a key, it says what happens to that record."""
    if key is None:
        return cls(cause, key=None)
    return cls(
        f"{cause}. The tool ran, so this error is stored in place of its result: every retry "
        f"with key {key} gets it, without running the tool again, until the record expires "
        f"or is deleted with `langchain-idempotent delete {key}` (changing allowed_types or "
        "max_result_bytes alone does not clear it)",
        key=key,
    )


# -- the round-trip check ----------------------------------------------------------------


def _difference(before: Any, after: Any, where: str) -> str | None:
    """How ``after`` (the decoded copy) differs from ``before`` by type or value, or
    ``None`` if it replays as itself. Nested tuples may come back as lists (msgpack has
    one array type); float and ``Decimal`` NaNs count as equal to themselves."""
    if type(before) is tuple and type(after) is list and where != "result":
        before = list(before)
    if type(after) is not type(before):
        return _type_changed(before, after, where)
    if isinstance(before, float):
        same = before == after or (math.isnan(before) and math.isnan(after))
        return None if same else _value_changed(before, where)
    if isinstance(before, Decimal):
        return None if before.compare_total(after) == 0 else _value_changed(before, where)
    if isinstance(before, list | tuple):
        if len(before) != len(after):
            return f"{where} has {len(before)} items but would replay with {len(after)}"
        return _first(
            _difference(b, a, f"{where}[{i}]")
            for i, (b, a) in enumerate(zip(before, after, strict=True))
        )
    if isinstance(before, dict):
        if len(before) != len(after):
            return f"{where} has {len(before)} keys but would replay with {len(after)}"
        return _first(
            _key_difference(bk, ak, where) or _difference(bv, av, f"{where}[{bk!r}]")
            for (bk, bv), (ak, av) in zip(before.items(), after.items(), strict=True)
        )
    if isinstance(before, BaseModel):
        fields = [*type(before).model_fields, *(before.model_extra or {})]
        return _first(
            _difference(getattr(before, f), getattr(after, f, None), f"{where}.{f}") for f in fields
        )
    if dataclasses.is_dataclass(before):
        return _first(
            _difference(getattr(before, f.name), getattr(after, f.name), f"{where}.{f.name}")
            for f in dataclasses.fields(before)
        )
    if isinstance(before, set | frozenset) and sorted(map(_type_name, before)) != sorted(
        map(_type_name, after)
    ):
        return f"{where} holds items whose types would change"
    try:
        same = bool(before == after)
    except Exception:
        same = False
    return None if same else _value_changed(before, where)


def _first(problems: Iterable[str | None]) -> str | None:
    return next((p for p in problems if p is not None), None)


def _key_difference(before: Any, after: Any, where: str) -> str | None:
    if type(after) is type(before):
        return _difference(before, after, f"a key of {where}")
    # msgpack writes str and int subclasses (str-Enum members too) as plain map keys.
    return (
        f"the key {before!r} of {where} ({_type_name(before)}) would replay as "
        f"{_type_name(after)}; use plain str or int keys"
    )


def _type_changed(before: Any, after: Any, where: str) -> str:
    was = type(before)
    problem = f"{where} ({_type_name(before)}) would replay as {_type_name(after)}"
    if issubclass(was, Enum | BaseModel) or dataclasses.is_dataclass(was):
        return (
            f"{problem}; pass allowed_types=[{was.__name__}] to idempotent(...) "
            "(enums, pydantic models and dataclasses a tool returns must be allowed)"
        )
    if issubclass(was, dict | list | tuple | str | bytes | int | float):
        return f"{problem}; return a plain dict, list, str or number, or an allowed type"
    return problem


def _value_changed(before: Any, where: str) -> str:
    return f"{where} ({_type_name(before)}) would replay as a different value"


def _type_name(value: Any) -> str:
    t = type(value)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
