"""Scenario 7: load on a hot set — 10,000 calls from 4 processes x 8 threads on 50 keys.

Exactly 50 executions (one per key) and one result per key, on Redis and on SQLite (one
file shared by the 4 processes). The campaign runs 100,000 calls.
"""

from __future__ import annotations

import multiprocessing as mp
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from langchain_idempotent import Engine, Policy
from tests.support.faults import Ledger, StoreSpec, Tally

from .report import Figures
from .workload import call_until_answered, refund

FORK = mp.get_context("fork")
PROCESSES, THREADS, HOT_KEYS = 4, 8, 50


def _load_worker(
    index: int, spec: StoreSpec, ledger: Ledger, keys: list[str], calls: int, barrier: Any
) -> None:
    store = spec.open()
    engine = Engine(store, Policy(lease=30.0, wait_timeout=60.0))
    tallies = [Tally() for _ in range(THREADS)]

    def thread(t: int) -> None:
        rng = random.Random(index * THREADS + t)
        for _ in range(calls // THREADS + (t < calls % THREADS)):
            key = rng.choice(keys)
            call_until_answered(engine, key, refund(ledger, key, sleep=0.002), tallies[t], rng=rng)

    threads = [threading.Thread(target=thread, args=(t,)) for t in range(THREADS)]
    barrier.wait(30)
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ledger.calls([row for t in tallies for row in t.rows])
    store.close()


@pytest.mark.timeout(600)
def test_ten_thousand_calls_on_fifty_hot_keys_execute_exactly_fifty_times(
    spec: StoreSpec,
    ledger: Ledger,
    record: Callable[[Figures], None],
    campaign: bool,
) -> None:
    total = 100_000 if campaign else 10_000
    keys = [f"hot-{i}-{time.monotonic_ns()}" for i in range(HOT_KEYS)]
    barrier = FORK.Barrier(PROCESSES)
    per_process = total // PROCESSES
    procs = [
        FORK.Process(target=_load_worker, args=(i, spec, ledger, keys, per_process, barrier))
        for i in range(PROCESSES)
    ]
    started = time.perf_counter()
    for p in procs:
        p.start()
    for p in procs:
        p.join(540)
    elapsed = time.perf_counter() - started
    assert [p.exitcode for p in procs] == [0] * PROCESSES
    executions = ledger.executions()
    assert executions == dict.fromkeys(keys, 1)
    figures = Figures.from_ledger(
        f"7. load: {PROCESSES} processes x {THREADS} threads, {HOT_KEYS} hot keys ({spec.kind})",
        "none (contention only)",
        ledger,
        notes=[f"{total / elapsed:,.0f} calls/s on 2 cores ({elapsed:.1f}s)"],
    )
    record(figures)
    assert figures.calls == total
    assert figures.effects == HOT_KEYS
    assert figures.divergent == 0 and figures.duplicates == 0
    assert not figures.errors
