"""Linearizability of one key's history against the protocol model (Wing & Gong's search,
memoized like Porcupine's).

The model is :mod:`langchain_idempotent.protocol` itself — the decision table every store
implements and the contract suite's model test (``langchain_idempotent.testing._model``)
applies — with one addition: the store's clock at an operation is only known to lie in
``[now_lo, now_hi]``, so a lease deadline is a range too, and a claim that meets a lease
whose deadline may or may not have passed may answer either way (BUSY or TAKEOVER /
EXPIRED); both branches are searched.

A history is linearizable when some order of its operations, consistent with real time
(A before B whenever A returned before B was invoked), gives every answer the model gives.
An operation without a reply may be placed anywhere after its invocation, or nowhere.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from langchain_idempotent.protocol import (
    decide_abandon,
    decide_claim,
    decide_complete,
    decide_release,
    decide_renew,
)
from langchain_idempotent.record import Claim, ClaimOutcome, Completion, Record, State

from .history import Op

#: Search budget per key (model steps); beyond it the key is reported as unchecked.
BUDGET = 200_000


@dataclass(frozen=True, slots=True)
class MState:
    """A record as the model knows it: the protocol's record plus a lease-deadline range."""

    rec: Record | None
    lease_lo: int = 0
    lease_hi: int = 0

    def sig(self) -> tuple[Any, ...]:
        r = self.rec
        if r is None:
            return (None,)
        return (
            r.state,
            r.owner,
            r.fence,
            r.attempt,
            r.fingerprint,
            r.payload,
            self.lease_lo,
            self.lease_hi,
        )

    def durable_sig(self) -> tuple[Any, ...]:
        """What a restart must keep: everything but the lease deadline."""
        r = self.rec
        return (None,) if r is None else (r.state, r.owner, r.fence, r.attempt, r.payload)


def from_record(rec: Record | None) -> MState:
    if rec is None:
        return MState(None)
    return MState(rec, rec.lease_until, rec.lease_until)


def _leased(new: Record | None, lo: int, hi: int, ms: int, old: MState) -> MState:
    if new is None:
        return old
    if new.lease_until == 0:
        return MState(new, 0, 0)
    return MState(new, lo + ms, hi + ms)


def step(s: MState, op: Op, horizon: int = 0) -> list[tuple[Any, MState]]:
    """Every (answer, next state) the model allows for ``op`` in state ``s``; an op without
    a reply may have taken effect up to ``horizon`` (the history's last clock reading)."""
    a, lo = op.args, op.now_lo
    hi = max(op.now_hi if op.ret is not None else horizon, lo)
    rec = s.rec
    if op.kind == "claim":
        # The lease is judged by ``now`` alone, against the record's own ``lease_until``:
        # one branch where the deadline (somewhere in [lease_lo, lease_hi]) is still ahead
        # of the store's clock (somewhere in [lo, hi]), one where it has passed.
        nows: list[int] = [lo]
        if rec is not None and rec.state is State.RUNNING:
            nows = []
            if s.lease_hi > lo:
                nows.append(rec.lease_until - 1)
            if s.lease_lo <= hi:
                nows.append(rec.lease_until)
        out = []
        for now in nows:
            ans, new = decide_claim(
                rec,
                key=op.key,
                owner=a["owner"],
                fingerprint=a["fingerprint"],
                now=now,
                lease_ms=a["lease_ms"],
                on_expired=a.get("on_expired", "takeover"),
                meta=a.get("meta"),
            )
            out.append((ans, _leased(new, lo, hi, a["lease_ms"], s)))
        return out
    if op.kind == "renew":
        ok, new = decide_renew(rec, owner=a["owner"], fence=a["fence"], now=lo, lease_ms=1)
        return [(ok, _leased(new, lo, hi, a["lease_ms"], s))]
    if op.kind == "complete":
        done, new = decide_complete(
            rec,
            key=op.key,
            owner=a["owner"],
            fence=a["fence"],
            fingerprint=a["fingerprint"],
            payload=a["payload"],
            failed=a["failed"],
            now=lo,
            meta=a.get("meta"),
        )
        return [(done, _leased(new, lo, hi, 0, s))]
    if op.kind == "release":
        ok, new = decide_release(rec, owner=a["owner"], fence=a["fence"], now=lo)
        return [(ok, _leased(new, lo, hi, 0, s))]
    if op.kind == "abandon":
        ok, new = decide_abandon(
            rec, owner=a["owner"], fence=a["fence"], reason=a.get("reason", "cancelled"), now=lo
        )
        return [(ok, _leased(new, lo, hi, 0, s))]
    # An operation the model does not know (added to the protocol after this harness):
    # it is taken to change nothing the other operations answer from.
    return [(op.answer, s)]


