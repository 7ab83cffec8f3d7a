"""Results as bytes: LangGraph's msgpack encoding, decoded strictly, never pickle.

A payload is ``<tag>\\n<data>`` where the tag is ``msgpack``, ``null``, ``bytes`` or
``bytearray`` (``tuple`` in records written before tuples had an extension of their
own). The codec (:mod:`._codec`) writes LangGraph's ``JsonPlusSerializer`` extensions plus
four of ours (tuples, zoned datetimes, plain objects, pydantic models by field) and reads
back only the types on the allow-list: LangGraph's safe types (messages, ``Command``,
datetimes, UUIDs, ...) and the ones a user allows (``allowed_types=``: enums, pydantic
models, dataclasses, plain classes).

One rule: a replay returns the same type and value as the first answer, all the way down,
or the first call is refused. Every result is decoded once at write time and compared with
the original *by type and value* (``tuple`` is not ``list``, a ``ZoneInfo`` is not its
offset, ``NaN`` is itself). A refused result raises :class:`UnstorableResultError` (or
:class:`ResultTooLargeError`), whose message names our option (``allowed_types=``) and,
when the key is known, the command that clears the record. The engine stores the error in
the result's place, and :meth:`StoredFailure.rebuild` raises it again, same type and
message, on every replay.

A record that does not decode as what was stored — a type missing from this worker's
``allowed_types`` (a rolling deploy, a renamed class), a constructor outside the allow-list
(a tampered record), a malformed payload, a ``pickle`` tag — raises
:class:`CorruptRecordError` naming the type, the key, the option and ``langchain-idempotent
delete KEY``; never a ``dict`` or a bare inner argument, and no code outside the allow-list
runs.

Failures (exceptions the user marks terminal) are stored as a small map of the
exception's type, message and string arguments, and re-raised from that on replay.

With ``encryption=`` (a :class:`~.encryption.ResultEncryption`) every payload written is
sealed whole, tag line and all, under the primary key as ``aesgcm1\n<sealed>``, bound to
the record's key, the namespace and whether it is a result or a failure; a payload read
must open under one of the keys (or be plaintext while ``accept_plaintext`` is on), else it
is a :class:`CorruptRecordError` naming the key and the key id. The stores never see
anything but bytes.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import functools
import math
from collections.abc import Iterable
from decimal import Decimal
from enum import Enum
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from ..errors import CorruptRecordError, ResultTooLargeError, UnstorableResultError
from ._codec import Codec, Refused, is_plain
from ._limits import DEFAULT_MAX_RESULT_BYTES
from .encryption import TAG as _SEALED
from .encryption import Kind, sealed_key_id

if TYPE_CHECKING:
    from .encryption import ResultEncryption

__all__ = ["DEFAULT_MAX_RESULT_BYTES", "ResultSerializer", "StoredFailure"]

_TAGS = frozenset({"msgpack", "null", "bytes", "bytearray", "tuple"})

#: Our own errors that the engine stores in place of a result, by stored type name.
_UNSTORABLE: dict[str, type[UnstorableResultError]] = {
    f"{cls.__module__}:{cls.__qualname__}": cls
    for cls in (UnstorableResultError, ResultTooLargeError)
}


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
    """Encode results and failures for the store; decode them on replay.

    ``encryption`` seals every payload (see the module docstring); ``namespace`` is the
    policy's, bound into each sealed payload with the record's key."""

    def __init__(
        self,
        *,
        allowed_types: Iterable[type | tuple[str, str]] = (),
        max_bytes: int = DEFAULT_MAX_RESULT_BYTES,
        encryption: ResultEncryption | None = None,
        namespace: str = "default",
    ) -> None:
        self._codec = Codec(allowed_types)
        self.max_bytes = max_bytes
        self.encryption = encryption
        self.namespace = namespace

    # -- sealing -----------------------------------------------------------------------

    def _seal(self, payload: bytes, kind: Kind, key: str | None) -> bytes:
        if self.encryption is None:
            return payload
        if key is None:
            raise ValueError("an encrypted payload is bound to its record: pass key=")
        data = self.encryption.seal(payload, kind=kind, key=key, namespace=self.namespace)
        return _SEALED.encode() + b"\n" + data

    def _unseal(
        self, payload: bytes, kind: Kind, key: str | None, namespace: str | None = None
    ) -> bytes:
        """The plaintext payload of a stored one: opened if sealed, refused if it should
        have been. ``namespace``: the one it must be bound to (default this serializer's)."""
        tag, _, data = payload.partition(b"\n")
        sealed = tag == _SEALED.encode()
        if self.encryption is None:
            if sealed:
                named = sealed_key_id(data)
                key_id = f" under key id {named[0]!r}" if named else ""
                raise CorruptRecordError(
                    f"the stored {kind} of key {key} is encrypted{key_id}, and no "
                    "encryption= keys are configured here: pass encryption=ResultEncryption"
                    "(...) (or set IDEMPOTENCY_ENCRYPTION_KEYS) on every worker that replays "
                    "it; the tool did not run",
                    key=key,
                )
            return payload
        if not sealed:
            if self.encryption.accept_plaintext:
                return payload
            raise self.encryption.plaintext_refused(kind, key)
        ns = self.namespace if namespace is None else namespace
        return self.encryption.open(data, kind=kind, key=key, namespace=ns)

    def reseal(self, payload: bytes, *, kind: Kind, key: str) -> bytes | None:
        """``payload`` (as stored) sealed under the primary key, or ``None`` when it already
        is. The namespace is the one its header names (bound, so a changed one does not
        open); a plaintext payload is sealed under this serializer's namespace.
        :class:`CorruptRecordError` when it does not open. For ``langchain-idempotent
        rotate``."""
        if self.encryption is None:
            raise ValueError("rotating needs encryption keys")
        tag, _, data = payload.partition(b"\n")
        namespace = self.namespace
        if tag == _SEALED.encode():
            named = sealed_key_id(data)
            if named is not None:
                if named[0] == self.encryption.primary:
                    return None
                namespace = named[1]
            plain = self.encryption.open(data, kind=kind, key=key, namespace=namespace)
        elif self.encryption.accept_plaintext:
            plain = payload
        else:
            raise self.encryption.plaintext_refused(kind, key)
        sealed = self.encryption.seal(plain, kind=kind, key=key, namespace=namespace)
        return _SEALED.encode() + b"\n" + sealed

    # -- results -----------------------------------------------------------------------

    def dumps(self, value: Any, *, key: str | None = None) -> bytes:
        """Encode ``value``; raise :class:`UnstorableResultError` if it would not come back
        as itself (by type and value) and :class:`ResultTooLargeError` if it is too large."""
        try:
            tag, data = self._dump(value)
        except Refused as exc:
            raise _refusal(
                UnstorableResultError,
                f"the tool result of type {type(value).__name__} cannot be stored"
                f"{_allow_hint(exc)}",
                key,
            ) from exc
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
        if type(value) in _ROUND_TRIPS:
            return self._seal(payload, "result", key)
        try:
            revived = self._decode(tag, data)
        except Refused as exc:
            raise _refusal(
                UnstorableResultError,
                f"the tool result of type {type(value).__name__} would not replay as "
                f"itself{_allow_hint(exc)}",
                key,
            ) from exc
        except Exception as exc:
            raise _refusal(
                UnstorableResultError,
                f"the tool result of type {type(value).__name__} cannot be stored: "
                f"it would not decode ({exc})",
                key,
            ) from exc
        problem = None if _same(value, revived) else _difference(value, revived, "result")
        if problem is not None:
            raise _refusal(
                UnstorableResultError, f"the tool result would not replay as itself: {problem}", key
            )
        return self._seal(payload, "result", key)

    def _dump(self, value: Any) -> tuple[str, bytes]:
        if value is None:
            return "null", b""
        if type(value) is bytes:
            return "bytes", value
        if type(value) is bytearray:
            return "bytearray", bytes(value)
        return "msgpack", self._codec.encode(value)

    def _decode(self, tag: str, data: bytes) -> Any:
        if tag == "null":
            return None
        if tag == "bytes":
            return bytes(data)
        if tag == "bytearray":
            return bytearray(data)
        value = self._codec.decode(data)
        return tuple(value) if tag == "tuple" else value

    def loads(
        self,
        payload: bytes | None,
        *,
        key: str | None = None,
        kind: Kind = "result",
        namespace: str | None = None,
    ) -> Any:
        """The stored value. ``namespace`` (for a sealed payload): the one to check it
        against, default this serializer's."""
        if payload is None:
            raise CorruptRecordError("the record is completed but holds no payload", key=key)
        plain = self._unseal(bytes(payload), kind, key, namespace)
        tag, sep, data = plain.partition(b"\n")
        if not sep:
            raise CorruptRecordError("the stored payload has no type tag", key=key)
        return self._load(tag.decode("ascii", "replace"), data, key)

    def _load(self, tag: str, data: bytes, key: str | None) -> Any:
        if tag not in _TAGS:
            raise CorruptRecordError(
                f"refusing to decode a stored payload of type {tag[:40]!r}", key=key
            )
        try:
            return self._decode(tag, data)
        except Refused as exc:
            raise CorruptRecordError(_undecodable(exc, key), key=key) from exc
        except Exception as exc:
            raise CorruptRecordError(
                f"the stored payload cannot be decoded: {exc}", key=key
            ) from exc

    # -- failures ----------------------------------------------------------------------

    def dumps_failure(self, exc: BaseException, *, key: str | None = None) -> bytes:
        f = StoredFailure.of(exc)
        doc = {"type": f.type, "message": f.message[:10_000], "args": f.args}
        return self._seal(b"msgpack\n" + self._codec.encode(doc), "failure", key)

    def loads_failure(
        self, payload: bytes | None, *, key: str | None = None, namespace: str | None = None
    ) -> StoredFailure:
        doc = self.loads(payload, key=key, kind="failure", namespace=namespace)
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


def _allow_hint(exc: Refused) -> str:
    if exc.type_name is None:
        return f" ({exc})"
    short = exc.type_name.rsplit(".", 1)[-1]
    return (
        f": it holds a {exc.type_name}, which is not allowed; pass allowed_types=[{short}] "
        "to idempotent(...) (enums, pydantic models, dataclasses and plain classes a tool "
        "returns must be allowed)"
    )


def _undecodable(exc: Refused, key: str | None) -> str:
    """Why a stored payload does not decode as what was stored, and what to do."""
    delete = f"`langchain-idempotent delete {key}`" if key else "`langchain-idempotent delete KEY`"
    if exc.type_name is not None:
        short = exc.type_name.rsplit(".", 1)[-1]
        return (
            f"the stored result holds a {exc.type_name}, which this worker does not allow: "
            f"pass allowed_types=[{short}] to idempotent(...) on every worker that replays "
            f"key {key} (a rolling deploy or a renamed class), or, if the record was not "
            f"written by this application, delete it with {delete} so the call runs again"
        )
    return (
        f"the stored result does not decode as what was stored ({exc}); delete the record "
        f"with {delete} so the call runs again"
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

#: Types whose encoding always decodes to an equal value of the same type: a result of
#: one (a tool's text, most often) has no round trip to check.
_ROUND_TRIPS = frozenset({str, bool, bytes, type(None)})

#: Types whose decoded copy replays as itself exactly when it has the same type and
#: compares equal (what :func:`_difference` checks for them, without building paths).
_EXACT = frozenset({str, int, bool, type(None), bytes})


@functools.cache
def _text_types() -> tuple[type, ...]:
    """``str`` subclasses that replay as the equal ``str``: langchain-core's
    ``TextAccessor`` (``message.text`` since 1.0, a ``str`` that can also be called as the
    old ``.text()``), which LangChain's sub-agent-as-a-tool pattern returns."""
    try:
        from langchain_core.messages.base import TextAccessor
    except ImportError:  # an older langchain-core: no such type
        return ()
    return (TextAccessor,)


def _as_plain_text(before: Any, after: Any) -> bool:
    """Whether ``before`` is message text (:func:`_text_types`) replaying as its ``str``."""
    return type(after) is str and type(before) in _text_types() and before == after


def _same(before: Any, after: Any) -> bool:
    """Whether :func:`_difference` finds no difference, answered for plain JSON-like values
    without building the paths it reports (those are built only for a difference)."""
    kind = type(before)
    if type(after) is not kind:
        return _as_plain_text(before, after)
    if kind in _EXACT:
        return bool(before == after)
    if kind is dict:
        return len(before) == len(after) and all(
            _same(bk, ak) and _same(bv, av)
            for (bk, bv), (ak, av) in zip(before.items(), after.items(), strict=True)
        )
    if kind is list:
        return len(before) == len(after) and all(map(_same, before, after))
    return _difference(before, after, "result") is None


def _difference(before: Any, after: Any, where: str) -> str | None:
    """How ``after`` (the decoded copy) differs from ``before`` by type or value, or
    ``None`` if it replays as itself. A datetime's or time's ``tzinfo`` must be the same
    kind of zone (a ``ZoneInfo`` is not its current offset); float and ``Decimal`` NaNs
    count as equal to themselves."""
    if type(after) is not type(before):
        return None if _as_plain_text(before, after) else _type_changed(before, after, where)
    if isinstance(before, _dt.datetime | _dt.time):
        zone = _difference(before.tzinfo, after.tzinfo, f"{where}.tzinfo")
        if zone is not None or before.fold != after.fold:
            return zone or _value_changed(before, where)
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
    if is_plain(before):
        return _difference(vars(before), vars(after), f"{where}.__dict__")
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
    if type(after) is type(before) or _as_plain_text(before, after):
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
