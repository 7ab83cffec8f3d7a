"""Every run's history checked: linearizable per key against the protocol model, and the
invariants the library promises.

1. **linearizable**: each key's operations, split at store restarts, linearize against
   the model (:mod:`.linearize`); after a restart the record must be one the history could
   have left (a durable store), or its loss is counted (a store that may lose records).
2. **at most one effect** per key at the fence-checking sink; with a truthful ``reconcile=``
   exactly one once any caller got an answer. Without a hook, an effect may repeat only
   after an unknown outcome (a TAKEOVER), as the README says; such repeats are counted.
3. **one terminal record** per key: every replayed or returned stored payload is the same.
4. **no stale result stored**: a stored completion is the result of an effect the sink
   accepted (never of one it refused as stale).
5. **unknown outcomes reconciled or surfaced**: a TAKEOVER is asked about (with a hook) or
   runs told ``takeover=True``; an EXPIRED answer ends in ``OutcomeUnknownError`` unless the
   hook found the effect.
6. **one answer per key** for every caller that got one; every caller finished.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from langchain_idempotent.core.record import Claim, ClaimOutcome, Completion, Record, State
from langchain_idempotent.core.serde import ResultSerializer
from langchain_idempotent.errors import IdempotencyError

from . import linearize
from .history import Op
from .sim import Outcome

_SERDE = ResultSerializer()


@dataclass
class Report:
    violations: list[str] = field(default_factory=list)
    stats: Counter[str] = field(default_factory=Counter)

    def bad(self, rule: str, detail: str) -> None:
        self.violations.append(f"{rule}: {detail}")


def _value(payload: bytes | None, key: str) -> Any:
    try:
        return _SERDE.loads(payload, key=key)
    except IdempotencyError:
        return ("<undecodable>", payload)


def check(out: Outcome, *, durable: bool) -> Report:
    r = Report()
    h = out.history
    r.stats["claims"] = h.claims()
    r.stats["effects"] = sum(len(v) for v in out.sink.accepted.values())
    if out.stuck:
        r.bad("progress", "the run did not finish within the step budget")
    lost = _linearizable(out, r, durable=durable)
    by_key = h.by_key()
    for key in out.keys:
        _per_key(out, r, key, by_key.get(key, []), lost.get(key, 0))
    _unknowns(out, r)
    return r


def _linearizable(out: Outcome, r: Report, *, durable: bool) -> dict[str, int]:
    lost: dict[str, int] = {}
    bounds = [rs.at for rs in out.history.restarts]
    by_key = out.history.by_key()
    horizon = max((max(o.now_hi, o.now_lo) for o in out.history.ops), default=0)
    for key in out.keys:
        ops = by_key.get(key, [])
        start = linearize.MState(None)
        lo = 0
        for n, at in enumerate([*bounds, 1 << 62]):
            seg = [op for op in ops if lo < op.inv < at]
            last = n == len(bounds)
            verdict = linearize.check(seg, start, want_finals=not last, horizon=horizon)
            if not verdict.decided:
                r.stats["unchecked_keys"] += 1
            elif not verdict.ok:
                r.bad("linearizable", f"{key}: {verdict.why}")
                break
            if not last:
                after = out.history.restarts[n].after[key]
                snap = linearize.from_record(after)
                kept = {f.durable_sig() for f in verdict.finals or []}
                r.stats["restarts_x_keys"] += 1
                if kept != {(None,)}:
                    r.stats["records_at_restart"] += 1
                if snap.durable_sig() not in kept:
                    lost[key] = lost.get(key, 0) + 1
                    r.stats["records_lost"] += 1
                    if durable:
                        r.bad(
                            "durable",
                            f"{key}: after a restart the record is {snap.durable_sig()}, "
                            f"the history left one of {sorted(map(str, kept))}",
                        )
                start = snap
            lo = at
    return lost


def _per_key(out: Outcome, r: Report, key: str, ops: list[Op], lost: int) -> None:
    accepted = out.sink.accepted.get(key, [])
    values = {v for _, _, v in accepted}
    takeovers = sum(
        1
        for op in ops
        if op.kind == "claim"
        and isinstance(op.answer, Claim)
        and op.answer.outcome is ClaimOutcome.TAKEOVER
    )
    calls = [c for c in out.history.calls.values() if c.key == key]
    answered = [c for c in calls if c.end == "value"]
    # 2. effects
    allowed = 1 + lost + (0 if out.plan.reconcile else takeovers)
    if len(accepted) > allowed:
        r.bad(
            "at_most_once",
            f"{key}: {len(accepted)} effects at the sink, {takeovers} takeovers, "
            f"{lost} records lost, reconcile={out.plan.reconcile}",
        )
    if len(accepted) > 1:
        r.stats["reruns_after_unknown" if not lost else "reruns_after_loss"] += len(accepted) - 1
    if answered and not accepted:
        r.bad("exactly_once", f"{key}: callers got an answer but no effect happened")
    # 6. one answer (answers backed by an effect)
    confirmed = {c.value for c in answered if not c.unconfirmed}
    for c in answered:
        if c.value not in values:
            r.bad("answer_backed", f"{key}: caller {c.caller} got {c.value!r}, no such effect")
    if len(confirmed) > 1 and not lost:
        r.bad("one_answer", f"{key}: callers got {sorted(confirmed)}")
    # A caller whose completion's reply was lost returns its own result unconfirmed (the
    # engine's documented choice); counted when another answer was stored meanwhile.
    final: Record | None = out.finals.get(key)
    reference = set(confirmed)
    if final is not None and final.state is State.COMPLETED:
        reference.add(_value(final.payload, key))
    split = {c.value for c in answered if c.unconfirmed} - reference
    if split and reference and not lost:
        r.stats["unconfirmed_answer_differs"] += 1
    # 3. one terminal record; 4. stored results are accepted effects
    payloads = set()
    for op in ops:
        a = op.answer
        if op.ret is None:
            continue
        if isinstance(a, Claim) and a.outcome is ClaimOutcome.REPLAY and not a.failed:
            payloads.add(a.payload)
        if isinstance(a, Completion) and not a.failed:
            payloads.add(a.payload)
            if a.stored and _value(a.payload, key) not in values:
                r.bad("stale_result", f"{key}: op {op.id} stored {a.payload!r}, not an effect")
    if len(payloads) > 1 and not lost:
        r.bad("one_terminal", f"{key}: stored payloads {sorted(map(repr, payloads))}")
    if final is not None and final.state is State.COMPLETED and confirmed and not lost:
        stored = _value(final.payload, key)
        if stored not in confirmed:
            r.bad("one_terminal", f"{key}: final record holds {stored!r}, callers {confirmed}")
    for c in calls:
        if c.end == "pending":
            r.bad("every_caller_answered", f"{key}: caller {c.caller} never finished")
        r.stats[f"calls_{c.end}"] += 1


def _unknowns(out: Outcome, r: Report) -> None:
    h = out.history
    for op in h.ops:
        a = op.answer
        if op.kind != "claim" or op.ret is None or not isinstance(a, Claim):
            continue
        call = h.calls.get(op.caller)
        if call is None or call.end == "crashed":
            continue
        if a.outcome is ClaimOutcome.TAKEOVER:
            r.stats["unknown_outcomes"] += 1
            asked = [found for fence, found in call.asked if fence == a.fence]
            if out.plan.reconcile and not asked:
                r.bad("unknown_surfaced", f"op {op.id}: takeover at fence {a.fence} not asked")
            ran = (a.fence, True) in call.runs
            if not ran and not any(asked):
                r.bad(
                    "unknown_surfaced", f"op {op.id}: takeover at {a.fence} neither ran nor found"
                )
        elif a.outcome is ClaimOutcome.EXPIRED:
            r.stats["unknown_outcomes"] += 1
            found = any(f for _, f in call.asked)
            if call.end != "unknown" and not (found and call.end == "value"):
                if call.end == "error":  # a later attempt's store error ended the call
                    continue
                r.bad("unknown_surfaced", f"op {op.id}: expired, caller ended {call.end!r}")
