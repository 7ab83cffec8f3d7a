"""What one seeded run records: every store operation's invocation and return, in real-time
order, plus the side of the world the store cannot see (the sink, the callers' answers).

Event indices (``inv``, ``ret``) are positions in one global sequence: operation A
*precedes* B when ``A.ret < B.inv``. An operation whose reply never came back (a lost
reply, a caller that crashed during it) has ``ret = None``: it may have taken effect at any
point after its invocation, or not at all.

``now_lo``/``now_hi`` bound the store's clock while the operation could have taken effect
(exact for a fake clock; the wall clock with a slack for a server's).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from langchain_idempotent.core.record import Record


@dataclass(slots=True)
class Op:
    id: int
    key: str
    #: Which caller: ``(worker, call number)``.
    caller: tuple[int, int]
    kind: str
    args: dict[str, Any]
    inv: int
    now_lo: int
    ret: int | None = None
    now_hi: int = 0
    answer: Any = None


@dataclass(slots=True)
class Restart:
    """The store restarted at event ``at``; ``after`` is what each key read right after."""

    at: int
    after: dict[str, Record | None]


@dataclass(slots=True)
class CallLog:
    """One caller's call of the tool (one ``Engine.run``), as the caller saw it."""

    caller: tuple[int, int]
    key: str
    #: ``value`` (an answer), ``unknown`` (OutcomeUnknownError), ``error`` (gave up after
    #: retries), ``crashed``, or ``pending`` (never finished: a bug in the harness).
    end: str = "pending"
    value: Any = None
    #: The answer did not come back confirmed by the store (its complete reply was lost).
    unconfirmed: bool = False
    #: ``(fence, takeover)`` of every run of the action (each attempt of this call).
    runs: list[tuple[int, bool]] = field(default_factory=list)
    #: Fences at which the reconcile hook was asked (and whether it found the effect).
    asked: list[tuple[int, bool]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class History:
    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.restarts: list[Restart] = []
        self.calls: dict[tuple[int, int], CallLog] = {}
        self._next = 0

    def tick(self) -> int:
        self._next += 1
        return self._next

    def invoke(
        self, key: str, caller: tuple[int, int], kind: str, args: dict[str, Any], now_lo: int
    ) -> Op:
        op = Op(len(self.ops), key, caller, kind, args, self.tick(), now_lo)
        self.ops.append(op)
        return op

    def give(self, op: Op, answer: Any, now_hi: int) -> None:
        op.ret, op.answer, op.now_hi = self.tick(), answer, now_hi

    def by_key(self) -> dict[str, list[Op]]:
        out: dict[str, list[Op]] = defaultdict(list)
        for op in self.ops:
            out[op.key].append(op)
        return out

    def claims(self) -> int:
        return sum(1 for op in self.ops if op.kind == "claim")
