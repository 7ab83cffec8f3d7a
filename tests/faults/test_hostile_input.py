"""Scenario 8: hostile and bad input.

- Arguments that cannot be put in canonical form (not JSON-able, NaN / infinities anywhere,
  absurd nesting) are refused with :class:`InvalidArgumentsError` before the tool runs, in
  bounded time. 10 MB arguments work in bounded time and memory; a 10 MB *result* is
  refused (``ResultTooLargeError``) and the refusal is stored, so a retry does not run the
  effect again.
- Unicode look-alikes are different calls (different keys): nothing normalises them
  together.
- Records planted in the store — garbage, a pickle whose ``__reduce__`` would create a
  marker file, msgpack extensions naming ``os.system`` / ``builtins.open``, LangChain's
  JSON constructor form, a wrong format version, a truncated or absurd payload — are
  refused or at worst returned as inert data; the marker file never appears and the tool
  never runs.
- A thread id with control characters works and stays its own scope; two namespaces
  (tenants) with the same thread id never see each other's results.
"""

from __future__ import annotations

import json
import pickle
import sqlite3
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import ormsgpack
import pytest
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, tool

from langchain_idempotent import (
    CorruptRecordError,
    IdempotencyError,
    InvalidArgumentsError,
    Policy,
    idempotent,
)
from langchain_idempotent.core.engine import Engine
from langchain_idempotent.core.store import BaseIdempotencyStore
from tests.support.faults import StoreSpec

from .report import Figures

CONFIG: RunnableConfig = {"configurable": {"thread_id": "hostile-thread"}}


@pytest.fixture
def store(spec: StoreSpec) -> Iterator[BaseIdempotencyStore]:
    s = spec.open()
    yield s
    s.close()


