"""Postgres scenarios: crashes and pauses in transactional mode, backends terminated, a
server restart, and load on hot keys.

P1. **SIGKILL inside a transactional tool.** The worker has inserted its credit on the
    transaction's connection and is killed before the commit: 0 rows until the successor
    takes over (after one lease) and commits exactly 1, with fence 2.
P2. **SIGSTOP past the lease, transactional.** The worker inserted its credit and stops
    itself; a successor takes over and commits; the worker resumes: its completion is
    refused under the record's row lock, its transaction rolls back, 0 rows from it, and
    its caller gets the successor's result. (Resumed while the successor still runs, it
    gets ``LeaseLostError``: ``tests/test_postgres_transactional.py``.)
P3. **``pg_terminate_backend`` mid-batch.** Every backend of the store (matched by
    ``application_name``) is terminated repeatedly while 8 threads run a batch, in normal
    and in transactional mode. Effects once per key, one result per key.
P4. **A PostgreSQL restart mid-batch** (fast shutdown, start on the same port): callers fail
    closed while it is down and retry; effects once per key.
P5. **Load:** 4 processes x 8 threads on 50 hot keys: exactly 50 executions, every caller
    the same result per key.

Each scenario starts from a throwaway cluster (``tests/support/postgres_server.py``); the
restart scenario gets its own.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from langchain_idempotent import (
    InProgressError,
    LeaseLostError,
    Policy,
    StoreUnavailableError,
    get_idempotency_context,
)
from langchain_idempotent.core.engine import Engine
from langchain_idempotent.core.record import State
from langchain_idempotent.stores.postgres import PostgresIdempotencyStore
from tests.support.faults import Ledger, Tally, kill_hard, wait_stopped
from tests.support.postgres_fixtures import pg_server, pg_table, pg_url
from tests.support.postgres_server import PostgresServer, postgres_unavailable_reason

from .report import Figures
from .workload import PROCESSES, THREADS, call_until_answered, hot_key_load, refund

__all__ = ["pg_server", "pg_table", "pg_url"]

FORK = mp.get_context("fork")
LEASE = 1.0
SLACK = 0.5
APP = "idem-fault"


def open_store(url: str, table: str) -> PostgresIdempotencyStore:
    sep = "&" if "?" in url else "?"
    return PostgresIdempotencyStore.from_url(
        f"{url}{sep}application_name={APP}", table=table, timeout=2.0
    )


@pytest.fixture
def credits(pg_url: str, pg_table: str) -> Iterator[str]:
    """The application's own table the transactional tool writes to."""
    name = f"{pg_table}_credits"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {name} (key text NOT NULL, fence int NOT NULL, pid int)")
    yield name


