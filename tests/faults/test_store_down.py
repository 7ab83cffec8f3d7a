"""Scenario 6: the store is down — before a batch, during a batch, and with ``fail_open``.

Fail closed (the default): while Redis is down no tool body runs; each call raises
:class:`StoreUnavailableError` within the socket timeouts; the batch resumes when Redis is
back (it runs with ``appendonly yes`` + ``appendfsync always`` here, so only the outage is
tested, not data loss).

Fail open (``fail_open=True``, the documented opt-in): the tool runs unprotected — no
lease, so every retry while the store is down runs the tool again — but it still gets its
key (``get_idempotency_context()``, ``protected=False``, fence 0), so a downstream that
deduplicates on the key applies the effect once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from langchain_idempotent import IdempotencyEvent, Policy, StoreUnavailableError
from langchain_idempotent.core.engine import Engine
from tests.support.faults import Ledger, StoreSpec, Tally, wait_until
from tests.support.redis_servers import RedisServer, free_port

from .report import Figures
from .workload import call_until_answered, refund

pytestmark = pytest.mark.redis
LEASE = 1.0
SOCKET_TIMEOUT = 0.5


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer(port=free_port(), appendonly="yes", appendfsync="always") as s:
        yield s


def engine_on(server: RedisServer, prefix: str, **policy: object) -> Engine:
    spec = StoreSpec(
        "redis",
        server.url,
        prefix=prefix,
        socket_timeout=SOCKET_TIMEOUT,
        socket_connect_timeout=SOCKET_TIMEOUT,
        retries=2,
    )
    return Engine(spec.open(), Policy(lease=LEASE, wait_timeout=10.0, **policy))  # type: ignore[arg-type]


def test_a_store_down_before_a_batch_runs_no_tool_and_fails_closed(
    server: RedisServer, ledger: Ledger, prefix: str, record: Callable[[Figures], None]
) -> None:
    engine = engine_on(server, prefix)
    server.stop()
    keys = [f"down-before-{i}" for i in range(10)]
    tally = Tally()
    times = []
    for key in keys:
        started = time.monotonic()
        with pytest.raises(StoreUnavailableError) as raised:
            engine.run(key, fingerprint="fp", action=refund(ledger, key))
        times.append(time.monotonic() - started)
        assert raised.value.key == key
        tally.error(key, raised.value)
    ledger.calls(tally.rows)
    assert ledger.executions() == {}
    assert max(times) < 3 * SOCKET_TIMEOUT + 1.0
    record(
        Figures.from_ledger(
            "6. store down before a batch (fail closed)",
            "Redis stopped",
            ledger,
            notes=[f"no tool ran; each call failed in <= {max(times) * 1000:.0f} ms"],
        )
    )


def test_a_store_stopped_during_a_batch_runs_nothing_while_down_and_resumes(
    server: RedisServer,
    ledger: Ledger,
    prefix: str,
    record: Callable[[Figures], None],
    campaign: bool,
) -> None:
    engine = engine_on(server, prefix)
    keys = [f"down-during-{i}" for i in range(300 if campaign else 60)]
    tallies = [Tally() for _ in range(3)]

    def worker(tally: Tally, mine: list[str]) -> None:
        for key in mine:
            call_until_answered(engine, key, refund(ledger, key, sleep=0.005), tally)

    threads = [threading.Thread(target=worker, args=(t, keys[i::3])) for i, t in enumerate(tallies)]
    for t in threads:
        t.start()
    wait_until(lambda: len(ledger.execution_times()) >= len(keys) // 3, 60, "a third done")
    server.stop()  # SIGTERM, returns once the process has exited
    down_at = time.time()
    time.sleep(1.0)
    up_at = time.time()
    server.start()
    for t in threads:
        t.join(120)
    ledger.calls([row for t in tallies for row in t.rows])
    # A tool body that started while Redis was down would have run unprotected. (A body
    # that started just before the stop logs its start before ``down_at``.)
    while_down = [at for at in ledger.execution_times() if down_at < at < up_at]
    assert while_down == []
    assert ledger.effects() == dict.fromkeys(keys, 1)
    answered = {k for t in tallies for k, r, _ in t.rows if r is not None}
    assert answered == set(keys)
    figures = Figures.from_ledger(
        "6. store stopped during a batch (fail closed)",
        "Redis stopped 1.0 s mid-batch (3 threads), then restarted",
        ledger,
        notes=["no tool started while Redis was down; the batch resumed and finished"],
    )
    record(figures)
    assert figures.errors["StoreUnavailableError"] > 0


@pytest.mark.campaign
def test_a_hung_store_during_a_batch_runs_nothing_until_it_answers_again(
    server: RedisServer, ledger: Ledger, prefix: str, record: Callable[[Figures], None]
) -> None:
    engine = engine_on(server, prefix)
    keys = [f"hung-{i}" for i in range(60)]
    tally = Tally()

    def worker() -> None:
        for key in keys:
            call_until_answered(engine, key, refund(ledger, key, sleep=0.005), tally)

    thread = threading.Thread(target=worker)
    thread.start()
    wait_until(lambda: len(ledger.execution_times()) >= 20, 60, "a third done")
    paused_at = time.time()
    server.pause()  # SIGSTOP: connections stay open, nothing answers
    time.sleep(3.0)
    resumed_at = time.time()
    server.resume()
    thread.join(120)
    ledger.calls(tally.rows)
    assert [at for at in ledger.execution_times() if paused_at + 0.05 < at < resumed_at] == []
    assert ledger.effects() == dict.fromkeys(keys, 1)
    record(
        Figures.from_ledger(
            "6. store hung (SIGSTOP 3 s) during a batch",
            "Redis SIGSTOPped 3 s, then SIGCONT",
            ledger,
            notes=["no tool started while Redis was hung"],
        )
    )


def test_with_fail_open_a_store_down_runs_the_tool_unprotected(
    server: RedisServer, ledger: Ledger, prefix: str, record: Callable[[Figures], None]
) -> None:
    events: list[IdempotencyEvent] = []
    engine = engine_on(server, prefix, fail_open=True)
    engine.on_event = events.append
    key = "fail-open"
    server.stop()
    tally = Tally()
    for _ in range(2):  # the call and its retry, while the store is down
        tally.ok(key, engine.run(key, fingerprint="fp", action=refund(ledger, key)))
    server.start()
    tally.ok(key, engine.run(key, fingerprint="fp", action=refund(ledger, key)))
    tally.ok(key, engine.run(key, fingerprint="fp", action=refund(ledger, key)))
    ledger.calls(tally.rows)
    kinds = [e.kind for e in events]
    assert kinds.count("fail_open") == 2
    # Both unprotected runs and the first protected run ran the tool; the downstream
    # applied the effect once (every run sent the same key); the fourth call replays.
    assert ledger.executions() == {key: 3}
    assert ledger.effects() == {key: 1}
    figures = Figures.from_ledger(
        "6. store down with fail_open=True",
        "Redis stopped for 2 calls, then restarted",
        ledger,
        notes=[
            "by design the tool re-runs on every call while the store is down (no lease); "
            "the unprotected runs still hand the key downstream (protected=False, fence 0), "
            "which applied the effect once"
        ],
    )
    record(figures)
    assert figures.duplicates == 0
