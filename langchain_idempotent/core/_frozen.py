"""A cheaper ``__init__`` for the frozen, slotted dataclasses every call makes.

A frozen dataclass's generated ``__init__`` sets each field with ``object.__setattr__(self,
name, value)``: a global lookup, an attribute lookup and the generic ``setattr`` (which
looks the slot's descriptor up in the class again) per field. A first run builds some
seventy such fields (records, requests, the key's :class:`~._callinfo.CallInfo`, the
context), about a twentieth of what the wrapper adds to a ToolNode step.

:func:`fast_init` (applied above ``@dataclass(frozen=True, slots=True)``) replaces that
``__init__`` with one that calls each slot's own setter, bound once per class. Nothing
else changes: the same parameters, defaults (the default-factory marker included),
annotations and ``__post_init__`` call, and the class's equality, hash, repr, pickling and
immutability are the dataclass's own. A class this does not cover (not slotted, a field
with ``init=False``, an ``InitVar``) keeps its generated ``__init__``.
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any, TypeVar

__all__ = ["fast_init"]

T = TypeVar("T")


def _slot(cls: type, name: str) -> Any:
    for klass in cls.__mro__:
        found = klass.__dict__.get(name)
        if found is not None:
            return found if isinstance(found, types.MemberDescriptorType) else None
    return None


def fast_init(cls: type[T]) -> type[T]:
    """``cls`` (a frozen, slotted dataclass) with an ``__init__`` that sets its slots
    directly; any other class is returned as it is."""
    original = cls.__dict__.get("__init__")
    if original is None or not dataclasses.is_dataclass(cls) or "__slots__" not in cls.__dict__:
        return cls
    fields = dataclasses.fields(cls)
    code = original.__code__
    params = code.co_varnames[1 : 1 + code.co_argcount - 1 + code.co_kwonlyargcount]
    if [f.name for f in fields] != list(params) or any(not f.init for f in fields):
        return cls  # InitVars or fields left out of __init__: keep the generated one
    positional = code.co_varnames[1 : code.co_argcount]
    keyword = code.co_varnames[code.co_argcount : code.co_argcount + code.co_kwonlyargcount]
    given = original.__defaults__ or ()
    defaults = dict(zip(positional[len(positional) - len(given) :], given, strict=True))
    defaults.update(original.__kwdefaults__ or {})
    names: dict[str, Any] = {}
    body = []
    for f in fields:
        setter = _slot(cls, f.name)
        if setter is None:
            return cls
        names[f"_set_{f.name}"] = setter.__set__
        if f.default_factory is not dataclasses.MISSING:
            names[f"_factory_{f.name}"] = f.default_factory
            names[f"_marker_{f.name}"] = defaults[f.name]
            body.append(f"    if {f.name} is _marker_{f.name}: {f.name} = _factory_{f.name}()")
        body.append(f"    _set_{f.name}(self, {f.name})")
    if any("__post_init__" in klass.__dict__ for klass in cls.__mro__):
        body.append("    self.__post_init__()")
    signature = ", ".join(["self", *positional, *(["*", *keyword] if keyword else [])])
    source = f"def __init__({signature}):\n" + "\n".join(body or ["    pass"]) + "\n"
    exec(source, names)
    init = names["__init__"]
    init.__defaults__ = original.__defaults__
    init.__kwdefaults__ = original.__kwdefaults__
    init.__annotations__ = original.__annotations__
    init.__qualname__ = original.__qualname__
    init.__module__ = original.__module__
    init.__doc__ = original.__doc__
    cls.__init__ = init  # type: ignore[method-assign]
    return cls