class Runs:
    """Counts tool executions by the argument they ran with."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    def tools(self, store: BaseIdempotencyStore, **policy: Any) -> tuple[BaseTool, BaseTool]:
        runs = self.calls

        @tool
        def echo(payload: Any) -> str:
            """Echo any payload."""
            runs[repr(payload)[:60]] += 1
            return f"ran with {repr(payload)[:60]}"

        @tool
        def pay(amount: float, to: str) -> str:
            """Pay an amount."""
            runs[f"pay {amount} {to}"] += 1
            return f"paid {amount} to {to!r}"

        return idempotent(echo, store=store, **policy), idempotent(pay, store=store, **policy)


# -- arguments -------------------------------------------------------------------------------


def deep(depth: int) -> dict[str, Any]:
    root: dict[str, Any] = {}
    node = root
    for _ in range(depth):
        node["a"] = {}
        node = node["a"]
    return root


BAD_ARGUMENTS: list[tuple[str, str, Any]] = [
    ("not JSON-able: object()", "echo", {"payload": object()}),
    ("not JSON-able: a function", "echo", {"payload": print}),
    ("NaN", "pay", {"amount": float("nan"), "to": "bob"}),
    ("infinity", "pay", {"amount": float("inf"), "to": "bob"}),
    ("-infinity", "pay", {"amount": float("-inf"), "to": "bob"}),
    ("NaN nested in a list", "echo", {"payload": [1, float("nan")]}),
    ("infinity nested in a dict", "echo", {"payload": {"amount": float("inf")}}),
    ("integer beyond 2**53", "echo", {"payload": 2**60}),
    ("nesting 100,000 deep", "echo", {"payload": deep(100_000)}),
]


def test_arguments_without_a_canonical_form_are_refused_before_the_tool_runs(
    store: BaseIdempotencyStore, record: Callable[[Figures], None]
) -> None:
    runs = Runs()
    echo, pay = runs.tools(store)
    tools = {"echo": echo, "pay": pay}
    errors: Counter[str] = Counter()
    slowest = 0.0
    for label, name, args in BAD_ARGUMENTS:
        started = time.monotonic()
        with pytest.raises(InvalidArgumentsError) as raised:
            tools[name].invoke(args, config=CONFIG)
        slowest = max(slowest, time.monotonic() - started)
        errors[type(raised.value).__name__] += 1
        assert runs.calls == Counter(), label
    assert slowest < 2.0
    # Non-finite numbers never share a key with null (they are refused, not rewritten).
    assert echo.invoke({"payload": [1, None]}, config=CONFIG) == "ran with [1, None]"
    record(
        Figures(
            f"8. arguments with no canonical form ({type(store).__name__})",
            ", ".join(label for label, _, _ in BAD_ARGUMENTS),
            calls=len(BAD_ARGUMENTS),
            effects=0,
            errors=errors,
            notes=[f"refused in <= {slowest * 1000:.0f} ms each; the tool never ran"],
        )
    )


def test_ten_megabyte_arguments_and_results_stay_bounded_in_time_and_memory(
    store: BaseIdempotencyStore, record: Callable[[Figures], None]
) -> None:
    runs = Runs()
    echo, _ = runs.tools(store)
    big = "x" * (10 * 1024 * 1024)
    tracemalloc.start()
    started = time.monotonic()
    first = echo.invoke({"payload": big}, config=CONFIG)
    second = echo.invoke({"payload": big}, config=CONFIG)
    took = time.monotonic() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert first == second and sum(runs.calls.values()) == 1  # keyed by a 10 MB argument
    assert took < 10.0
    assert peak < 12 * len(big), f"peak {peak / 1e6:.0f} MB for a 10 MB argument"

    effects = 0

    @tool
    def export(name: str) -> str:
        """Return a huge result."""
        nonlocal effects
        effects += 1
        return "y" * (10 * 1024 * 1024)

    wrapped = idempotent(export, store=store)
    errors: Counter[str] = Counter()
    for _ in range(3):
        with pytest.raises(Exception) as raised:
            wrapped.invoke({"name": "all"}, config=CONFIG)
        errors[type(raised.value).__name__] += 1
    assert effects == 1  # the refusal was stored: retries do not run the effect again
    assert errors["ResultTooLargeError"] == 3  # the first caller and every retry: one error
    record(
        Figures(
            f"8. 10 MB argument and 10 MB result ({type(store).__name__})",
            "10 MB argument x2; 10 MB result x3",
            calls=5,
            effects=1 + effects,
            errors=errors,
            notes=[
                f"argument: 2 calls in {took:.2f}s, peak {peak / 1e6:.0f} MB traced; "
                "result: ResultTooLargeError stored and replayed"
            ],
        )
    )


LOOK_ALIKES = [
    "Alice",
    "\u0410lice",  # Cyrillic A
    "\uff21lice",  # fullwidth A
    "Alice\u200b",  # zero-width space
    "Al\u0131ce",  # dotless i
    "caf\u00e9",  # NFC
    "cafe\u0301",  # NFD
    "\ufb01le",  # fi ligature
    "file",
    "\u212a",  # Kelvin sign
    "K",
]


def test_unicode_look_alikes_are_different_calls(
    store: BaseIdempotencyStore, record: Callable[[Figures], None]
) -> None:
    runs = Runs()
    _, pay = runs.tools(store)
    results = [pay.invoke({"amount": 1, "to": name}, config=CONFIG) for name in LOOK_ALIKES]
    replays = [pay.invoke({"amount": 1.0, "to": name}, config=CONFIG) for name in LOOK_ALIKES]
    assert len(set(results)) == len(LOOK_ALIKES)
    assert replays == results  # 1 and 1.0 are the same call; each name its own key
    assert sum(runs.calls.values()) == len(LOOK_ALIKES)
    record(
        Figures(
            f"8. unicode look-alikes ({type(store).__name__})",
            f"{len(LOOK_ALIKES)} look-alike recipients (Cyrillic, fullwidth, ZWSP, NFC/NFD, ...)",
            calls=2 * len(LOOK_ALIKES),
            effects=sum(runs.calls.values()),
            notes=["every look-alike ran once under its own key; none replayed another's"],
        )
    )


# -- planted records -------------------------------------------------------------------------


class Marker:
    """Unpickling this creates ``path`` (so a test can see whether pickle ever ran)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.path), "w"))


