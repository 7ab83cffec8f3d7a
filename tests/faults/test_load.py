"""Scenario 7: load on a hot set — 10,000 calls from 4 processes x 8 threads on 50 keys.

Exactly 50 executions (one per key) and one result per key, on Redis and on SQLite (one
file shared by the 4 processes). The campaign runs 100,000 calls.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from langchain_idempotent import Policy
from langchain_idempotent.core.engine import Engine
from tests.support.faults import Ledger, StoreSpec

from .report import Figures
from .workload import PROCESSES, THREADS, hot_key_load

HOT_KEYS = 50


@pytest.mark.timeout(600)
def test_ten_thousand_calls_on_fifty_hot_keys_execute_exactly_fifty_times(
    spec: StoreSpec,
    ledger: Ledger,
    record: Callable[[Figures], None],
    campaign: bool,
) -> None:
    total = 100_000 if campaign else 10_000
    keys = [f"hot-{i}-{time.monotonic_ns()}" for i in range(HOT_KEYS)]
    figures = hot_key_load(
        lambda: Engine(spec.open(), Policy(lease=30.0, wait_timeout=60.0)),
        ledger,
        keys,
        total,
        scenario=f"7. load: {PROCESSES} processes x {THREADS} threads, {HOT_KEYS} hot keys "
        f"({spec.kind})",
    )
    assert ledger.executions() == dict.fromkeys(keys, 1)
    record(figures)
    assert figures.calls == total
    assert figures.effects == HOT_KEYS
    assert figures.divergent == 0 and figures.duplicates == 0
    assert not figures.errors
