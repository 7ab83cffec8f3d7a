"""One rule for results, on every store: a replay is the first answer, or the first call is refused.

A hypothesis property over nested results (tuples and lists, sets, dicts, enums, pydantic
models, dataclasses, plain classes, zoned datetimes, ``Decimal``, bytes, NaN, integers
beyond msgpack, types nobody allowed) through a real wrapped tool on the memory, SQLite,
Redis and PostgreSQL stores: the replay has the same type and value as the first answer
all the way down, or the first call raises ``UnstorableResultError`` and every retry gets
the same error from an unchanged record, without running the tool again.

And a record tampered with in the store (an extension payload naming ``os.system``) is a
``CorruptRecordError`` — never its bare inner argument replayed as a result, never shown
by ``langchain-idempotent show`` as one, and nothing runs.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import math
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import ormsgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain_core.tools import StructuredTool
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from pydantic import BaseModel

from langchain_idempotent import (
    CorruptRecordError,
    InMemoryIdempotencyStore,
    UnstorableResultError,
    idempotency_scope,
    idempotent,
)
from langchain_idempotent.cli import main as cli_main
from langchain_idempotent.core.serde import ResultSerializer
from langchain_idempotent.core.store import BaseIdempotencyStore, ClaimRequest, CompleteRequest
from langchain_idempotent.stores.sqlite import SqliteIdempotencyStore
from tests.support.postgres_fixtures import pg_server, pg_table, pg_url

__all__ = ["pg_server", "pg_table", "pg_url"]  # fixtures used by this module


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Level(enum.IntEnum):
    LOW = 1


class Unlisted(enum.Enum):
    """Never in allowed_types: a result holding it must be refused on the first call."""

    X = 1


class Refund(BaseModel):
    id: str
    amount: Decimal
    tags: tuple[str, ...] = ()
    at: dt.datetime | None = None
    color: Color | None = None


@dataclasses.dataclass
class Ticket:
    id: int
    note: str


class Point:
    def __init__(self, x: int) -> None:
        self.x = x


ALLOWED = [Color, Level, Refund, Ticket, Point]

_datetimes = st.datetimes(timezones=st.none() | st.just(dt.UTC) | st.timezones())
_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
    st.binary(max_size=6),
    st.decimals(allow_nan=True, allow_infinity=True),
    _datetimes,
    st.dates(),
    st.uuids(),
    st.sampled_from(Color),
    st.sampled_from(Level),
    st.just(Unlisted.X),
    st.builds(Point, st.integers(-5, 5)),
    st.builds(Ticket, st.integers(0, 9), st.text(max_size=4)),
    st.builds(
        Refund,
        id=st.text(max_size=4),
        amount=st.decimals(allow_nan=False, allow_infinity=False, places=2),
        tags=st.tuples(st.text(max_size=3)),
        at=st.none() | _datetimes,
        color=st.none() | st.sampled_from(Color),
    ),
)
_hashables = st.one_of(
    st.integers(-9, 9), st.text(max_size=3), st.tuples(st.integers(-9, 9), st.text(max_size=2))
)
RESULTS = st.recursive(
    _leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.tuples(inner, inner),
        st.dictionaries(st.text(max_size=4), inner, max_size=3),
        st.sets(_hashables, max_size=3),
        st.frozensets(_hashables, max_size=3),
    ),
    max_leaves=8,
)


def same(a: Any, b: Any) -> bool:
    """The same type and value all the way down (NaN is itself; a zone is its kind)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return repr(a) == repr(b)
    if isinstance(a, Decimal):
        return a.compare_total(b) == 0
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return len(a) == len(b) and all(
            same(ka, kb) and same(va, vb)
            for (ka, va), (kb, vb) in zip(a.items(), b.items(), strict=True)
        )
    if isinstance(a, set | frozenset):
        return sorted(map(repr, a)) == sorted(map(repr, b))
    if isinstance(a, dt.datetime):
        return (
            a == b
            and a.fold == b.fold
            and type(a.tzinfo) is type(b.tzinfo)
            and repr(a.tzinfo) == repr(b.tzinfo)
        )
    if isinstance(a, BaseModel):
        return same(dict(a), dict(b))
    if dataclasses.is_dataclass(a) or isinstance(a, Point):
        return same(vars(a), vars(b))
    return bool(a == b)