def _ext(code: int, *fields: Any) -> bytes:
    return ormsgpack.packb(ormsgpack.Ext(code, ormsgpack.packb(list(fields))))


def planted_payloads(marker: Path) -> dict[str, bytes]:
    command = f"touch {marker}"
    return {
        "pickle payload": b"pickle\n" + pickle.dumps(Marker(marker)),
        "pickle under the msgpack tag": b"msgpack\n" + pickle.dumps(Marker(marker)),
        "msgpack ext: os.system(...)": b"msgpack\n" + _ext(0, "os", "system", command),
        "msgpack ext: builtins.open(...)": b"msgpack\n"
        + _ext(1, "builtins", "open", [str(marker), "w"]),
        "msgpack ext: method os.system": b"msgpack\n" + _ext(3, "os", "system", command, "x"),
        "msgpack ext: pydantic os.system": b"msgpack\n" + _ext(5, "os", "system", {}, None),
        "json constructor (LangChain lc form)": b"json\n"
        + json.dumps(
            {"lc": 2, "type": "constructor", "id": ["os", "system"], "kwargs": {}}
        ).encode(),
        "garbage bytes": b"msgpack\n\xc1\xc1\xc1\xff\x00garbage",
        "truncated payload": b"msgpack\n\x92\xa5hel",
        "absurd declared length (4 GB string)": b"msgpack\n\xdb\xff\xff\xff\xff",
        "no type tag": b"just some bytes",
    }


def plant(spec: StoreSpec, store: BaseIdempotencyStore, key: str, **fields: Any) -> None:
    """Overwrite fields of the stored record for ``key`` behind the store's back."""
    if spec.kind == "sqlite":
        with sqlite3.connect(spec.target) as db:
            for name, value in fields.items():
                db.execute(f"UPDATE idempotency_records SET {name} = ? WHERE key = ?", (value, key))
        return
    client = store._sync()  # type: ignore[attr-defined]
    rkey = store._rkey(key)  # type: ignore[attr-defined]
    if fields.pop("not_a_hash", False):
        client.delete(rkey)
        client.set(rkey, b"\x80\x04garbage")
        return
    client.hset(rkey, mapping=fields)


def test_planted_records_are_refused_and_never_executed(
    spec: StoreSpec,
    store: BaseIdempotencyStore,
    tmp_path: Path,
    record: Callable[[Figures], None],
) -> None:
    marker = tmp_path / "PWNED"
    engine = Engine(store, Policy())
    ran: list[str] = []
    outcomes: Counter[str] = Counter()
    inert: list[str] = []
    cases: dict[str, dict[str, Any]] = {
        label: {"payload": payload} for label, payload in planted_payloads(marker).items()
    }
    cases["wrong format version"] = {"version": 999}
    cases["unknown state"] = {"state": "pwned"}
    cases["garbage fence"] = {"fence": "1; DROP TABLE" if spec.kind == "redis" else "x"}
    if spec.kind == "redis":
        cases["not a hash (a string at the key)"] = {"not_a_hash": True}
    for i, (label, fields) in enumerate(cases.items()):
        key = f"planted-{i}"
        assert engine.run(key, fingerprint="fp", action=lambda: "genuine") == "genuine"
        plant(spec, store, key, **fields)
        started = time.monotonic()

        def tool_body(label: str = label) -> None:
            ran.append(label)

        try:
            value = engine.run(key, fingerprint="fp", action=tool_body)
        except IdempotencyError as exc:
            assert isinstance(exc, CorruptRecordError), (label, exc)
            outcomes[type(exc).__name__] += 1
        else:
            # A blocked msgpack extension decodes to its inert arguments (LangGraph's
            # strict serializer returns them instead of calling anything), and msgpack
            # ignores trailing bytes (a pickle's first byte reads as an empty map).
            assert isinstance(value, str | list | dict), (label, value)
            assert value != "genuine", label
            inert.append(f"{label} -> {value!r}".replace(str(marker), "<marker>"))
        assert time.monotonic() - started < 2.0, label
        assert not marker.exists(), f"{label}: code ran while decoding a planted record"
    assert ran == []
    inert_labels = {entry.split(" -> ")[0] for entry in inert}
    assert inert_labels <= {
        label for label in cases if label.startswith(("msgpack ext", "pickle under"))
    }
    record(
        Figures(
            f"8. planted records ({spec.kind})",
            f"{len(cases)} planted: " + ", ".join(cases),
            calls=len(cases),
            effects=0,
            errors=outcomes,
            notes=[
                "marker file never created; the tool never ran",
                f"{len(inert)} replayed as inert data"
                + (f" ({'; '.join(inert)})" if inert else ""),
            ],
        )
    )


