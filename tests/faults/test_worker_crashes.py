"""Scenarios 1 and 2: workers killed (SIGKILL) or paused (SIGSTOP) in the middle of a tool.

The tool applies its effect to a downstream ledger that deduplicates on the idempotency
key and rejects a fence lower than the highest it has seen (see ``workload.refund``). Each
worker is a forked process with a 1 s lease.

1. **Killed** before, during (inside the downstream transaction, which then rolls back) or
   after the side effect. The next caller is blocked for at most one lease, takes over
   with fence 2 / attempt 2 and is told it is a takeover; the effect is applied once.
2. **Paused** past its lease (the worker stops itself with SIGSTOP at the chosen point, so
   its renewal thread stops too), then resumed (SIGCONT) either after the new owner
   completed or while it still runs. The paused worker cannot release or renew the new
   owner's record, its late completion stores nothing over a result, the ledger rejects
   its stale fence, and every caller sees one result.
"""

from __future__ import annotations

import faulthandler
import multiprocessing as mp
import os
import signal
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from langchain_idempotent import InProgressError, Policy, StoreUnavailableError
from langchain_idempotent.core.engine import Engine
from langchain_idempotent.core.record import State
from langchain_idempotent.stores.sqlite import SqliteIdempotencyStore
from tests.support.faults import Ledger, StoreSpec, Tally, kill_hard, wait_stopped, wait_until

from .report import Figures
from .workload import StaleFence, call_until_answered, refund

FORK = mp.get_context("fork")
LEASE = 1.0
#: How much longer than one lease a successor may wait before the record counts as stuck.
SLACK = 0.5


def engine_for(spec: StoreSpec, **policy: Any) -> Engine:
    policy.setdefault("lease", LEASE)
    policy.setdefault("wait_timeout", 30.0)
    return Engine(spec.open(), Policy(**policy))


def refund_pausing(
    ledger: Ledger, key: str, phase: str, hook: Callable[[], None]
) -> Callable[[], str]:
    """The refund tool with ``hook`` run ``before``, ``during`` or ``after`` its effect."""
    return refund(
        ledger,
        key,
        before=hook if phase == "before" else None,
        during=hook if phase == "during" else None,
        after=hook if phase == "after" else None,
    )


# -- 1. killed ----------------------------------------------------------------------------

PHASES = ("before", "during", "after")


def _doomed(spec: StoreSpec, ledger: Ledger, key: str, phase: str, at_point: Any) -> None:
    """Run ``key``; hang at ``phase`` of the side effect until SIGKILLed."""
    engine = engine_for(spec)

    def hang() -> None:
        at_point.set()
        time.sleep(3600)

    engine.run(key, fingerprint="fp", action=refund_pausing(ledger, key, phase, hang))


def test_a_worker_killed_before_during_or_after_the_effect_is_taken_over_once(
    spec: StoreSpec,
    ledger: Ledger,
    record: Callable[[Figures], None],
    campaign: bool,
) -> None:
    per_phase = 10 if campaign else 1
    work = [
        (f"killed-{phase}-{i}-{os.getpid()}-{time.monotonic_ns()}", phase)
        for phase in PHASES
        for i in range(per_phase)
    ]
    points = {key: FORK.Event() for key, _ in work}
    procs = {
        key: FORK.Process(target=_doomed, args=(spec, ledger, key, phase, points[key]))
        for key, phase in work
    }
    for p in procs.values():
        p.start()
    killed: set[str] = set()
    try:
        # Kill each worker the moment it reaches its point (a worker paused inside the
        # ledger's transaction holds its lock, so the others wait for that kill).
        def all_killed() -> bool:
            for key, event in points.items():
                if key not in killed and event.is_set():
                    pid = procs[key].pid
                    assert pid is not None
                    kill_hard(pid)
                    killed.add(key)
            return len(killed) == len(work)

        wait_until(all_killed, 60, "every worker to reach its kill point", every=0.002)
    finally:
        for p in procs.values():
            if p.pid is not None:
                kill_hard(p.pid)
            p.join(10)
    assert all(p.exitcode == -signal.SIGKILL for p in procs.values())

    engine = engine_for(spec)
    tally = Tally()
    blocked: dict[str, float] = {}

    def successor(key: str) -> None:
        started = time.monotonic()
        call_until_answered(engine, key, refund(ledger, key), tally)
        blocked[key] = time.monotonic() - started

    threads = [threading.Thread(target=successor, args=(key,)) for key, _ in work]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for key, _ in work:  # a later caller replays
        tally.ok(key, engine.run(key, fingerprint="fp", action=refund(ledger, key)))
    ledger.calls(tally.rows)

    runs = ledger.execution_fences()
    for key, phase in work:
        mine = [(fence, attempt, takeover) for k, fence, attempt, takeover in runs if k == key]
        assert mine == [(1, 1, 0), (2, 2, 1)], (phase, mine)  # told it is a takeover
    assert ledger.effects() == {key: 1 for key, _ in work}
    statuses = ledger.requests()
    # One effect per key: by the successor ("before"; "during", whose transaction rolled
    # back), or by the killed worker ("after"), the successor's request then a duplicate.
    assert statuses == {"applied": 3 * per_phase, "duplicate": per_phase}
    stuck = sum(1 for b in blocked.values() if b > LEASE + SLACK)
    assert stuck == 0, blocked
    for key, _ in work:
        rec = engine.store.get(key)
        assert rec is not None and rec.state is State.COMPLETED and rec.fence == 2
    figures = Figures.from_ledger(
        f"1. worker SIGKILLed mid-tool ({spec.kind})",
        f"{len(work)} SIGKILLs: {per_phase} before / during / after the effect",
        ledger,
        stuck=stuck,
        notes=[
            f"successors blocked <= {max(blocked.values()):.2f}s (lease {LEASE:g}s), "
            "all TAKEOVER fence 2 attempt 2",
            f"kill during the effect: downstream transaction rolled back ({per_phase}x)",
        ],
    )
    record(figures)
    assert figures.divergent == 0 and figures.duplicates == 0


