"""The renewal scheduler: cheap for tools that finish quickly, faithful for those that don't."""

from __future__ import annotations

import gc
import threading
import time
import weakref

from langchain_idempotent.core.heartbeat import _SWEEP_AT, Renewal, _Scheduler


class _Call:
    """Stands in for what a renewal's callback keeps alive (the call, its arguments)."""


def test_cancelled_renewals_do_not_pile_up_until_they_fall_due() -> None:
    scheduler = _Scheduler()
    for _ in range(20 * _SWEEP_AT):
        renewal = Renewal(60.0, lambda: True)
        scheduler.add(renewal)
        renewal.cancel()
    assert len(scheduler._heap) <= _SWEEP_AT


def test_a_cancelled_renewal_lets_go_of_its_call_at_once() -> None:
    scheduler = _Scheduler()
    call = _Call()
    alive = weakref.ref(call)
    renewal = Renewal(60.0, lambda held=call: held is not None)
    scheduler.add(renewal)
    del call
    gc.collect()
    assert alive() is not None  # held while the tool runs
    renewal.cancel()
    gc.collect()
    assert alive() is None


def test_running_tools_keep_being_renewed_while_cancelled_ones_are_swept() -> None:
    scheduler = _Scheduler()
    renewed = [0] * 5
    lock = threading.Lock()

    def renew(i: int) -> bool:
        with lock:
            renewed[i] += 1
        return True

    live = [Renewal(0.02, lambda i=i: renew(i)) for i in range(5)]
    for renewal in live:
        scheduler.add(renewal)
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:  # churn: many short tools, several sweeps
        for _ in range(_SWEEP_AT):
            short = Renewal(60.0, lambda: True)
            scheduler.add(short)
            short.cancel()
    for renewal in live:
        renewal.cancel()
    assert all(n >= 3 for n in renewed), renewed


def test_a_cancelled_renewal_falling_due_sweeps_out_every_cancelled_one() -> None:
    scheduler = _Scheduler()
    soon = Renewal(0.01, lambda: True)
    scheduler.add(soon)
    soon.cancel()
    for _ in range(10):  # finished calls whose renewals are due much later
        later = Renewal(60.0, lambda: True)
        scheduler.add(later)
        later.cancel()
    deadline = time.monotonic() + 30
    while scheduler._heap and time.monotonic() < deadline:
        time.sleep(0.005)
    # The thread woke once, for ``soon``, and then has nothing left to wake for.
    assert scheduler._heap == []
