"""The value objects a call builds keep their dataclass behaviour under the cheaper
``__init__`` (:mod:`langchain_idempotent.core._frozen`): the same signature, defaults,
factories and ``__post_init__``; equality, hash, repr, pickling and immutability."""

from __future__ import annotations

import dataclasses
import inspect
import pickle
from typing import Any

import pytest

from langchain_idempotent.core._callinfo import CallInfo
from langchain_idempotent.core._frozen import fast_init
from langchain_idempotent.core.context import IdempotencyContext
from langchain_idempotent.core.engine import Claimed
from langchain_idempotent.core.events import IdempotencyEvent
from langchain_idempotent.core.keys import DerivedKey
from langchain_idempotent.core.record import Claim, ClaimOutcome, Completion, Record, State
from langchain_idempotent.core.store import ClaimRequest, CompleteRequest

FAST = [
    Record,
    Claim,
    Completion,
    ClaimRequest,
    CompleteRequest,
    IdempotencyContext,
    DerivedKey,
    CallInfo,
    IdempotencyEvent,
    Claimed,
]


def _generated(cls: type) -> type:
    """The same fields as a dataclass with the generated ``__init__`` (not sped up)."""
    fields = [(f.name, f.type, f) for f in dataclasses.fields(cls)]
    return dataclasses.make_dataclass(cls.__name__, fields, frozen=True, slots=True)


def _record(**changes: Any) -> Record:
    values: dict[str, Any] = dict(
        key="k",
        state=State.RUNNING,
        owner="o",
        fence=1,
        lease_until=5,
        fingerprint="f",
        attempt=1,
        payload=None,
        created_at=1,
        updated_at=2,
    )
    return Record(**{**values, **changes})


@pytest.mark.parametrize("cls", FAST, ids=lambda c: c.__name__)
def test_the_fast_init_keeps_the_signature(cls: type) -> None:
    assert "__init__" in cls.__dict__
    assert cls.__init__.__code__.co_filename == "<string>"  # type: ignore[misc]
    assert str(inspect.signature(cls)) == str(inspect.signature(_generated(cls)))


def test_a_record_is_the_same_value_as_the_dataclass_makes() -> None:
    plain = _generated(Record)
    fast = _record()
    slow = plain(**{f.name: getattr(fast, f.name) for f in dataclasses.fields(Record)})
    assert plain.__init__.__code__.co_filename == "<string>"  # the dataclass's own
    assert repr(fast) == repr(slow).replace(plain.__qualname__, Record.__qualname__)
    assert fast == _record()
    with pytest.raises(TypeError, match="unhashable"):  # its meta is a dict, as before
        hash(fast)
    with pytest.raises(TypeError, match="unhashable"):
        hash(slow)
    claim = Claim(ClaimOutcome.REPLAY, 2, 1, payload=b"x")
    assert hash(claim) == hash(_generated(Claim)(ClaimOutcome.REPLAY, 2, 1, payload=b"x"))
    assert fast != _record(fence=2)
    assert fast.meta == {} and fast.meta is not _record().meta  # a fresh factory value
    assert pickle.loads(pickle.dumps(fast)) == fast
    assert dataclasses.replace(fast, fence=3).fence == 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.fence = 2  # type: ignore[misc]
    assert not hasattr(fast, "__dict__")


def test_positional_keyword_and_default_arguments_land_in_their_fields() -> None:
    claim = Claim(ClaimOutcome.BUSY, retry_after_ms=7)
    assert (claim.outcome, claim.fence, claim.retry_after_ms, claim.payload) == (
        ClaimOutcome.BUSY,
        0,
        7,
        None,
    )
    assert claim == Claim(outcome=ClaimOutcome.BUSY, fence=0, attempt=0, retry_after_ms=7)
    with pytest.raises(TypeError):
        Claim()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Claim(ClaimOutcome.BUSY, nope=1)  # type: ignore[call-arg]


def test_post_init_still_checks_a_claim_request() -> None:
    with pytest.raises(ValueError, match="non-empty string key"):
        ClaimRequest("", "o", "f", 1, 1)
    request = ClaimRequest("k", "o", "f", 1, 1, boundary=True)
    assert request.boundary and request.on_expired == "takeover"


def test_each_context_gets_its_own_factory_values() -> None:
    a = IdempotencyContext("k", 1, 1, False, "o")
    b = IdempotencyContext("k", 1, 1, False, "o")
    assert a == b and a._boundary is not b._boundary and a._journal is not b._journal
    assert "_lease" not in repr(a)


def test_a_class_it_cannot_cover_is_left_as_it_is() -> None:
    @dataclasses.dataclass(frozen=True)
    class NotSlotted:
        x: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class LeftOut:
        x: int
        y: int = dataclasses.field(init=False, default=0)

    for cls in (NotSlotted, LeftOut):
        init = cls.__init__
        assert fast_init(cls).__init__ is init  # type: ignore[misc]
