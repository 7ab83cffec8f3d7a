"""Linearizability of one key's history against the protocol model (Wing & Gong's search,
memoized like Porcupine's).

The model is :mod:`langchain_idempotent.core.protocol` itself — the decision table every store
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

import dataclasses
import functools
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from langchain_idempotent.core import protocol
from langchain_idempotent.core.record import Claim, ClaimOutcome, Completion, Record, State

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
        return (*(getattr(r, f) for f in _SIG_FIELDS), self.lease_lo, self.lease_hi)

    def durable_sig(self) -> tuple[Any, ...]:
        """What a restart must keep: everything but the lease deadline."""
        r = self.rec
        return (None,) if r is None else tuple(getattr(r, f) for f in _SIG_FIELDS)


#: The fields the protocol decides by (every field of the record but its times and meta).
_SIG_FIELDS = tuple(
    f.name
    for f in dataclasses.fields(Record)
    if f.name not in ("key", "lease_until", "created_at", "updated_at", "meta", "version")
)


def from_record(rec: Record | None) -> MState:
    if rec is None:
        return MState(None)
    return MState(rec, rec.lease_until, rec.lease_until)


#: The protocol's decisions by operation name (``decide_claim`` -> ``"claim"``), so that an
#: operation added to the protocol later (with its ``decide_`` function) is modelled too.
DECIDE: dict[str, Callable[..., tuple[Any, Record | None]]] = {
    name.removeprefix("decide_"): fn
    for name, fn in vars(protocol).items()
    if name.startswith("decide_") and callable(fn)
}


@functools.cache
def _params(fn: Callable[..., Any]) -> frozenset[str]:
    return frozenset(inspect.signature(fn).parameters)


def _decide(op: Op, rec: Record | None, now: int) -> tuple[Any, Record | None]:
    fn = DECIDE[op.kind]
    given = {**op.args, "key": op.key, "now": now}
    return fn(rec, **{k: v for k, v in given.items() if k in _params(fn)})


def _next(s: MState, new: Record | None, now: int, lo: int, hi: int, *, fresh: bool) -> MState:
    """The state after a decision taken at ``now`` for an op whose clock lay in [lo, hi];
    ``fresh``: the decision wrote a lease measured from ``now`` (else it kept the record's)."""
    if new is None:
        return s
    if new.lease_until == 0:
        return MState(new, 0, 0)
    if not fresh:
        return MState(new, s.lease_lo, s.lease_hi)
    ms = new.lease_until - now  # a lease written now: lease_ms after the store's clock
    return MState(new, lo + ms, hi + ms)


def _fresh(op: Op, rec: Record | None, now: int, new: Record | None) -> bool:
    """Whether the decision wrote a lease measured from ``now`` rather than keeping the
    record's: the same decision a millisecond later writes another deadline. (Comparing
    with the record's deadline alone is not enough: a renewal whose clock reading equals
    the previous one's writes the same ``lease_until`` as the model decides it, while its
    range — up to its own ``now_hi`` — is wider.)"""
    if new is None or new.lease_until == 0:
        return False
    if rec is None or new.lease_until != rec.lease_until:
        return True
    later = _decide(op, rec, now + 1)[1]
    return later is not None and later.lease_until != new.lease_until


def step(s: MState, op: Op, horizon: int = 0) -> list[tuple[Any, MState]]:
    """Every (answer, next state) the model allows for ``op`` in state ``s``; an op without
    a reply may have taken effect up to ``horizon`` (the history's last clock reading)."""
    lo = op.now_lo
    hi = max(op.now_hi if op.ret is not None else horizon, lo)
    rec = s.rec
    if op.kind not in DECIDE:
        # An operation the model does not know: taken to change nothing the others answer.
        return [(op.answer, s)]
    nows = [lo]
    if op.kind == "claim" and rec is not None and rec.state is State.RUNNING:
        # The lease is judged by ``now`` alone, against the record's own ``lease_until``:
        # one branch where the deadline (somewhere in [lease_lo, lease_hi]) is still ahead
        # of the store's clock (somewhere in [lo, hi]), one where it has passed.
        nows = []
        if s.lease_hi > lo:
            nows.append(rec.lease_until - 1)
        if s.lease_lo <= hi:
            nows.append(rec.lease_until)
    out = []
    for now in nows:
        ans, new = _decide(op, rec, now)
        out.append((ans, _next(s, new, now, lo, hi, fresh=_fresh(op, rec, now, new))))
    return out


def agrees(op: Op, want: Any) -> bool:
    got = op.answer
    if op.kind not in DECIDE:
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
            same = same and (got.reason, got.error_type) == (want.reason, want.error_type)
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
