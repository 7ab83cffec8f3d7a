"""The pure decision table of :mod:`langchain_idempotent.core.protocol`, row by row and as
properties.

The unit tests pin every row of the claim/renew/complete/release tables; the hypothesis
tests drive random sequences of operations by several owners over a moving clock (leases
do expire here: time is a plain integer) and check the invariants every store inherits:
fences never decrease, at most one owner holds a live lease at any instant, and once a
key is done its payload never changes.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from langchain_idempotent.core.protocol import (
    decide_abandon,
    decide_claim,
    decide_complete,
    decide_mark_effect,
    decide_release,
    decide_renew,
)
from langchain_idempotent.core.record import (
    FORMAT_VERSION,
    Claim,
    ClaimOutcome,
    Completion,
    ExpiredPolicy,
    Record,
    State,
)

KEY = "k"
FP = "fp"
LEASE = 100
T0 = 1_000


def claim(
    rec: Record | None,
    owner: str = "a",
    *,
    now: int = T0,
    fingerprint: str = FP,
    lease_ms: int = LEASE,
    on_expired: ExpiredPolicy = "takeover",
    meta: dict[str, str] | None = None,
) -> tuple[Claim, Record | None]:
    return decide_claim(
        rec,
        key=KEY,
        owner=owner,
        fingerprint=fingerprint,
        now=now,
        lease_ms=lease_ms,
        on_expired=on_expired,
        meta=meta,
    )


def complete(
    rec: Record | None,
    owner: str = "a",
    fence: int = 1,
    payload: bytes = b"result",
    *,
    failed: bool = False,
    now: int = T0 + 10,
    meta: dict[str, str] | None = None,
) -> tuple[Completion, Record | None]:
    return decide_complete(
        rec,
        key=KEY,
        owner=owner,
        fence=fence,
        fingerprint=FP,
        payload=payload,
        failed=failed,
        now=now,
        meta=meta,
    )


def running(owner: str = "a", *, fence: int = 1, lease_until: int = T0 + LEASE) -> Record:
    """A RUNNING record, as if ``owner`` claimed it at ``T0``."""
    return Record(
        key=KEY,
        state=State.RUNNING,
        owner=owner,
        fence=fence,
        lease_until=lease_until,
        fingerprint=FP,
        attempt=fence,
        payload=None,
        created_at=T0,
        updated_at=T0,
        meta={"thread_id": "t"},
    )


def written(rec: Record | None) -> Record:
    assert rec is not None, "expected a record to write"
    return rec


# -- claim ---------------------------------------------------------------------------------


def test_claiming_an_absent_key_acquires_fence_1_attempt_1_with_a_fresh_lease() -> None:
    meta = {"namespace": "ns", "thread_id": "t"}
    answer, new = claim(None, "a", meta=meta)
    assert answer == Claim(ClaimOutcome.ACQUIRED, fence=1, attempt=1)
    rec = written(new)
    assert (rec.key, rec.state, rec.owner, rec.fence, rec.attempt) == (
        KEY,
        State.RUNNING,
        "a",
        1,
        1,
    )
    assert (rec.lease_until, rec.created_at, rec.updated_at) == (T0 + LEASE, T0, T0)
    assert (rec.fingerprint, rec.payload, rec.version) == (FP, None, FORMAT_VERSION)
    assert rec.meta == meta


def test_the_new_record_keeps_a_copy_of_meta_not_the_callers_dict() -> None:
    meta = {"thread_id": "t"}
    _, new = claim(None, meta=meta)
    meta["thread_id"] = "changed"
    assert written(new).meta == {"thread_id": "t"}


@pytest.mark.parametrize(
    "rec",
    [
        running("a"),
        running("b", lease_until=T0 - 1),
        replace(running("a"), state=State.FREE, owner="", lease_until=0),
        replace(running("a"), state=State.COMPLETED, lease_until=0, payload=b"r"),
        replace(running("a"), state=State.FAILED, lease_until=0, payload=b"e"),
    ],
    ids=["running", "expired", "free", "completed", "failed"],
)
@pytest.mark.parametrize("policy", ["takeover", "raise"])
def test_another_fingerprint_is_a_mismatch_in_every_state_and_writes_nothing(
    rec: Record, policy: ExpiredPolicy
) -> None:
    for owner in ("a", "b"):
        answer, new = claim(rec, owner, fingerprint="other", on_expired=policy)
        assert answer == Claim(ClaimOutcome.MISMATCH, fence=rec.fence, attempt=rec.attempt)
        assert new is None


@pytest.mark.parametrize("failed", [False, True])
@pytest.mark.parametrize("payload", [b"", b"\x00", b"r"])
def test_a_done_key_replays_its_payload_and_failed_flag_and_writes_nothing(
    failed: bool, payload: bytes
) -> None:
    state = State.FAILED if failed else State.COMPLETED
    rec = replace(running("a", fence=3), state=state, lease_until=0, payload=payload)
    for owner in ("a", "b"):
        answer, new = claim(rec, owner, now=T0 + 10**6)
        assert answer == Claim(
            ClaimOutcome.REPLAY, fence=3, attempt=3, failed=failed, payload=payload
        )
        assert new is None


def test_a_free_key_is_acquired_with_the_next_fence_and_attempt() -> None:
    free = replace(running("a", fence=4), state=State.FREE, owner="", lease_until=0)
    answer, new = claim(free, "b", now=T0 + 50)
    assert answer == Claim(ClaimOutcome.ACQUIRED, fence=5, attempt=5)
    rec = written(new)
    assert (rec.state, rec.owner, rec.fence, rec.lease_until) == (
        State.RUNNING,
        "b",
        5,
        T0 + 50 + LEASE,
    )
    assert (rec.created_at, rec.updated_at, rec.meta) == (T0, T0 + 50, free.meta)


@pytest.mark.parametrize("policy", ["takeover", "raise"])
@pytest.mark.parametrize("lease_until", [T0 + 5, T0 - 5], ids=["live", "expired"])
def test_a_retried_claim_by_the_owner_is_owned_with_the_same_fence_and_a_new_lease(
    policy: ExpiredPolicy, lease_until: int
) -> None:
    rec = running("a", fence=2, lease_until=lease_until)
    answer, new = claim(rec, "a", lease_ms=300, on_expired=policy)
    assert answer == Claim(ClaimOutcome.OWNED, fence=2, attempt=2)
    assert written(new) == replace(rec, lease_until=T0 + 300, updated_at=T0)


@pytest.mark.parametrize("policy", ["takeover", "raise"])
def test_a_live_lease_of_another_owner_is_busy_with_the_time_left(policy: ExpiredPolicy) -> None:
    answer, new = claim(running("a", lease_until=T0 + 37), "b", on_expired=policy)
    assert answer == Claim(ClaimOutcome.BUSY, fence=1, attempt=1, retry_after_ms=37)
    assert new is None


def test_a_lease_ending_exactly_now_has_expired() -> None:
    answer, _ = claim(running("a", lease_until=T0), "b")
    assert answer.outcome is ClaimOutcome.TAKEOVER
    answer, _ = claim(running("a", lease_until=T0 + 1), "b")
    assert (answer.outcome, answer.retry_after_ms) == (ClaimOutcome.BUSY, 1)


def test_an_expired_lease_is_taken_over_with_the_next_fence_and_attempt() -> None:
    rec = running("a", fence=2, lease_until=T0 - 1)
    answer, new = claim(rec, "b", lease_ms=250)
    assert answer == Claim(ClaimOutcome.TAKEOVER, fence=3, attempt=3, reason="lease_expired")
    assert written(new) == replace(
        rec, owner="b", fence=3, attempt=3, lease_until=T0 + 250, updated_at=T0
    )


def test_an_expired_lease_is_reported_under_raise_and_nothing_is_written() -> None:
    answer, new = claim(running("a", fence=2, lease_until=T0 - 1), "b", on_expired="raise")
    assert answer == Claim(ClaimOutcome.EXPIRED, fence=2, attempt=2, reason="lease_expired")
    assert new is None


def test_only_acquired_takeover_retry_and_owned_run_the_tool() -> None:
    assert {o for o in ClaimOutcome if o.runs} == {
        ClaimOutcome.ACQUIRED,
        ClaimOutcome.TAKEOVER,
        ClaimOutcome.RETRY,
        ClaimOutcome.OWNED,
    }


# -- renew ---------------------------------------------------------------------------------


def test_renew_extends_the_lease_of_the_owner_and_fence() -> None:
    rec = running("a", fence=2, lease_until=T0 + 5)
    ok, new = decide_renew(rec, owner="a", fence=2, now=T0, lease_ms=500)
    assert ok
    assert written(new) == replace(rec, lease_until=T0 + 500, updated_at=T0)


def test_renew_after_expiry_but_before_a_takeover_still_succeeds() -> None:
    ok, new = decide_renew(
        running("a", lease_until=T0 - 50), owner="a", fence=1, now=T0, lease_ms=9
    )
    assert ok
    assert written(new).lease_until == T0 + 9


@pytest.mark.parametrize(
    ("rec", "owner", "fence"),
    [
        (None, "a", 1),
        (running("a"), "b", 1),
        (running("a", fence=2), "a", 1),
        (running("a", fence=2), "a", 3),
        (replace(running("a"), state=State.FREE, owner="", lease_until=0), "a", 1),
        (replace(running("a"), state=State.COMPLETED, lease_until=0, payload=b""), "a", 1),
        (replace(running("a"), state=State.FAILED, lease_until=0, payload=b""), "a", 1),
    ],
    ids=["absent", "other-owner", "old-fence", "future-fence", "free", "completed", "failed"],
)
def test_renew_refuses_anyone_but_the_running_owner_and_fence(
    rec: Record | None, owner: str, fence: int
) -> None:
    assert decide_renew(rec, owner=owner, fence=fence, now=T0, lease_ms=LEASE) == (False, None)


# -- release -------------------------------------------------------------------------------


def test_release_frees_the_key_and_keeps_the_fence() -> None:
    rec = running("a", fence=3)
    ok, new = decide_release(rec, owner="a", fence=3, now=T0 + 7)
    assert ok
    assert written(new) == replace(
        rec, state=State.FREE, owner="", lease_until=0, updated_at=T0 + 7
    )


@pytest.mark.parametrize(
    ("rec", "owner", "fence"),
    [
        (None, "a", 1),
        (running("a"), "b", 1),
        (running("a", fence=2), "a", 1),
        (replace(running("a"), state=State.FREE, owner="", lease_until=0), "", 1),
        (replace(running("a"), state=State.COMPLETED, lease_until=0, payload=b""), "a", 1),
    ],
    ids=["absent", "other-owner", "old-fence", "free", "completed"],
)
def test_release_refuses_anyone_but_the_running_owner_and_fence(
    rec: Record | None, owner: str, fence: int
) -> None:
    assert decide_release(rec, owner=owner, fence=fence, now=T0) == (False, None)


# -- complete ------------------------------------------------------------------------------


@pytest.mark.parametrize("failed", [False, True])
def test_the_owners_completion_is_stored_and_drops_the_lease(failed: bool) -> None:
    rec = running("a", fence=2)
    answer, new = complete(rec, "a", 2, b"", failed=failed, now=T0 + 9)
    assert answer == Completion(stored=True, stale=False, failed=failed, payload=b"")
    assert written(new) == replace(
        rec,
        state=State.FAILED if failed else State.COMPLETED,
        lease_until=0,
        payload=b"",
        updated_at=T0 + 9,
    )


def test_a_second_completion_stores_nothing_and_returns_the_stored_payload() -> None:
    _, done = complete(running("a"), "a", 1, b"first", failed=True)
    answer, new = complete(written(done), "a", 1, b"second")
    assert answer == Completion(stored=False, stale=False, failed=True, payload=b"first")
    assert new is None
    answer, new = complete(written(done), "b", 2, b"third")
    assert answer == Completion(stored=False, stale=True, failed=True, payload=b"first")
    assert new is None


def test_a_stale_owners_first_completion_after_a_takeover_is_stored_as_stale() -> None:
    _, taken = claim(running("a", lease_until=T0 - 1), "b")
    answer, new = complete(written(taken), "a", 1, b"from-a")
    assert answer == Completion(stored=True, stale=True, failed=False, payload=b"from-a")
    rec = written(new)
    assert (rec.state, rec.payload, rec.owner) == (State.COMPLETED, b"from-a", "a")
    assert rec.fence == 2, "the record's fence never goes back to the stale owner's"
    # The new owner then gets the stale owner's payload back.
    answer, _ = complete(rec, "b", 2, b"from-b")
    assert (answer.stored, answer.payload) == (False, b"from-a")


def test_a_completion_on_a_free_key_is_stored_as_stale() -> None:
    _, free = decide_release(running("a"), owner="a", fence=1, now=T0)
    answer, new = complete(written(free), "a", 1, b"late")
    assert answer == Completion(stored=True, stale=True, failed=False, payload=b"late")
    assert written(new).state is State.COMPLETED


def test_a_completion_for_a_vanished_record_creates_it_as_stale() -> None:
    answer, new = complete(None, "a", 4, b"orphan", now=T0 + 3, meta={"thread_id": "t"})
    assert answer == Completion(stored=True, stale=True, failed=False, payload=b"orphan")
    rec = written(new)
    assert (rec.key, rec.state, rec.owner, rec.fence, rec.fingerprint) == (
        KEY,
        State.COMPLETED,
        "a",
        4,
        FP,
    )
    assert (rec.payload, rec.lease_until, rec.created_at, rec.meta) == (
        b"orphan",
        0,
        T0 + 3,
        {"thread_id": "t"},
    )


# -- properties over random histories -------------------------------------------------------

OWNERS = ("a", "b", "c")
Kind = Literal["claim", "renew", "complete", "release", "tick"]


@dataclass(frozen=True)
class Op:
    kind: Kind
    owner: str
    #: ``None``: the fence this owner was last granted; otherwise an arbitrary fence.
    fence: int | None
    other_fingerprint: bool
    report: bool
    payload: bytes
    failed: bool
    #: For ``tick``: how far the clock moves (leases are ``LEASE`` ms long).
    advance: int


# Each operation is decoded from one integer: one draw per step keeps generation cheap, and
# the weights let histories reach busy leases, takeovers and releases before a completion
# ends them.
_KINDS: tuple[Kind, ...] = ("claim",) * 4 + ("tick",) * 2 + ("renew", "release", "complete")
_FENCES = (None, None, None, 0, 1, 2, 3, 5)
_PAYLOADS = (b"", b"x", b"y", b"\x00")
_ADVANCES = (1, LEASE // 2, LEASE - 1, LEASE, 2 * LEASE)
_RADIX = (len(_KINDS), len(OWNERS), len(_ADVANCES), len(_FENCES), len(_PAYLOADS), 2, 2, 16)


def decode(n: int) -> Op:
    digits = []
    for radix in _RADIX:
        n, digit = divmod(n, radix)
        digits.append(digit)
    kind, owner, advance, fence, payload, failed, report, other = digits
    return Op(
        kind=_KINDS[kind],
        owner=OWNERS[owner],
        fence=_FENCES[fence],
        other_fingerprint=other == 15,
        report=bool(report),
        payload=_PAYLOADS[payload],
        failed=bool(failed),
        advance=_ADVANCES[advance],
    )


#: Hypothesis favours small integers; scrambling (Knuth's multiplicative hash) spreads its
#: draws evenly over every digit, and 0 still decodes to the simplest step (a claim by "a").
OPS = st.integers(0, 2**32 - 1).map(lambda n: decode(n * 2654435761 % 2**32))


class History:
    """Applies operations to one key; tracks, from the answers alone, who holds a lease."""

    def __init__(self) -> None:
        self.rec: Record | None = None
        self.now = T0
        self.granted: dict[str, int] = {}  # owner -> last fence granted to it
        self.leases: dict[str, int] = {}  # owner -> lease deadline, per the answers

    def apply(self, op: Op) -> tuple[object, Record | None]:
        """Apply ``op``; returns the answer and the record it wrote (``None``: none)."""
        if op.kind == "tick":
            self.now += op.advance
            return None, None
        fence = self.granted.get(op.owner, 0) if op.fence is None else op.fence
        answer: object
        new: Record | None
        if op.kind == "claim":
            answer, new = claim(
                self.rec,
                op.owner,
                now=self.now,
                fingerprint="other" if op.other_fingerprint else FP,
                on_expired="raise" if op.report else "takeover",
            )
            if answer.outcome.runs:
                self.granted[op.owner] = answer.fence
                self.leases[op.owner] = self.now + LEASE
        elif op.kind == "renew":
            answer, new = decide_renew(
                self.rec, owner=op.owner, fence=fence, now=self.now, lease_ms=LEASE
            )
            if answer:
                self.leases[op.owner] = self.now + LEASE
        elif op.kind == "release":
            answer, new = decide_release(self.rec, owner=op.owner, fence=fence, now=self.now)
            if answer:
                del self.leases[op.owner]
        else:
            answer, new = complete(
                self.rec, op.owner, fence, op.payload, failed=op.failed, now=self.now
            )
            if answer.stored:
                self.leases.clear()  # the record is done: no lease survives it
        if new is not None:
            self.rec = new
        return answer, new

    def live_owners(self) -> list[str]:
        return [o for o, until in self.leases.items() if until > self.now]


HISTORIES = st.lists(OPS, min_size=8, max_size=40)
PROPERTY = settings(max_examples=150, deadline=None)


@PROPERTY
@given(HISTORIES)
def test_fences_never_decrease_and_every_fresh_lease_gets_a_higher_fence(ops: list[Op]) -> None:
    h = History()
    highest = 0
    for op in ops:
        before = h.rec
        answer, _ = h.apply(op)
        if before is not None:
            assert h.rec is not None
            assert h.rec.fence >= before.fence, "the fence went down"
            assert h.rec.attempt >= before.attempt, "the attempt went down"
        if isinstance(answer, Claim) and answer.outcome.runs:
            if answer.outcome is ClaimOutcome.OWNED:
                assert answer.fence == highest, "a retried claim changed the fence"
            else:
                assert answer.fence > highest, "a fresh lease reused a fence"
            highest = answer.fence


@PROPERTY
@given(HISTORIES)
def test_at_most_one_owner_holds_a_live_lease_at_any_time(ops: list[Op]) -> None:
    h = History()
    for op in ops:
        h.apply(op)
        live = h.live_owners()
        assert len(live) <= 1, f"several owners hold a live lease: {live}"
        if live:
            assert h.rec is not None
            assert h.rec.lease_live(h.now)
            assert (h.rec.owner, h.rec.fence) == (live[0], h.granted[live[0]])


@PROPERTY
@given(HISTORIES)
def test_once_done_the_payload_never_changes(ops: list[Op]) -> None:
    h = History()
    for op in ops:
        before = h.rec
        h.apply(op)
        if before is not None and before.done:
            assert h.rec == before, "a done record changed"
        if h.rec is not None and h.rec.done:
            replay, _ = claim(h.rec, op.owner, now=h.now, fingerprint=h.rec.fingerprint)
            assert (replay.outcome, replay.payload) == (ClaimOutcome.REPLAY, h.rec.payload)
            again, _ = complete(h.rec, op.owner, 99, b"other", now=h.now)
            assert (again.stored, again.payload) == (False, h.rec.payload)


@PROPERTY
@given(HISTORIES)
def test_refusals_never_write_and_grants_always_do(ops: list[Op]) -> None:
    h = History()
    for op in ops:
        answer, new = h.apply(op)
        if isinstance(answer, Claim):
            assert (new is not None) == answer.outcome.runs, answer
        elif isinstance(answer, Completion):
            assert (new is not None) == answer.stored, answer
        elif isinstance(answer, bool):
            assert (new is not None) == answer


# -- abandon: a cancelled owner leaves the key uncertain --------------------------------


def test_an_owner_abandons_its_running_key_keeping_fence_and_attempt() -> None:
    rec = running("a", fence=2, lease_until=T0 + 1000)
    ok, new = decide_abandon(rec, owner="a", fence=2, reason="cancelled", now=T0)
    assert ok
    assert written(new) == replace(rec, owner="!cancelled", lease_until=0, updated_at=T0)
    assert written(new).uncertain(T0)


def test_the_claim_after_an_abandon_is_a_takeover_told_why_even_within_the_old_lease() -> None:
    _, new = decide_abandon(
        running("a", fence=2, lease_until=T0 + 1000), owner="a", fence=2, reason="cancelled", now=T0
    )
    answer, taken = claim(written(new), "b", lease_ms=250)
    assert answer == Claim(ClaimOutcome.TAKEOVER, fence=3, attempt=3, reason="cancelled")
    assert written(taken).owner == "b"
    raised, unchanged = claim(written(new), "b", on_expired="raise")
    assert raised == Claim(ClaimOutcome.EXPIRED, fence=2, attempt=2, reason="cancelled")
    assert unchanged is None


@pytest.mark.parametrize(
    ("owner", "fence"), [("b", 2), ("a", 1), ("a", 3)], ids=["other owner", "old", "newer"]
)
def test_only_the_owner_at_its_fence_abandons(owner: str, fence: int) -> None:
    rec = running("a", fence=2, lease_until=T0 + 1000)
    assert decide_abandon(rec, owner=owner, fence=fence, reason="cancelled", now=T0) == (
        False,
        None,
    )


def test_a_free_done_or_absent_key_cannot_be_abandoned() -> None:
    free = replace(running("a", fence=2, lease_until=0), state=State.FREE, owner="")
    for rec in (None, free, replace(running("a", fence=2, lease_until=0), state=State.COMPLETED)):
        assert decide_abandon(rec, owner="a", fence=2, reason="cancelled", now=T0) == (False, None)


def test_a_released_key_is_acquired_not_taken_over() -> None:
    _, free = decide_release(
        running("a", fence=2, lease_until=T0 + 1000), owner="a", fence=2, now=T0
    )
    answer, _ = claim(written(free), "b")
    assert (answer.outcome, answer.reason) == (ClaimOutcome.ACQUIRED, None)


# -- the side-effect mark ------------------------------------------------------------------


def _marked(effect: str) -> Record:
    _, rec = decide_claim(
        None, key=KEY, owner="a", fingerprint=FP, now=T0, lease_ms=LEASE, boundary=True
    )
    assert rec is not None and rec.effect == "before"
    if effect == "entered":
        ok, rec = decide_mark_effect(rec, owner="a", fence=1, now=T0 + 1)
        assert ok and rec is not None
    return rec


@pytest.mark.parametrize("policy", ["takeover", "raise"])
def test_an_expired_attempt_still_before_its_effect_is_retried_cleanly(
    policy: ExpiredPolicy,
) -> None:
    answer, new = claim(_marked("before"), "b", now=T0 + LEASE, on_expired=policy)
    assert (answer.outcome, answer.fence, answer.attempt) == (ClaimOutcome.RETRY, 2, 2)
    assert (answer.reason, answer.entered) == ("lease_expired", False)
    assert new is not None and (new.owner, new.effect) == ("b", "unmarked")


@pytest.mark.parametrize(
    ("policy", "outcome"),
    [("takeover", ClaimOutcome.TAKEOVER), ("raise", ClaimOutcome.EXPIRED)],
)
def test_an_expired_attempt_that_entered_its_effect_is_uncertain_and_says_so(
    policy: ExpiredPolicy, outcome: ClaimOutcome
) -> None:
    answer, _ = claim(_marked("entered"), "b", now=T0 + LEASE, on_expired=policy)
    assert (answer.outcome, answer.entered) == (outcome, True)


def test_an_unmarked_attempt_is_uncertain_but_not_known_to_have_entered() -> None:
    rec, _ = claim(None)[1], None
    answer, _ = claim(rec, "b", now=T0 + LEASE)
    assert (answer.outcome, answer.entered) == (ClaimOutcome.TAKEOVER, False)


def test_only_the_running_owner_at_its_fence_marks_its_effect() -> None:
    rec = _marked("before")
    assert decide_mark_effect(rec, owner="b", fence=1, now=T0) == (False, None)
    assert decide_mark_effect(rec, owner="a", fence=2, now=T0) == (False, None)
    assert decide_mark_effect(None, owner="a", fence=1, now=T0) == (False, None)
    ok, new = decide_mark_effect(rec, owner="a", fence=1, now=T0 + 5)
    assert ok and new == replace(rec, effect="entered", updated_at=T0 + 5)


def test_a_completion_keeps_every_field_it_does_not_decide() -> None:
    before = replace(running(fence=3), attempt=2, effect="entered")
    done = written(complete(before, fence=3, payload=b"ok", now=T0 + 50)[1])
    decided = {"state", "owner", "fence", "lease_until", "payload", "updated_at"}
    for f in fields(Record):
        if f.name not in decided:
            assert getattr(done, f.name) == getattr(before, f.name), f.name
    assert (done.state, done.lease_until, done.payload, done.updated_at) == (
        State.COMPLETED,
        0,
        b"ok",
        T0 + 50,
    )