# -- scopes and tenants ----------------------------------------------------------------------

CONTROL_THREADS = ["t", "t\x00", "t\n", "t\r\nSET x 1\r\n", "t\x1b[2J", "t\u202e", "t\t"]


def test_thread_ids_with_control_characters_are_their_own_scopes(
    store: BaseIdempotencyStore, record: Callable[[Figures], None]
) -> None:
    runs = Runs()
    _, pay = runs.tools(store)
    results = {}
    for thread in CONTROL_THREADS:
        config: RunnableConfig = {"configurable": {"thread_id": thread}}
        results[thread] = pay.invoke({"amount": 5, "to": "bob"}, config=config)
        assert pay.invoke({"amount": 5, "to": "bob"}, config=config) == results[thread]
    assert sum(runs.calls.values()) == len(CONTROL_THREADS)
    for thread in CONTROL_THREADS:
        listed = store.list(thread_id=thread)
        assert [r.meta["thread_id"] for r in listed] == [thread]
    assert store.purge(thread_id="t\r\nSET x 1\r\n") == 1
    assert [r.meta["thread_id"] for r in store.list(thread_id="t")] == ["t"]
    record(
        Figures(
            f"8. thread ids with control characters ({type(store).__name__})",
            "NUL, LF, CRLF + RESP command, ANSI escape, RTL override, TAB",
            calls=2 * len(CONTROL_THREADS),
            effects=sum(runs.calls.values()),
            notes=["each thread id ran once, listed and purged on its own"],
        )
    )


def test_two_tenants_with_the_same_thread_id_never_see_each_others_results(
    store: BaseIdempotencyStore, record: Callable[[Figures], None]
) -> None:
    balances = {"tenant-a": "balance of A: 100", "tenant-b": "balance of B: 999"}
    ran: Counter[str] = Counter()

    def for_tenant(tenant: str) -> BaseTool:
        @tool
        def balance(account: str) -> str:
            """Read a balance."""
            ran[tenant] += 1
            return balances[tenant]

        return idempotent(balance, store=store, namespace=tenant)

    a, b = for_tenant("tenant-a"), for_tenant("tenant-b")
    config: RunnableConfig = {"configurable": {"thread_id": "shared-thread-1"}}
    seen = [
        (t, tool_.invoke({"account": "main"}, config=config))
        for _ in range(3)
        for t, tool_ in (("tenant-a", a), ("tenant-b", b))
    ]
    assert all(value == balances[t] for t, value in seen)
    assert ran == Counter({"tenant-a": 1, "tenant-b": 1})
    only_a = store.list(namespace="tenant-a", thread_id="shared-thread-1")
    assert [r.meta["namespace"] for r in only_a] == ["tenant-a"]
    assert store.purge(thread_id="shared-thread-1", namespace="tenant-a") == 1
    assert b.invoke({"account": "main"}, config=config) == balances["tenant-b"]
    assert ran["tenant-b"] == 1
    record(
        Figures(
            f"8. two tenants, one thread id ({type(store).__name__})",
            "same thread id, tool and arguments in two namespaces",
            calls=len(seen) + 1,
            effects=sum(ran.values()),
            notes=["each tenant ran once and only ever saw its own result"],
        )
    )