# -- 2. paused ----------------------------------------------------------------------------


def _sleeper(
    spec: StoreSpec, ledger: Ledger, key: str, phase: str, at_point: Any, first_done: Any
) -> None:
    """Run ``key`` and stop this whole process (SIGSTOP) ``phase`` the side effect."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the parent asks when stuck
    kinds: list[str] = []
    # Its first renewal is due 0.9 s after the claim, well after it pauses: on SQLite a
    # process stopped *inside* a renewal's write transaction would hold the file's write
    # lock and block everyone (that case is its own scenario below).
    engine = engine_for(spec, renew_fraction=0.9)
    engine.on_event = lambda e: kinds.append(e.kind)
    tally = Tally()

    def pause() -> None:
        at_point.set()
        os.kill(os.getpid(), signal.SIGSTOP)

    try:
        tally.ok(
            key, engine.run(key, fingerprint="fp", action=refund_pausing(ledger, key, phase, pause))
        )
    except StaleFence as exc:  # the downstream refused our (older) fence
        tally.error(key, exc)
        first_done.set()
        # The caller retries, as callers do: it replays the new owner's result.
        call_until_answered(
            engine,
            key,
            refund(ledger, key),
            tally,
            retry_on=(StoreUnavailableError, InProgressError),
        )
    first_done.set()
    ledger.calls(tally.rows)
    # It never freed the new owner's key (a failed release emits no "release" event);
    # the parent checks the exit code.
    assert "release" not in kinds, kinds


RESUMES = ("after the new owner completed", "while the new owner runs")


def test_a_worker_paused_past_its_lease_changes_nothing_when_it_resumes(
    spec: StoreSpec,
    ledger: Ledger,
    record: Callable[[Figures], None],
    campaign: bool,
) -> None:
    per_case = 5 if campaign else 1
    cases = [
        (f"paused-{phase}-{r}-{i}-{time.monotonic_ns()}", phase, resume)
        for phase in ("before", "after")
        for r, resume in enumerate(RESUMES)
        for i in range(per_case)
    ]
    engine = engine_for(spec, lease=30.0)
    tally = Tally()
    failures: list[BaseException] = []

    def scenario(key: str, phase: str, resume: str) -> None:
        proc, at_point, first_done = workers[key]
        assert proc.pid is not None
        try:
            if not at_point.wait(30):
                os.kill(proc.pid, signal.SIGUSR1)  # its stacks go to stderr
                time.sleep(1)
                raise AssertionError(f"worker for {key} never reached its pause point")
            wait_stopped(proc.pid)
            time.sleep(LEASE + 0.3)  # its lease (renewed every lease/3 until the stop) ends
            in_hook = threading.Event()

            def hold() -> None:  # the new owner, after its effect, waits for the old one
                in_hook.set()
                if resume == RESUMES[1]:
                    assert first_done.wait(30)

            new_owner = threading.Thread(
                target=lambda: tally.ok(
                    key, engine.run(key, fingerprint="fp", action=refund(ledger, key, after=hold))
                )
            )
            new_owner.start()
            if resume == RESUMES[0]:
                new_owner.join(30)
            else:
                assert in_hook.wait(30)
            os.kill(proc.pid, signal.SIGCONT)
            new_owner.join(30)
            proc.join(30)
            assert proc.exitcode == 0
            tally.ok(key, engine.run(key, fingerprint="fp", action=refund(ledger, key)))
        except BaseException as exc:
            failures.append(exc)
        finally:
            if proc.is_alive():
                kill_hard(proc.pid)
            proc.join(5)

    # Every worker is forked here, before the scenario threads start: a fork while another
    # thread of this process is inside SQLite (the ledger) can leave SQLite's own mutex
    # locked in the child, which then hangs on its first connection.
    workers: dict[str, tuple[Any, Any, Any]] = {}
    for key, phase, _ in cases:
        at_point, first_done = FORK.Event(), FORK.Event()
        proc = FORK.Process(target=_sleeper, args=(spec, ledger, key, phase, at_point, first_done))
        proc.start()
        workers[key] = (proc, at_point, first_done)
    threads = [threading.Thread(target=scenario, args=case) for case in cases]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert not failures, failures
    ledger.calls(tally.rows)

    keys = [key for key, _, _ in cases]
    effects = ledger.effects()
    assert {k: effects.get(k) for k in keys} == dict.fromkeys(keys, 1)
    results = ledger.results()
    assert all(len(results[k]) == 1 for k in keys), results
    statuses = ledger.requests()
    for key, _, _ in cases:
        rec = engine.store.get(key)
        assert rec is not None and rec.state is State.COMPLETED
    figures = Figures.from_ledger(
        f"2. worker SIGSTOPped past its lease ({spec.kind})",
        f"{len(cases)} SIGSTOP/SIGCONT: paused before / after the effect, resumed after / "
        "during the new owner's run",
        ledger,
        notes=[
            f"downstream rejected {statuses.get('stale_fence', 0)} stale-fence writes",
            "paused owners released nothing; late completions stored nothing over a result",
        ],
    )
    record(figures)
    assert figures.divergent == 0 and figures.duplicates == 0


def _holds_the_write_lock(path: str, locked: Any) -> None:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("BEGIN IMMEDIATE")
    locked.set()
    os.kill(os.getpid(), signal.SIGSTOP)  # paused inside a write transaction
    db.execute("ROLLBACK")


def test_on_sqlite_a_worker_paused_inside_a_write_blocks_others_who_fail_closed(
    tmp_path: Path, ledger: Ledger, record: Callable[[Figures], None]
) -> None:
    path = str(tmp_path / "idem.sqlite")
    store = SqliteIdempotencyStore(path, busy_timeout=1.0)
    engine = Engine(store, Policy(lease=LEASE))
    assert engine.run("warm-up", fingerprint="fp", action=lambda: "creates the schema")
    locked = FORK.Event()
    holder = FORK.Process(target=_holds_the_write_lock, args=(path, locked))
    holder.start()
    assert holder.pid is not None
    tally = Tally()
    try:
        assert locked.wait(30)
        wait_stopped(holder.pid)
        started = time.monotonic()
        with pytest.raises(StoreUnavailableError) as raised:
            engine.run("blocked", fingerprint="fp", action=refund(ledger, "blocked"))
        waited = time.monotonic() - started
        tally.error("blocked", raised.value)
        assert ledger.executions() == {}  # fail closed: the tool did not run
        os.kill(holder.pid, signal.SIGCONT)
        holder.join(30)
        assert holder.exitcode == 0
        tally.ok(
            "blocked", engine.run("blocked", fingerprint="fp", action=refund(ledger, "blocked"))
        )
    finally:
        if holder.is_alive():
            kill_hard(holder.pid)
        holder.join(5)
    ledger.calls(tally.rows)
    assert 0.9 < waited < 5.0
    record(
        Figures.from_ledger(
            "2. SQLite: a worker SIGSTOPped inside a write transaction",
            "1 process paused holding the file's write lock",
            ledger,
            notes=[
                f"every other process waited busy_timeout ({waited:.1f}s of 1 s) and failed "
                "closed; a paused process blocks all writers on that file until it resumes"
            ],
        )
    )
