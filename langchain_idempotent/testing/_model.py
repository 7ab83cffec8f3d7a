"""Model-based: random operation sequences, run on the store and on a pure model built from
the protocol functions (:mod:`langchain_idempotent.core.protocol`), must get identical answers
and leave identical records."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ..core.protocol import (
    decide_abandon,
    decide_claim,
    decide_complete,
    decide_mark_effect,
    decide_release,
    decide_renew,
)
from ..core.record import Claim, ClaimOutcome, ExpiredPolicy, Record, abandon_kwargs
from ._faces import FP, LONG_MS, OTHER_FP, ContractBase, Face, run_inline

T = TypeVar("T")
#: Runs one async-face call on the test's loop, from the hypothesis thread.
Runner = Callable[[Coroutine[Any, Any, Any]], Any]


class ModelContract(ContractBase):
    async def test_random_operation_sequences_agree_with_the_protocol_model(
        self, face: Face
    ) -> None:
        """On the sync face every operation is sync and runs on this thread. On the async
        face hypothesis runs in a worker thread and each operation goes, at random, through
        the async twin (on this loop) or the sync operation, so both faces share records."""
        loop = asyncio.get_running_loop()

        def on_loop(call: Coroutine[Any, Any, T]) -> T:
            return asyncio.run_coroutine_threadsafe(call, loop).result(timeout=30)

        @settings(
            max_examples=self.model_examples,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        )
        @given(ops=_OPS)
        def run(ops: list[_Op]) -> None:
            _Harness(face, on_loop).run(ops)

        if face.name == "sync":
            run()
        else:
            await asyncio.to_thread(run)


# -- operations ---------------------------------------------------------------------------

_Kind = Literal["claim", "renew", "complete", "release", "abandon", "mark_effect"]
_PAYLOADS = (b"", b"r1", b"\x00\xff", b"result-3")


@dataclass(frozen=True)
class _Op:
    kind: _Kind
    key: int
    owner: int
    #: ``None``: the fence this owner was last granted on this key (0 if none).
    fence: int | None
    other_fingerprint: bool
    raise_on_expired: bool
    payload: int
    failed: bool
    #: On the async face: through the async twin (else through the sync operation).
    via_async: bool
    #: For a claim: the tool marks its side effect.
    boundary: bool


_KINDS: tuple[_Kind, ...] = ("claim",) * 3 + (
    "renew",
    "release",
    "release",
    "complete",
    "abandon",
    "mark_effect",
)
_FENCES = (None, None, None, 0, 1, 2, 3)
_RADIX = (len(_KINDS), 2, 3, len(_FENCES), len(_PAYLOADS), 2, 2, 2, 8, 2)


def _decode(n: int) -> _Op:
    """One operation from one integer (one draw per step keeps generation cheap)."""
    n = n * 2654435761 % 2**32  # spread hypothesis' small integers over every digit
    digits = []
    for radix in _RADIX:
        n, digit = divmod(n, radix)
        digits.append(digit)
    kind, key, owner, fence, payload, failed, raise_, via_async, other, boundary = digits
    return _Op(
        kind=_KINDS[kind],
        key=key,
        owner=owner,
        fence=_FENCES[fence],
        other_fingerprint=other == 7,
        raise_on_expired=bool(raise_),
        payload=payload,
        failed=bool(failed),
        via_async=bool(via_async),
        boundary=bool(boundary),
    )


_OPS = st.lists(st.integers(0, 2**32 - 1).map(_decode), min_size=5, max_size=30)


def _why(op: _Op) -> dict[str, Any]:
    """An abandon's reason: ``failed`` draws an error abandon (with the exception's type),
    else a cancellation."""
    if op.failed:
        return abandon_kwargs("error", "httpx.ReadTimeout")
    return abandon_kwargs("cancelled")


# -- the model ----------------------------------------------------------------------------


class _Model:
    """The protocol applied to a dict, with a clock that never reaches a lease deadline."""

    def __init__(self) -> None:
        self.records: dict[str, Record] = {}
        self.now = 1_000_000

    def apply(self, op: _Op, key: str, owner: str, fence: int, meta: Mapping[str, str]) -> object:
        self.now += 1
        rec = self.records.get(key)
        answer: object
        new: Record | None
        if op.kind == "claim":
            answer, new = decide_claim(
                rec,
                key=key,
                owner=owner,
                fingerprint=OTHER_FP if op.other_fingerprint else FP,
                now=self.now,
                lease_ms=LONG_MS,
                on_expired="raise" if op.raise_on_expired else "takeover",
                meta=meta,
                boundary=op.boundary,
            )
        elif op.kind == "mark_effect":
            answer, new = decide_mark_effect(rec, owner=owner, fence=fence, now=self.now)
        elif op.kind == "renew":
            answer, new = decide_renew(
                rec, owner=owner, fence=fence, now=self.now, lease_ms=LONG_MS
            )
        elif op.kind == "release":
            answer, new = decide_release(rec, owner=owner, fence=fence, now=self.now)
        elif op.kind == "abandon":
            answer, new = decide_abandon(rec, owner=owner, fence=fence, now=self.now, **_why(op))
        else:
            answer, new = decide_complete(
                rec,
                key=key,
                owner=owner,
                fence=fence,
                fingerprint=FP,
                payload=_PAYLOADS[op.payload],
                failed=op.failed,
                now=self.now,
                meta=meta,
            )
        if new is not None:
            self.records[key] = new
        return answer


# -- the harness --------------------------------------------------------------------------


class _Harness:
    """Runs one operation sequence on a store face and on the model; every answer and every
    record must agree."""

    def __init__(self, face: Face, on_loop: Runner) -> None:
        self.face = face
        self.on_loop = on_loop
        self.model = _Model()
        tag = uuid.uuid4().hex
        self.keys = [f"model-{tag}-{i}" for i in range(2)]
        self.meta = [{"namespace": f"model-{tag}", "thread_id": f"t{i}"} for i in range(2)]
        self.granted: dict[tuple[int, int], int] = {}

    def run(self, ops: list[_Op]) -> None:
        try:
            for step, op in enumerate(ops):
                self.step(step, op)
        finally:
            for key in self.keys:
                self._run(self.face, self.face.delete(key))

    def step(self, step: int, op: _Op) -> None:
        key, owner, meta = self.keys[op.key], f"owner-{op.owner}", self.meta[op.key]
        fence = self.granted.get((op.owner, op.key), 0) if op.fence is None else op.fence
        want = self.model.apply(op, key, owner, fence, meta)
        face = self.face if op.via_async else self.face.sync
        got = self._run(face, self._call(face, op, key, owner, fence, meta))
        where = f"step {step} on the {self.face.name} face: {op} (fence {fence})"
        if isinstance(want, Claim):
            assert isinstance(got, Claim), where
            assert (
                got.outcome,
                got.fence,
                got.attempt,
                got.failed,
                got.payload,
                got.reason,
                got.entered,
                got.error_type,
            ) == (
                want.outcome,
                want.fence,
                want.attempt,
                want.failed,
                want.payload,
                want.reason,
                want.entered,
                want.error_type,
            ), f"{where}: store {got}, model {want}"
            if want.outcome is ClaimOutcome.BUSY:
                assert 0 < got.retry_after_ms <= LONG_MS, where
            if want.outcome.runs:
                self.granted[(op.owner, op.key)] = want.fence
        else:
            assert got == want, f"{where}: store {got!r}, model {want!r}"
        stored = self._run(self.face, self.face.get(key))
        self._same_record(stored, self.model.records.get(key), where)

    def _run(self, face: Face, call: Coroutine[Any, Any, T]) -> T:
        return run_inline(call) if face.name == "sync" else self.on_loop(call)

    @staticmethod
    def _call(
        face: Face, op: _Op, key: str, owner: str, fence: int, meta: Mapping[str, str]
    ) -> Coroutine[Any, Any, object]:
        if op.kind == "claim":
            fingerprint = OTHER_FP if op.other_fingerprint else FP
            policy: ExpiredPolicy = "raise" if op.raise_on_expired else "takeover"
            return face.claim(
                key,
                owner,
                fingerprint=fingerprint,
                on_expired=policy,
                meta=meta,
                boundary=op.boundary,
            )
        if op.kind == "mark_effect":
            return face.mark_effect(key, owner=owner, fence=fence)
        if op.kind == "renew":
            return face.renew(key, owner=owner, fence=fence, lease_ms=LONG_MS)
        if op.kind == "release":
            return face.release(key, owner=owner, fence=fence)
        if op.kind == "abandon":
            return face.abandon(key, owner=owner, fence=fence, **_why(op))
        payload = _PAYLOADS[op.payload]
        return face.complete(key, owner, fence, payload, failed=op.failed, meta=meta)

    @staticmethod
    def _same_record(got: Record | None, want: Record | None, where: str) -> None:
        if want is None:
            assert got is None, f"{where}: store has {got}, model has nothing"
            return
        assert got is not None, f"{where}: store lost the record, model has {want}"
        assert (
            got.key,
            got.state,
            got.owner,
            got.fence,
            got.attempt,
            got.fingerprint,
            got.payload,
            got.version,
            dict(got.meta),
            got.effect,
            got.lease_until > 0,
        ) == (
            want.key,
            want.state,
            want.owner,
            want.fence,
            want.attempt,
            want.fingerprint,
            want.payload,
            want.version,
            dict(want.meta),
            want.effect,
            want.lease_until > 0,
        ), f"{where}: store {got}, model {want}"
        assert got.created_at <= got.updated_at, where
