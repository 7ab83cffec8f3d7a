"""Results come back as they went in; unreadable records are refused, never executed."""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import enum
import logging
import math
import pickle
import uuid
from decimal import Decimal
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import ToolException
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.types import Command
from pydantic import BaseModel

from langchain_idempotent import (
    CorruptRecordError,
    InMemoryIdempotencyStore,
    Policy,
    ResultTooLargeError,
    UnstorableResultError,
)
from langchain_idempotent.core.engine import Engine
from langchain_idempotent.core.serde import ResultSerializer


class Receipt(BaseModel):
    refund_id: str
    amount: Decimal


@dataclasses.dataclass
class Ticket:
    id: int
    tags: list[str]


class Status(str, enum.Enum):  # noqa: UP042 - the str mixin is what is tested
    REFUNDED = "refunded"


class Priority(enum.IntEnum):
    HIGH = 1


class Channel(enum.StrEnum):
    EMAIL = "email"


class Flag(enum.Enum):
    ON = 1


class Refund(BaseModel):
    status: Status
    amount: float


class Label(str):
    """A str subclass: msgpack writes it as a plain str."""


@pytest.mark.parametrize(
    "value",
    [
        0,
        "",
        [],
        None,
        {},
        False,
        b"",
        b"\x00\xff",
        0.0,
        "unicode ✓ \u202e",
        {"nested": {"list": [1, 2.5, None, {"deep": True}]}},
        dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC),
        dt.date(2026, 1, 1),
        uuid.UUID(int=7),
        Decimal("140.00"),
        ("content", {"artifact": [1, 2]}),
        ToolMessage("refunded", tool_call_id="c1", artifact={"id": "re_1"}),
        Command(update={"messages": [ToolMessage("ok", tool_call_id="c2")]}, goto="next"),
        [ToolMessage("a", tool_call_id="c3"), AIMessage("b")],
    ],
    ids=repr,
)
def test_values_round_trip_exactly(value: object) -> None:
    s = ResultSerializer()
    back = s.loads(s.dumps(value))
    assert type(back) is type(value)
    if isinstance(value, Command):
        assert back.update == value.update and back.goto == value.goto
    else:
        assert back == value


def test_allowed_pydantic_models_and_dataclasses_round_trip() -> None:
    s = ResultSerializer(allowed_types=[Receipt, Ticket])
    for value in (Receipt(refund_id="re_1", amount=Decimal("140")), Ticket(1, ["vip"])):
        back = s.loads(s.dumps(value))
        assert type(back) is type(value) and back == value


def test_a_type_outside_the_allow_list_is_refused_at_write_time_with_a_hint() -> None:
    with pytest.raises(UnstorableResultError, match=r"allowed_types=\[Receipt\]"):
        ResultSerializer().dumps(Receipt(refund_id="re_1", amount=Decimal(1)))


ENUM_RESULTS = [
    Status.REFUNDED,
    Priority.HIGH,
    Channel.EMAIL,
    Flag.ON,
    [Status.REFUNDED, Priority.HIGH],
    {"status": Status.REFUNDED, "nested": {"priority": Priority.HIGH}},
    ("done", {"channel": Channel.EMAIL}),
]


@pytest.mark.parametrize("value", ENUM_RESULTS, ids=repr)
def test_allowed_enum_members_replay_as_themselves_not_as_their_values(value: object) -> None:
    s = ResultSerializer(allowed_types=[Status, Priority, Channel, Flag])
    back = s.loads(s.dumps(value))
    assert back == value
    assert _types(back) == _types(value)


def test_an_allowed_model_holding_an_allowed_enum_replays_as_itself() -> None:
    s = ResultSerializer(allowed_types=[Refund, Status])
    back = s.loads(s.dumps(Refund(status=Status.REFUNDED, amount=140.0)))
    assert type(back) is Refund and type(back.status) is Status


@pytest.mark.parametrize(
    ("value", "where", "enum"),
    [
        (Status.REFUNDED, r"holds a tests.test_serde.Status, which is not allowed", Status),
        (Priority.HIGH, r"holds a tests.test_serde.Priority, which is not allowed", Priority),
        ([1, Channel.EMAIL], r"holds a tests.test_serde.Channel, which is not allowed", Channel),
        ({"p": Priority.HIGH}, r"holds a tests.test_serde.Priority", Priority),
    ],
    ids=repr,
)
def test_an_enum_member_outside_the_allow_list_is_refused_not_replayed_as_its_value(
    value: object, where: str, enum: type
) -> None:
    # A str/int enum member compares equal to its value, so only a check by type sees it.
    with pytest.raises(UnstorableResultError, match=where) as info:
        ResultSerializer().dumps(value, key="k")
    assert f"allowed_types=[{enum.__name__}]" in str(info.value)
    assert info.value.key == "k"


