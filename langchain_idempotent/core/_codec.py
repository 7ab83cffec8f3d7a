"""The msgpack codec under :mod:`.serde`: LangGraph's encoding, decoded strictly.

Values are written with LangGraph's ``JsonPlusSerializer`` msgpack extensions (the same
bytes a checkpoint holds for messages, ``Command``, datetimes, UUIDs, ...), plus four of
our own where LangGraph's would not come back as the value that went in:

====== ================================= ==============================================
code   what                              why not LangGraph's
====== ================================= ==============================================
100    a ``tuple`` (at any depth)        msgpack has one array type: tuples become lists
101    a ``datetime`` with a ``ZoneInfo`` ``isoformat`` keeps the offset, not the zone: a
                                         DST switch later, arithmetic is an hour off
102    a plain object of an allowed type LangGraph encodes only pydantic models,
       (its ``__dict__``)                dataclasses, enums, ... and refuses the rest
103    a pydantic model (its field       ``model_dump()`` flattens nested models, enums
       values, each encoded as itself)   and tuples, and decoding re-runs validators
====== ================================= ==============================================

Decoding does not use LangGraph's extension hook, which returns the bare inner argument
for a type outside its allow-list (a ``dict`` for a model, ``"rm -rf /"`` for a payload
naming ``os.system``) and falls back silently when a constructor fails. Here every
extension must name a type on the allow-list — LangGraph's safe types
(its ``SAFE_MSGPACK_TYPES``: messages, ``Command``, ``Send``, datetimes, ``Decimal``, sets,
paths, ...) or one the user allowed — and be rebuilt by it exactly; anything else raises
:class:`Refused`, naming the type. Allowed classes passed as objects are looked up in the
allow-list itself (no import, so a class defined inside a function works); only named
entries and LangGraph's safe types are imported, and only from their own module. A
pydantic model is rebuilt with ``model_construct`` from values that were themselves
checked, so no validator or ``__init__`` runs; a plain object with ``__new__`` and its
``__dict__``. Nothing else is ever called.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Iterable
from datetime import datetime
from enum import Enum
from typing import Any
from zoneinfo import ZoneInfo

import ormsgpack
from pydantic import BaseModel

from ._compat import (
    EXT_CONSTRUCTOR_KW_ARGS,
    EXT_CONSTRUCTOR_POS_ARGS,
    EXT_CONSTRUCTOR_SINGLE_ARG,
    EXT_METHOD_SINGLE_ARG,
    EXT_PYDANTIC_V2,
    langgraph_msgpack_default,
    safe_msgpack_types,
    send_from_args,
)

__all__ = ["Codec", "Refused", "is_plain"]

_TUPLE, _ZONED, _OBJECT, _MODEL = 100, 101, 102, 103

# LangGraph's extension codes (pinned in _compat), which we also read.
_SINGLE = EXT_CONSTRUCTOR_SINGLE_ARG
_POS = EXT_CONSTRUCTOR_POS_ARGS
_KW = EXT_CONSTRUCTOR_KW_ARGS
_METHOD = EXT_METHOD_SINGLE_ARG
_PYDANTIC_V2 = EXT_PYDANTIC_V2

_OPTION = (
    ormsgpack.OPT_NON_STR_KEYS
    | ormsgpack.OPT_PASSTHROUGH_DATACLASS
    | ormsgpack.OPT_PASSTHROUGH_DATETIME
    | ormsgpack.OPT_PASSTHROUGH_ENUM
    | ormsgpack.OPT_PASSTHROUGH_UUID
    | ormsgpack.OPT_PASSTHROUGH_TUPLE
    | ormsgpack.OPT_REPLACE_SURROGATES
)
_METHODS = {("datetime", "datetime", "fromisoformat"): datetime.fromisoformat}


class Refused(Exception):
    """A stored value names a type that is not allowed here, or does not rebuild."""

    def __init__(self, message: str, type_name: str | None = None) -> None:
        super().__init__(message)
        self.type_name = type_name


def _name(cls: type) -> tuple[str, str]:
    # LangGraph's encoding names a class by module and ``__name__``.
    return cls.__module__, cls.__name__


class Codec:
    """Encode with LangGraph's extensions (plus ours); decode only allowed types."""

    def __init__(self, allowed: Iterable[type | tuple[str, str]] = ()) -> None:
        self._classes: dict[tuple[str, str], type] = {}
        self._named: set[tuple[str, str]] = set(safe_msgpack_types())
        for entry in allowed:
            if isinstance(entry, type):
                self._classes[_name(entry)] = entry
            else:
                self._named.add((entry[0], entry[1]))

    # -- encoding ------------------------------------------------------------------------

    def encode(self, value: Any) -> bytes:
        """The bytes; :class:`Refused` names an object of a class that is not allowed."""
        refused: list[Refused] = []

        def default(obj: Any) -> Any:
            if is_plain(obj) and _name(type(obj)) not in self._classes:
                cls = type(obj)
                refused.append(Refused(cls.__qualname__, f"{cls.__module__}.{cls.__qualname__}"))
            return self._default(obj, default)

        try:
            return ormsgpack.packb(value, default=default, option=_OPTION)
        except Exception as exc:
            if refused:
                raise refused[0] from exc
            raise

    def _ext(self, code: int, value: Any, default: Callable[[Any], Any]) -> ormsgpack.Ext:
        return ormsgpack.Ext(code, ormsgpack.packb(value, default=default, option=_OPTION))

    def _default(self, obj: Any, default: Callable[[Any], Any]) -> Any:
        cls = type(obj)
        if cls is tuple:
            return self._ext(_TUPLE, list(obj), default)
        if isinstance(obj, datetime) and isinstance(obj.tzinfo, ZoneInfo):
            naive = obj.replace(tzinfo=None).isoformat()
            return self._ext(_ZONED, [naive, obj.tzinfo.key, obj.fold], default)
        if isinstance(obj, BaseModel):
            fields = {f: getattr(obj, f) for f in type(obj).model_fields}
            fields.update(obj.model_extra or {})
            return self._ext(_MODEL, [*_name(cls), fields, sorted(obj.model_fields_set)], default)
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            values = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
            return self._ext(_KW, [*_name(cls), values], default)
        if isinstance(obj, set | frozenset):
            return self._ext(_SINGLE, [*_name(cls), list(obj)], default)
        if _name(cls) in self._classes and is_plain(obj):
            return self._ext(_OBJECT, [*_name(cls), dict(vars(obj))], default)
        # Everything else as LangGraph writes it (its leaf types: UUID, Decimal, Enum, ...).
        return langgraph_msgpack_default(obj)

    # -- decoding ------------------------------------------------------------------------

    def decode(self, data: bytes) -> Any:
        """The value, or :class:`Refused` naming the first type that is not allowed."""
        refused: list[Refused] = []

        def hook(code: int, payload: bytes) -> Any:
            try:
                return self._revive(code, payload, hook)
            except Refused as exc:
                refused.append(exc)
                raise
            except Exception as exc:
                refused.append(Refused(f"a stored value does not rebuild: {exc}"))
                raise

        try:
            return ormsgpack.unpackb(data, ext_hook=hook, option=ormsgpack.OPT_NON_STR_KEYS)
        except Exception as exc:
            if refused:
                raise refused[0] from exc
            raise

    def _revive(self, code: int, payload: bytes, hook: Callable[[int, bytes], Any]) -> Any:
        tup = ormsgpack.unpackb(payload, ext_hook=hook, option=ormsgpack.OPT_NON_STR_KEYS)
        if code == _TUPLE:
            return tuple(_list(tup, 0))
        if code == _ZONED:
            naive, zone, fold = _list(tup, 3)
            return datetime.fromisoformat(naive).replace(tzinfo=ZoneInfo(zone), fold=fold)
        parts = _list(tup, None)
        if len(parts) < 3 or not all(isinstance(p, str) for p in parts[:2]):
            raise Refused("a stored extension is malformed")
        module, name, arg = parts[0], parts[1], parts[2]
        if code == _METHOD:
            method = _METHODS.get((module, name, str(parts[3]) if len(parts) > 3 else ""))
            if method is None:
                raise Refused(f"a stored value calls {module}.{name}.{parts[3:4]}", None)
            return method(arg)
        cls = self._resolve(module, name)
        if code == _MODEL and isinstance(cls, type) and issubclass(cls, BaseModel):
            fields_set = set(parts[3]) if len(parts) > 3 else None
            return cls.model_construct(_fields_set=fields_set, **arg)
        if code == _OBJECT and isinstance(cls, type) and _name(cls) in self._classes:
            obj: Any = object.__new__(cls)
            obj.__dict__.update(arg)
            return obj
        if code == _SINGLE:
            return cls(arg)
        if code == _POS:
            if (module, name) == ("langgraph.types", "Send"):
                return send_from_args(arg)
            return cls(*arg)
        if code in (_KW, _PYDANTIC_V2):
            return cls(**arg)
        raise Refused(f"a stored value uses an unsupported encoding ({code}) for {module}.{name}")

    def _resolve(self, module: str, name: str) -> Any:
        cls = self._classes.get((module, name))
        if cls is not None:
            return cls
        if (module, name) not in self._named:
            raise Refused(f"a stored value names {module}.{name}", f"{module}.{name}")
        return getattr(importlib.import_module(module), name)


def _list(value: Any, length: int | None) -> list[Any]:
    if not isinstance(value, list) or (length and len(value) != length):
        raise Refused("a stored extension is malformed")
    return value


_BUILTIN_VALUES = (str, bytes, bytearray, int, float, complex, list, dict, tuple, set, frozenset)


def _has_dict(obj: Any) -> bool:
    try:
        vars(obj)
    except TypeError:
        return False
    return True


def is_plain(obj: Any) -> bool:
    """An object whose state is its ``__dict__`` (no enum, model, dataclass or builtin)."""
    return (
        _has_dict(obj)
        and not isinstance(obj, Enum | BaseModel | type | BaseException)
        and not isinstance(obj, _BUILTIN_VALUES)
        and type(obj).__module__ != "builtins"
        and not callable(obj)
    )
