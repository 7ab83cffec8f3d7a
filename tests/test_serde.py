"""Results come back as they went in; unreadable records are refused, never executed."""

from __future__ import annotations

import dataclasses
import datetime as dt
import pickle
import uuid
from decimal import Decimal
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage, ToolMessage
from langgraph.types import Command
from pydantic import BaseModel

from langchain_idempotent import CorruptRecordError, ResultTooLargeError
from langchain_idempotent.serde import ResultSerializer


class Receipt(BaseModel):
    refund_id: str
    amount: Decimal


@dataclasses.dataclass
class Ticket:
    id: int
    tags: list[str]


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
    with pytest.raises(ValueError, match="allowed_types"):
        ResultSerializer().dumps(Receipt(refund_id="re_1", amount=Decimal(1)))


def test_objects_that_cannot_be_encoded_are_refused() -> None:
    with pytest.raises(ValueError, match="cannot be stored"):
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