def credit_rows(url: str, table: str) -> list[tuple[str, int, int]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return list(conn.execute(f"SELECT key, fence, pid FROM {table}"))  # type: ignore[arg-type]


def credit(table: str, hook: Callable[[], None] | None = None) -> Callable[[], str]:
    """The transactional tool: insert one credit row on the transaction's connection."""

    def action() -> str:
        ctx = get_idempotency_context()
        assert ctx is not None and ctx.connection is not None
        ctx.connection.execute(
            f"INSERT INTO {table} VALUES (%s, %s, %s)", (ctx.key, ctx.fence, os.getpid())
        )
        if hook is not None:
            hook()
        return f"credited|{ctx.key}|fence={ctx.fence}|pid={os.getpid()}"

    return action


def engine_for(url: str, table: str, **policy: Any) -> Engine:
    policy.setdefault("lease", LEASE)
    policy.setdefault("wait_timeout", 30.0)
    return Engine(open_store(url, table), Policy(**policy))


# -- P1. SIGKILL inside a transactional tool ---------------------------------------------------


def _killed_in_transaction(url: str, table: str, credits: str, key: str, inside: Any) -> None:
    engine = engine_for(url, table, transactional=True)

    def hang() -> None:
        inside.set()
        time.sleep(60)

    engine.run(key, fingerprint="fp", action=credit(credits, hang))


def test_a_worker_killed_inside_its_transaction_leaves_nothing_and_the_takeover_commits_once(
    pg_url: str,
    pg_table: str,
    credits: str,
    record: Callable[[Figures], None],
    campaign: bool,
) -> None:
    n = 10 if campaign else 2
    keys = [f"killed-{i}-{time.monotonic_ns()}" for i in range(n)]
    inside = {key: FORK.Event() for key in keys}
    procs = {
        key: FORK.Process(
            target=_killed_in_transaction, args=(pg_url, pg_table, credits, key, inside[key])
        )
        for key in keys
    }
    for p in procs.values():
        p.start()
    try:
        for key in keys:
            assert inside[key].wait(30), "the worker never reached its tool"
        rows_before_kill = len(credit_rows(pg_url, credits))
        for p in procs.values():
            kill_hard(p.pid)  # type: ignore[arg-type]
    finally:
        for p in procs.values():
            p.join(10)
    assert rows_before_kill == 0  # uncommitted: invisible
    time.sleep(0.2)  # the server notices the dead clients and rolls back
    assert credit_rows(pg_url, credits) == []

    engine = engine_for(pg_url, pg_table, transactional=True)
    tally = Tally()
    blocked: dict[str, float] = {}

    def successor(key: str) -> None:
        started = time.monotonic()
        call_until_answered(engine, key, credit(credits), tally)
        blocked[key] = time.monotonic() - started

    threads = [threading.Thread(target=successor, args=(key,)) for key in keys]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    rows = credit_rows(pg_url, credits)
    assert sorted((k, f) for k, f, _ in rows) == sorted((key, 2) for key in keys)
    for key in keys:
        rec = engine.store.get(key)
        assert rec is not None and (rec.state, rec.fence) == (State.COMPLETED, 2)
    answers = {key: result for key, result, _ in tally.rows if result is not None}
    for key in keys:  # a later caller replays the successor's result; nothing runs again
        assert engine.run(key, fingerprint="fp", action=credit(credits)) == answers[key]
    assert len(credit_rows(pg_url, credits)) == len(keys)
    stuck = sum(1 for b in blocked.values() if b > LEASE + SLACK)
    assert stuck == 0, blocked
    figures = Figures(
        "P1. worker SIGKILLed inside a transactional tool (postgres)",
        f"{n} SIGKILLs before the commit",
        calls=len(tally.rows),
        effects=len(rows),
        duplicates=len(rows) - len(keys),
        divergent=0,
        stuck=stuck,
        errors=Counter(e for _, _, e in tally.rows if e),
        notes=[
            "0 rows while the killed transaction was open and after the kill",
            f"successors blocked <= {max(blocked.values()):.2f}s (lease {LEASE:g}s), "
            "TAKEOVER fence 2 committed 1 row each",
        ],
    )
    record(figures)
    engine.store.close()


# -- P2. SIGSTOP past the lease, transactional ---------------------------------------------


def _paused_in_transaction(
    url: str, table: str, credits: str, key: str, at_point: Any, out: Any
) -> None:
    engine = engine_for(url, table, transactional=True, renew_fraction=0.9)
    kinds: list[str] = []
    engine.on_event = lambda e: kinds.append(e.kind)

    def pause() -> None:
        at_point.set()
        os.kill(os.getpid(), signal.SIGSTOP)

    try:
        result: str = engine.run(key, fingerprint="fp", action=credit(credits, pause))
        out.put(("ok", result, kinds))
    except BaseException as exc:
        out.put((type(exc).__name__, str(exc), kinds))


def test_a_worker_paused_past_its_lease_has_its_commit_refused_and_rolled_back(
    pg_url: str,
    pg_table: str,
    credits: str,
    record: Callable[[Figures], None],
    campaign: bool,
) -> None:
    n = 5 if campaign else 1
    engine = engine_for(pg_url, pg_table, transactional=True)
    errors: Counter[str] = Counter()
    successor_results: dict[str, str] = {}
    paused_results = 0
    for i in range(n):
        key = f"paused-{i}-{time.monotonic_ns()}"
        at_point, out = FORK.Event(), FORK.Queue()
        worker = FORK.Process(
            target=_paused_in_transaction, args=(pg_url, pg_table, credits, key, at_point, out)
        )
        worker.start()
        try:
            assert at_point.wait(30)
            wait_stopped(worker.pid)  # type: ignore[arg-type]
            time.sleep(LEASE + 0.1)  # its lease runs out while it is stopped
            result = engine.run(key, fingerprint="fp", action=credit(credits))
            successor_results[key] = result
            assert "fence=2" in result
            os.kill(worker.pid, signal.SIGCONT)  # type: ignore[arg-type]
            kind, message, events = out.get(timeout=30)
        finally:
            kill_hard(worker.pid)  # type: ignore[arg-type]
            worker.join(10)
        if kind != "ok":
            errors[kind] += 1
        # Its commit was refused and rolled back; the record holds the successor's result,
        # which the paused worker's caller gets too (one result per key).
        assert (kind, message) == ("ok", result)
        assert "stale_completion" in events
        paused_results += 1
        rec = engine.store.get(key)
        assert rec is not None and rec.state is State.COMPLETED and rec.fence == 2
        # A retry by the paused worker's caller replays the successor's result.
        assert engine.run(key, fingerprint="fp", action=credit(credits)) == result
    rows = credit_rows(pg_url, credits)
    assert sorted((k, f) for k, f, _ in rows) == sorted((k, 2) for k in successor_results)
    figures = Figures(
        "P2. worker SIGSTOPped past its lease in a transactional tool (postgres)",
        f"{n} SIGSTOP/SIGCONT after the write, before the commit",
        calls=3 * n,
        effects=len(rows),
        duplicates=len(rows) - n,
        divergent=0,
        errors=errors,
        notes=[
            "paused owner's commit refused under the row lock: rolled back, 0 rows from it",
            f"{paused_results} paused callers got the successor's result (replayed)",
        ],
    )
    record(figures)
    engine.store.close()


# -- P3 / P4. backends terminated, server restarted, mid-batch ---------------------------------

RETRY_ON = (StoreUnavailableError, InProgressError, LeaseLostError, psycopg.OperationalError)


def run_batch(
    engine: Engine,
    keys: list[str],
    action_for: Callable[[str], Callable[[], str]],
    *,
    callers_per_key: int = 2,
    threads: int = 8,
) -> Tally:
    """Every key called ``callers_per_key`` times by ``threads`` threads, in mixed order."""
    work = [key for key in keys for _ in range(callers_per_key)]
    random.Random(7).shuffle(work)
    lock = threading.Lock()
    tallies = [Tally() for _ in range(threads)]

    def worker(t: int) -> None:
        rng = random.Random(t)
        while True:
            with lock:
                if not work:
                    return
                key = work.pop()
            call_until_answered(
                engine, key, action_for(key), tallies[t], retry_on=RETRY_ON, rng=rng
            )

    pool = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(300)
    tally = Tally()
    for t in tallies:
        tally.rows += t.rows
    return tally


def batch_figures(
    scenario: str, faults: str, tally: Tally, keys: list[str], effects: dict[str, int]
) -> Figures:
    results: dict[str, set[str]] = {}
    for key, result, _ in tally.rows:
        if result is not None:
            results.setdefault(key, set()).add(result)
    return Figures(
        scenario,
        faults,
        calls=len(tally.rows),
        effects=sum(effects.values()),
        duplicates=sum(n - 1 for n in effects.values() if n > 1),
        divergent=sum(1 for r in results.values() if len(r) > 1),
        errors=Counter(e for _, _, e in tally.rows if e),
    )


def terminate_store_backends(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = %s AND pid <> pg_backend_pid()",
            (APP,),
        ).fetchone()
    return int(row[0]) if row else 0


@pytest.mark.parametrize("mode", ["normal", "transactional"])
def test_store_backends_terminated_mid_batch_change_no_effect_count(
    pg_url: str,
    pg_table: str,
    credits: str,
    ledger: Ledger,
    record: Callable[[Figures], None],
    campaign: bool,
    mode: str,
) -> None:
    n_keys = 400 if campaign else 80
    rounds = 40 if campaign else 10
    keys = [f"term-{i}-{time.monotonic_ns()}" for i in range(n_keys)]
    transactional = mode == "transactional"
    engine = engine_for(pg_url, pg_table, transactional=transactional)
    stop = threading.Event()
    terminated: list[int] = []

    def killer() -> None:
        for _ in range(rounds):
            if stop.wait(0.05):
                return
            terminated.append(terminate_store_backends(pg_url))

    def action_for(key: str) -> Callable[[], str]:
        if transactional:
            return credit(credits, lambda: time.sleep(0.002))
        return refund(ledger, key, sleep=0.002)

    k = threading.Thread(target=killer)
    k.start()
    tally = run_batch(engine, keys, action_for)
    stop.set()
    k.join()
    if transactional:
        effects = Counter(key for key, _, _ in credit_rows(pg_url, credits))
    else:
        ledger.calls(tally.rows)
        effects = Counter(ledger.effects())
    figures = batch_figures(
        f"P3. pg_terminate_backend of the store's connections mid-batch ({mode})",
        f"{sum(terminated)} backends terminated in {len(terminated)} rounds",
        tally,
        keys,
        dict(effects),
    )
    if transactional:
        figures.notes.append(
            "errors from the tool itself (AdminShutdown) are its statements on a terminated "
            "transaction: rolled back, key released, caller retried"
        )
    else:
        reruns = sum(n - 1 for n in ledger.executions().values() if n > 1)
        if reruns:
            figures.notes.append(
                f"tool re-ran {reruns}x: a completion lost to a terminated backend leaves "
                "the result unrecorded; the duplicate caller took over (effect deduplicated "
                "downstream by key, its result differs: the divergent results)"
            )
    record(figures)
    assert dict(effects) == dict.fromkeys(keys, 1)
    assert figures.duplicates == 0
    if transactional:
        assert figures.divergent == 0
    engine.store.close()


@pytest.fixture(scope="module")
def own_server() -> Iterator[PostgresServer]:
    if os.environ.get("IDEMPOTENCY_TEST_PG_URL"):
        pytest.skip("restarts need a throwaway cluster, not IDEMPOTENCY_TEST_PG_URL")
    reason = postgres_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    with PostgresServer() as server:
        yield server


@pytest.mark.parametrize("mode", ["normal", "transactional"])
def test_a_postgres_restart_mid_batch_fails_closed_then_resumes_without_duplicate_effects(
    own_server: PostgresServer,
    pg_table: str,
    ledger: Ledger,
    record: Callable[[Figures], None],
    campaign: bool,
    mode: str,
) -> None:
    url = own_server.url
    n_keys = 400 if campaign else 120
    keys = [f"restart-{i}-{time.monotonic_ns()}" for i in range(n_keys)]
    transactional = mode == "transactional"
    credits = f"{pg_table}_credits"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {credits} (key text NOT NULL, fence int NOT NULL, pid int)")
    engine = engine_for(url, pg_table, transactional=transactional)
    engine.store.setup()  # type: ignore[attr-defined]
    quarter = threading.Event()
    ran: list[str] = []
    downtime: list[float] = []
    restarted_at: list[float] = []

    def restarter() -> None:
        quarter.wait(60)
        t0 = time.monotonic()
        own_server.restart()
        downtime.append(time.monotonic() - t0)
        restarted_at.append(time.monotonic())

    def count() -> None:
        ran.append("x")
        if len(ran) >= n_keys // 4:
            quarter.set()
        time.sleep(0.02)

    def action_for(key: str) -> Callable[[], str]:
        if transactional:
            return credit(credits, count)
        return refund(ledger, key, before=count)

    r = threading.Thread(target=restarter)
    r.start()
    tally = run_batch(engine, keys, action_for)
    finished = time.monotonic()
    r.join()
    assert restarted_at and restarted_at[0] < finished, "the restart was not mid-batch"
    if transactional:
        effects = Counter(key for key, _, _ in credit_rows(url, credits))
    else:
        ledger.calls(tally.rows)
        effects = Counter(ledger.effects())
    figures = batch_figures(
        f"P4. PostgreSQL restart mid-batch ({mode})",
        f"1 fast shutdown + start after 1/4 of the keys ({downtime[0]:.1f}s down)",
        tally,
        keys,
        dict(effects),
    )
    if not transactional:
        reruns = sum(n - 1 for n in ledger.executions().values() if n > 1)
        if reruns:
            figures.notes.append(
                f"tool re-ran {reruns}x after a completion was lost in the outage "
                "(deduplicated downstream by key)"
            )
    record(figures)
    assert dict(effects) == dict.fromkeys(keys, 1)
    assert figures.duplicates == 0
    if transactional:
        assert figures.divergent == 0
    engine.store.close()


# -- P5. load ------------------------------------------------------------------------------------

HOT_KEYS = 50


@pytest.mark.timeout(600)
def test_load_on_fifty_hot_keys_from_four_processes_executes_exactly_fifty_times(
    pg_url: str,
    pg_table: str,
    ledger: Ledger,
    record: Callable[[Figures], None],
    campaign: bool,
) -> None:
    total = 20_000 if campaign else 2_000
    keys = [f"hot-{i}-{time.monotonic_ns()}" for i in range(HOT_KEYS)]
    open_store(pg_url, pg_table).setup()  # the workers race on rows, not on DDL
    figures = hot_key_load(
        lambda: engine_for(pg_url, pg_table, lease=30.0, wait_timeout=60.0),
        ledger,
        keys,
        total,
        scenario=f"P5. load: {PROCESSES} processes x {THREADS} threads, {HOT_KEYS} hot keys "
        "(postgres)",
    )
    assert ledger.executions() == dict.fromkeys(keys, 1)
    record(figures)
    assert figures.calls == total
    assert figures.effects == HOT_KEYS
    assert figures.divergent == 0 and figures.duplicates == 0
    assert not figures.errors