@pytest.fixture(params=["memory", "sqlite", "redis", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BaseIdempotencyStore]:
    if request.param == "memory":
        s: BaseIdempotencyStore = InMemoryIdempotencyStore()
    elif request.param == "sqlite":
        s = SqliteIdempotencyStore(str(tmp_path / "records.db"))
    elif request.param == "redis":
        from langchain_idempotent.stores.redis import RedisIdempotencyStore

        server = request.getfixturevalue("redis_server")  # tests/conftest.py
        s = RedisIdempotencyStore.from_url(server.url, prefix=f"fidelity-{uuid.uuid4().hex[:8]}:")
    else:
        from langchain_idempotent.stores.postgres import PostgresIdempotencyStore

        s = PostgresIdempotencyStore.from_url(
            request.getfixturevalue("pg_url"), table=request.getfixturevalue("pg_table")
        )
    yield s
    s.close()


def test_a_replay_is_the_first_answer_or_the_first_call_is_refused(
    store: BaseIdempotencyStore,
) -> None:
    @settings(
        max_examples=40,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(result=RESULTS)
    def check(result: Any) -> None:
        runs: list[int] = []

        def produce(n: int) -> Any:
            """Return the result under test."""
            runs.append(n)
            return result

        tool = idempotent(StructuredTool.from_function(produce), store=store, allowed_types=ALLOWED)
        with idempotency_scope(f"fidelity-{uuid.uuid4().hex}"):
            try:
                first = tool.invoke({"n": 1})
            except UnstorableResultError as refused:
                assert refused.key is not None
                before = store.get(refused.key)
                for _ in range(2):
                    with pytest.raises(UnstorableResultError) as retry:
                        tool.invoke({"n": 1})
                    assert str(retry.value) == str(refused)
                    after = store.get(refused.key)
                    assert before is not None and after is not None
                    assert (after.state, after.payload, after.fence, after.attempt) == (
                        before.state,
                        before.payload,
                        before.fence,
                        before.attempt,
                    )
                assert runs == [1]
                return
            replay = tool.invoke({"n": 1})
        assert same(first, result)
        assert same(replay, result), f"{replay!r} is not {result!r}"
        assert runs == [1]

    check()


def test_results_nobody_allowed_are_refused_and_allowed_ones_replay() -> None:
    """The two outcomes of the property, pinned, so the property cannot pass vacuously."""
    s = ResultSerializer(allowed_types=ALLOWED)
    kept = [
        (1, (2, (3,))),
        {"at": dt.datetime(2026, 3, 28, 12, tzinfo=ZoneInfo("Europe/Berlin"))},
        Refund(id="r", amount=Decimal("1.50"), tags=("a",), color=Color.RED),
        [Point(1), Ticket(1, "n"), {frozenset({(1, "a")})}],
        [math.nan, Decimal("NaN"), b"\x00", Level.LOW],
    ]
    for value in kept:
        assert same(s.loads(s.dumps(value)), value)
    for value in ([Unlisted.X], {"n": 2**70}, {"s": "\ud800"}):
        with pytest.raises(UnstorableResultError):
            s.dumps(value)


# -- tampered records ---------------------------------------------------------------------


def _ext(code: int, *parts: Any) -> bytes:
    return ormsgpack.packb(ormsgpack.Ext(code, ormsgpack.packb(list(parts))))


def tampered_payloads(marker: Path) -> dict[str, bytes]:
    cmd = f"touch {marker}"
    return {
        "constructor, one argument": _ext(0, "os", "system", cmd),
        "constructor, positional": _ext(1, "os", "system", [cmd]),
        "constructor, keywords": _ext(2, "os", "system", {"command": cmd}),
        "method": _ext(3, "os", "system", cmd, "__call__"),
        "pydantic v1": _ext(4, "os", "system", {"command": cmd}),
        "pydantic v2": _ext(5, "os", "system", {"command": cmd}, "model_validate_json"),
        "our model extension": _ext(103, "os", "system", {"command": cmd}, []),
        "our object extension": _ext(102, "os", "system", {"command": cmd}),
        "nested in a list": ormsgpack.packb(
            ["ok", ormsgpack.Ext(0, ormsgpack.packb(["os", "system", cmd]))]
        ),
        "subprocess": _ext(1, "subprocess", "call", [["touch", str(marker)]]),
    }


def test_langgraphs_strict_decoder_replays_the_inner_argument_of_a_tampered_payload(
    tmp_path: Path,
) -> None:
    """The trap this library avoids: LangGraph returns what the payload wraps."""
    strict = JsonPlusSerializer(pickle_fallback=False, allowed_msgpack_modules=None)
    passed = []
    for name, data in tampered_payloads(tmp_path / "pwned").items():
        try:
            value = strict.loads_typed(("msgpack", data))
        except Exception:
            continue
        if value is not None:
            passed.append(name)
    assert len(passed) >= 5, passed
    assert not (tmp_path / "pwned").exists()


def test_a_tampered_payload_is_a_corrupt_record_naming_the_type_and_never_runs(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "pwned"
    for name, data in tampered_payloads(marker).items():
        with pytest.raises(CorruptRecordError) as info:
            ResultSerializer(allowed_types=ALLOWED).loads(b"msgpack\n" + data, key="k1")
        message = str(info.value)
        assert info.value.key == "k1", name
        assert "langchain-idempotent delete k1" in message, name
        assert "os.system" in message or "subprocess.call" in message or "calls" in message, (
            name,
            message,
        )
    assert not marker.exists()


def test_show_does_not_print_a_tampered_payload_as_a_result(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = tmp_path / "pwned"
    url = f"sqlite:///{tmp_path / 'idem.db'}"
    store = SqliteIdempotencyStore(str(tmp_path / "idem.db"))
    payload = b"msgpack\n" + tampered_payloads(marker)["constructor, one argument"]
    claim = store.claim(ClaimRequest("k", owner="o", fingerprint="f", lease_ms=5000, ttl_ms=60_000))
    store.complete(
        CompleteRequest(
            "k",
            owner="o",
            fence=claim.fence,
            fingerprint="f",
            payload=payload,
            failed=False,
            ttl_ms=60_000,
        )
    )
    store.close()
    code = cli_main(["show", "k", "--url", url])
    out = capsys.readouterr().out
    assert code == 1
    assert "os.system" in out
    assert f"touch {marker}" not in out.replace("payload", "")  # the argument is not a result
    assert not marker.exists()