def agrees(op: Op, want: Any) -> bool:
    got = op.answer
    if op.kind not in ("claim", "renew", "complete", "release", "abandon"):
        return True
    if isinstance(want, Claim):
        if not isinstance(got, Claim) or got.outcome is not want.outcome:
            return False
        if want.outcome is ClaimOutcome.BUSY:
            return got.fence == want.fence and 0 < got.retry_after_ms <= op.args["lease_ms"]
        same = (got.fence, got.attempt, got.failed, got.payload) == (
            want.fence,
            want.attempt,
            want.failed,
            want.payload,
        )
        if want.outcome in (ClaimOutcome.TAKEOVER, ClaimOutcome.EXPIRED):
            same = same and got.reason == want.reason
        return same
    if isinstance(want, Completion):
        return isinstance(got, Completion) and (
            got.stored,
            got.stale,
            got.failed,
            got.payload,
        ) == (want.stored, want.stale, want.failed, want.payload)
    return bool(got == want)


@dataclass(slots=True)
class Verdict:
    ok: bool
    #: False when the search ran out of budget (neither proved nor refuted).
    decided: bool = True
    #: Every state a valid linearization can end in (for the restart check).
    finals: list[MState] | None = None
    why: str = ""


def check(ops: list[Op], start: MState, *, want_finals: bool = False, horizon: int = 0) -> Verdict:
    """Search for a linearization of ``ops`` (one key's) from ``start``; ``horizon`` is the
    run's last clock reading (an op without a reply took effect before it, if at all)."""
    n = len(ops)
    if n == 0:
        return Verdict(True, finals=[start])
    ops = sorted(ops, key=lambda o: o.inv)
    inf = 1 << 62
    rets = [o.ret if o.ret is not None else inf for o in ops]
    horizon = max(horizon, *(max(o.now_hi, o.now_lo) for o in ops))
    pending_mask = sum(1 << i for i, o in enumerate(ops) if o.ret is None)
    full = (1 << n) - 1
    seen: set[tuple[int, tuple[Any, ...]]] = set()
    finals: dict[tuple[Any, ...], MState] = {}
    budget = [BUDGET]
    deepest: list[Any] = [0, ""]
    found = [False]

    def candidates(done: int) -> Iterable[int]:
        # An op may go next if no other remaining op returned before it was invoked.
        left = [i for i in range(n) if not done >> i & 1]
        first_ret = min(rets[i] for i in left)
        for i in left:
            if ops[i].inv < first_ret or rets[i] == first_ret:
                yield i

    def search(done: int, s: MState) -> None:
        if found[0] and not want_finals:
            return
        if (done | pending_mask) == full:
            found[0] = True
            finals.setdefault(s.sig(), s)
            if done == full:
                return
        mark = (done, s.sig())
        if mark in seen:
            return
        seen.add(mark)
        budget[0] -= 1
        if budget[0] < 0:
            return
        depth = bin(done).count("1")
        for i in candidates(done):
            op = ops[i]
            for want, nxt in step(s, op, horizon):
                if op.ret is None or agrees(op, want):
                    search(done | 1 << i, nxt)
                elif depth >= deepest[0]:
                    deepest[0], deepest[1] = (
                        depth,
                        f"op {op.id} {op.kind} by {op.caller} answered {op.answer!r}; "
                        f"the model allows {want!r} after {depth} ops (state {s.sig()})",
                    )

    search(0, start)
    if found[0]:
        return Verdict(True, finals=list(finals.values()))
    if budget[0] < 0:
        return Verdict(True, decided=False, why="search budget exhausted")
    return Verdict(False, why=str(deepest[1]))