def test_an_enum_member_used_as_a_dict_key_is_refused_even_when_allowed() -> None:
    # msgpack writes map keys of str/int subclasses as plain keys: allowing the type
    # cannot help, so the advice is to use plain keys.
    with pytest.raises(UnstorableResultError, match="use plain str or int keys"):
        ResultSerializer(allowed_types=[Status]).dumps({Status.REFUNDED: 1})


@pytest.mark.parametrize(
    "value",
    [collections.OrderedDict(a=1), Label("vip"), {"labels": [Label("vip")]}],
    ids=repr,
)
def test_a_builtin_subclass_that_would_replay_as_its_base_is_refused_with_plain_advice(
    value: object,
) -> None:
    with pytest.raises(UnstorableResultError, match="return a plain dict, list, str or number"):
        ResultSerializer().dumps(value)


@pytest.mark.parametrize(
    "value",
    [
        math.nan,
        math.inf,
        -math.inf,
        {"ratio": math.nan, "limits": [-math.inf, math.inf]},
        ("content", [math.nan]),
        Decimal("NaN"),
    ],
    ids=repr,
)
def test_nan_and_infinity_results_are_stored_and_replay_as_themselves(value: object) -> None:
    s = ResultSerializer()
    back = s.loads(s.dumps(value))
    assert _types(back) == _types(value)
    assert repr(back) == repr(value)  # nan == nan is False; the reprs say "nan" / "inf"


def test_an_allowed_model_with_a_nan_field_replays_with_nan() -> None:
    s = ResultSerializer(allowed_types=[Refund, Status])
    back = s.loads(s.dumps(Refund(status=Status.REFUNDED, amount=math.nan)))
    assert type(back) is Refund and math.isnan(back.amount)


def test_a_refused_result_logs_nothing_that_names_langgraphs_setting(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # LangGraph warns once per type and process, so each half uses a type of its own.
    class ControlShade(str, enum.Enum):  # noqa: UP042
        RED = "red"

    class RefusedShade(str, enum.Enum):  # noqa: UP042
        RED = "red"

    caplog.set_level(logging.DEBUG)
    strict = JsonPlusSerializer(pickle_fallback=False, allowed_msgpack_modules=None)
    strict.loads_typed(strict.dumps_typed(ControlShade.RED))
    assert "allowed_msgpack_modules" in caplog.text  # the capture sees LangGraph's line

    caplog.clear()
    with pytest.raises(UnstorableResultError, match=r"allowed_types=\[RefusedShade\]"):
        ResultSerializer().dumps(RefusedShade.RED)
    assert "allowed_msgpack_modules" not in caplog.text
    assert "Blocked deserialization" not in caplog.text


def test_objects_that_cannot_be_encoded_are_refused() -> None:
    with pytest.raises(UnstorableResultError, match="cannot be stored"):
        ResultSerializer().dumps(object())


def test_the_size_limit_is_a_clear_error() -> None:
    with pytest.raises(ResultTooLargeError, match="max_result_bytes=100"):
        ResultSerializer(max_bytes=100).dumps("x" * 1000, key="k")


def test_a_pickle_payload_is_refused_and_never_executed(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self) -> tuple[object, ...]:
            return (marker.touch, ())

    for payload in (b"pickle\n" + pickle.dumps(Evil()), pickle.dumps(Evil())):
        with pytest.raises(CorruptRecordError):
            ResultSerializer().loads(payload, key="k")
    assert not marker.exists()


@pytest.mark.parametrize(
    "payload", [b"", b"msgpack\n\xc1\xc1\xc1", b"garbage", b"msgpack\n", b"json\n{", None]
)
def test_garbage_payloads_raise_corrupt_record(payload: bytes | None) -> None:
    with pytest.raises(CorruptRecordError) as info:
        ResultSerializer().loads(payload, key="the-key")
    assert info.value.key == "the-key"


def test_a_failure_round_trips_to_the_listed_exception_class() -> None:
    s = ResultSerializer()

    class Declined(Exception):
        pass

    failure = s.loads_failure(s.dumps_failure(Declined("card declined")))
    rebuilt = failure.rebuild([Declined])
    assert isinstance(rebuilt, Declined) and str(rebuilt) == "card declined"


def test_an_unlisted_failure_class_replays_as_a_tool_exception() -> None:
    from langchain_core.tools import ToolException

    s = ResultSerializer()
    rebuilt = s.loads_failure(s.dumps_failure(KeyError("gone"))).rebuild([])
    assert isinstance(rebuilt, ToolException) and "KeyError" in str(rebuilt)


@pytest.mark.parametrize(
    ("result", "error", "max_bytes"),
    [
        (Status.REFUNDED, UnstorableResultError, 1 << 20),
        (object(), UnstorableResultError, 1 << 20),
        ("x" * 5000, ResultTooLargeError, 1000),
    ],
    ids=["enum outside the allow-list", "not encodable", "too large"],
)
def test_a_refused_result_is_one_error_for_the_first_caller_and_every_retry(
    result: object, error: type[UnstorableResultError], max_bytes: int
) -> None:
    engine = Engine(InMemoryIdempotencyStore(), Policy(max_result_bytes=max_bytes))
    runs: list[int] = []

    def action() -> object:
        runs.append(1)
        return result

    raised = []
    for _ in range(3):
        with pytest.raises(error) as info:
            engine.run("refund:42", fingerprint="f", action=action)
        raised.append(info.value)
    assert len(runs) == 1  # the effect happened once; its error is what retries get
    first, *retries = raised
    for retry in retries:
        assert type(retry) is type(first) and str(retry) == str(first)
        assert retry.key == first.key == "refund:42"
    message = str(first)
    assert "`langchain-idempotent delete refund:42`" in message
    assert "changing allowed_types or max_result_bytes alone does not clear it" in message


def test_a_stored_refusal_rebuilds_as_its_class_with_the_records_key() -> None:
    s = ResultSerializer(max_bytes=100)
    with pytest.raises(ResultTooLargeError) as info:
        s.dumps("x" * 1000, key="k1")
    rebuilt = s.loads_failure(s.dumps_failure(info.value), key="k1").rebuild([])
    assert type(rebuilt) is ResultTooLargeError
    assert isinstance(rebuilt, UnstorableResultError) and not isinstance(rebuilt, ToolException)
    assert str(rebuilt) == str(info.value) and rebuilt.key == "k1"


def _types(value: object) -> object:
    """The type of every node in a result, nested like the result."""
    if isinstance(value, list | tuple):
        return (type(value), [_types(v) for v in value])
    if isinstance(value, dict):
        return (type(value), {k: _types(v) for k, v in value.items()})
    return type(value)


# -- one rule: a replay is the first answer, by type and value, all the way down ----------


def test_a_zoned_datetime_replays_with_its_zone_not_its_current_offset() -> None:
    from zoneinfo import ZoneInfo

    berlin = ZoneInfo("Europe/Berlin")
    before = dt.datetime(2026, 3, 28, 12, 0, tzinfo=berlin)  # the day before DST starts
    # LangGraph's encoding keeps only the offset: equal now, an hour off a day later.
    plain = JsonPlusSerializer(pickle_fallback=False)
    offset_only = plain.loads_typed(plain.dumps_typed(before))
    assert offset_only == before and type(offset_only.tzinfo) is not ZoneInfo
    assert (offset_only + dt.timedelta(days=1)).utcoffset() == dt.timedelta(hours=1)

    s = ResultSerializer()
    back = s.loads(s.dumps({"at": [before]}))["at"][0]
    assert back.tzinfo is berlin
    assert (back + dt.timedelta(days=1)).utcoffset() == dt.timedelta(hours=2)


@pytest.mark.parametrize(
    "value",
    [(1, (2, 3)), [(1, 2), [3]], {"pair": ("a", ("b",))}, [frozenset({(1, "a")})], ((),)],
    ids=repr,
)
def test_tuples_replay_as_tuples_and_lists_as_lists_at_any_depth(value: object) -> None:
    s = ResultSerializer()
    back = s.loads(s.dumps(value))
    assert _types(back) == _types(value) and back == value


def test_a_model_replayed_where_its_type_is_not_allowed_is_a_corrupt_record_not_a_dict() -> None:
    payload = ResultSerializer(allowed_types=[Refund, Status]).dumps(
        Refund(status=Status.REFUNDED, amount=1.0), key="k9"
    )
    with pytest.raises(CorruptRecordError) as info:
        # A worker of a rolling deploy that allows the enum but not (yet) the model.
        ResultSerializer(allowed_types=[Status]).loads(payload, key="k9")
    message = str(info.value)
    assert "tests.test_serde.Refund" in message
    assert "allowed_types=[Refund]" in message
    assert "langchain-idempotent delete k9" in message
    assert info.value.key == "k9"


def test_a_plain_allowed_object_replays_as_itself_without_running_its_init() -> None:
    class Probe:
        inits = 0

        def __init__(self, x: int) -> None:
            type(self).inits += 1
            self.x = x

    s = ResultSerializer(allowed_types=[Probe])
    back = s.loads(s.dumps([Probe(4)]))[0]
    assert type(back) is Probe and back.x == 4
    assert Probe.inits == 1
