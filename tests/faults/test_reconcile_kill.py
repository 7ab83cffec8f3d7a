"""Scenario 9: uncertain outcomes in real processes, settled by ``reconcile=``.

A worker process is SIGKILLed right after its POST (the downstream committed the effect)
or right before it; an async task in a worker process is cancelled (``task.cancel()``)
after its POST. The next call for the key, made by another process (the test's), takes the
key over and asks the hook whether the effect happened before running the tool again.

The downstream here does **not** deduplicate: every POST is an effect, as at an API with
no idempotency keys. It keeps the call's key as a correlation id, which the hook looks up
(:meth:`Ledger.effect_value`). So a blind re-run is a duplicate effect, and each scenario
also runs without ``reconcile=`` to show the duplicate the hook prevents:

- killed after the effect: with the hook, 0 re-runs, the reconciled result returned, 1
  effect; without it, the tool re-runs: 2 effects;
- killed before the effect: the hook finds nothing and the tool runs once: 1 effect
  (the same without the hook);
- cancelled after the effect: the record says the attempt did not finish, so the next
  call is a takeover (no lease to wait out) and reconciles: 1 effect; without the hook, 2;
- (campaign only) three successor processes race for 30 calls killed after the effect:
  each is reconciled once, the other processes replay it; 0 re-runs.

Each worker holds a 1 s lease; a successor of a killed worker waits at most that long.
The in-process variants (memory store too, the wrapper and the middleware) are in
``tests/test_reconcile.py``.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from langchain_idempotent import IdempotencyEvent, Policy, ReconcileCall, get_idempotency_context
from langchain_idempotent.core.engine import Engine
from langchain_idempotent.core.record import State
from tests.support.faults import Ledger, StoreSpec, Tally, kill_hard, wait_until

from .report import Figures

FORK = mp.get_context("fork")
LEASE = 1.0
SLACK = 0.5
VALUE = "refund:140"


def engine_for(spec: StoreSpec, **policy: Any) -> Engine:
    policy.setdefault("lease", LEASE)
    policy.setdefault("wait_timeout", 30.0)
    return Engine(spec.open(), Policy(**policy))


def post_refund(
    ledger: Ledger,
    key: str,
    *,
    before: Callable[[], None] | None = None,
    after: Callable[[], None] | None = None,
) -> Callable[[], str]:
    """The tool: POST the refund (no dedupe downstream; the key is a correlation id)."""

    def action() -> str:
        ctx = get_idempotency_context()
        assert ctx is not None
        ledger.executed(key, ctx.fence, ctx.attempt, ctx.takeover)
        if before is not None:
            before()
        ledger.apply(key, ctx.fence, VALUE, idempotency_key=None)
        if after is not None:
            after()
        return f"{VALUE}|run=fence{ctx.fence}"

    return action


class Lookup:
    """The reconcile hook: ask the downstream for an effect under the call's key."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.asked: list[ReconcileCall] = []
        self._lock = threading.Lock()

    def __call__(self, call: ReconcileCall) -> str | None:
        with self._lock:
            self.asked.append(call)
        value = self.ledger.effect_value(call.key)
        return None if value is None else f"{value}|reconciled"

    async def async_hook(self, call: ReconcileCall) -> str | None:
        await asyncio.sleep(0)
        return self(call)


class Outcomes:
    """Counts the engine's ``reconcile`` events by outcome (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()

    def __call__(self, event: IdempotencyEvent) -> None:
        if event.kind == "reconcile":
            with self._lock:
                self.counts[str(event.detail["outcome"])] += 1


# -- killed (SIGKILL) before / after the effect ---------------------------------------------


def _doomed(spec: StoreSpec, ledger: Ledger, key: str, phase: str, at_point: Any) -> None:
    """Run ``key``; hang just ``before`` or ``after`` the POST until SIGKILLed."""

    def hang() -> None:
        at_point.set()
        time.sleep(3600)

    action = post_refund(
        ledger,
        key,
        before=hang if phase == "before" else None,
        after=hang if phase == "after" else None,
    )
    engine_for(spec).run(key, fingerprint="fp", action=action)


def _kill_at_points(procs: dict[str, Any], points: dict[str, Any]) -> None:
    killed: set[str] = set()

    def all_killed() -> bool:
        for key, event in points.items():
            if key not in killed and event.is_set():
                kill_hard(procs[key].pid)
                killed.add(key)
        return len(killed) == len(points)

    try:
        wait_until(all_killed, 60, "every worker to reach its kill point", every=0.002)
    finally:
        for p in procs.values():
            if p.pid is not None:
                kill_hard(p.pid)
            p.join(10)
    assert all(p.exitcode == -signal.SIGKILL for p in procs.values())


def test_a_worker_killed_after_its_post_is_reconciled_in_another_process_not_rerun(
    spec: StoreSpec,
    tmp_path: Path,
    record: Callable[[Figures], None],
    campaign: bool,
) -> None:
    per_case = 10 if campaign else 1
    ledgers = _ledgers(tmp_path)
    stamp = f"{os.getpid()}-{time.monotonic_ns()}"
    work = [
        (f"rk-{mode}-{phase}-{i}-{stamp}", mode, phase)
        for mode in ledgers
        for phase in ("before", "after")
        for i in range(per_case)
    ]
    # Every worker is forked before any thread of this process touches SQLite.
    points = {key: FORK.Event() for key, _, _ in work}
    procs = {
        key: FORK.Process(target=_doomed, args=(spec, ledgers[mode], key, phase, points[key]))
        for key, mode, phase in work
    }
    for p in procs.values():
        p.start()
    _kill_at_points(procs, points)

    lookup = Lookup(ledgers["reconcile"])
    outcomes = Outcomes()
    engines = {
        "reconcile": engine_for(spec, reconcile=lookup),
        "none": engine_for(spec),
    }
    engines["reconcile"].on_event = outcomes
    tallies = {mode: Tally() for mode in ledgers}
    answers: dict[str, str] = {}
    blocked: dict[str, float] = {}

    def successor(key: str, mode: str) -> None:
        started = time.monotonic()
        answers[key] = engines[mode].run(
            key, fingerprint="fp", action=post_refund(ledgers[mode], key)
        )
        blocked[key] = time.monotonic() - started
        tallies[mode].ok(key, answers[key])

    threads = [threading.Thread(target=successor, args=(k, m)) for k, m, _ in work]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for key, mode, _ in work:  # a later caller replays
        again = engines[mode].run(key, fingerprint="fp", action=post_refund(ledgers[mode], key))
        assert again == answers[key]
        tallies[mode].ok(key, again)
    for mode, ledger in ledgers.items():
        ledger.calls(tallies[mode].rows)

    runs = {mode: Counter(k for k, *_ in ledgers[mode].execution_fences()) for mode in ledgers}
    effects = {mode: ledgers[mode].effects() for mode in ledgers}
    for key, mode, phase in work:
        rec = engines[mode].store.get(key)
        assert rec is not None and rec.state is State.COMPLETED and rec.fence == 2
        if mode == "reconcile" and phase == "after":  # 0 re-runs, the reconciled result
            assert (runs[mode][key], effects[mode][key]) == (1, 1), key
            assert answers[key] == f"{VALUE}|reconciled"
        elif mode == "reconcile":  # nothing found: the tool ran once, as a takeover
            assert (runs[mode][key], effects[mode][key]) == (2, 1), key
            assert answers[key] == f"{VALUE}|run=fence2"
        else:  # the blind re-run: a second effect when the first one had happened
            assert (runs[mode][key], effects[mode][key]) == (2, 2 if phase == "after" else 1)
    asked = {c.key: c for c in lookup.asked}
    assert len(lookup.asked) == 2 * per_case
    for key, mode, _ in work:
        if mode == "reconcile":
            c = asked[key]
            assert (c.reason, c.previous_attempt, c.attempt, c.fence) == (
                "lease_expired",
                1,
                2,
                2,
            )
    assert outcomes.counts == {"found": per_case, "not_found": per_case}
    stuck = sum(1 for b in blocked.values() if b > LEASE + SLACK)
    assert stuck == 0, blocked

    n = len(work) // 2
    for mode, ledger in ledgers.items():
        figures = _figures(
            f"9. worker SIGKILLed before / after a POST, {_label(mode)} ({spec.kind})",
            f"{n} SIGKILLs: {per_case} before / {per_case} after the effect; downstream "
            "does not deduplicate",
            ledger,
            stuck=stuck,
            notes=(
                [
                    f"reconciled: {outcomes.counts['found']} found (tool not re-run, "
                    f"reconciled result returned), {outcomes.counts['not_found']} not found "
                    "(tool ran once)",
                    f"successors blocked <= {max(blocked.values()):.2f}s (lease {LEASE:g}s)",
                ]
                if mode == "reconcile"
                else [
                    f"tool re-ran after every kill ({n}x): each kill after the effect "
                    "became a second effect"
                ]
            ),
        )
        record(figures)
        assert figures.duplicates == (0 if mode == "reconcile" else per_case)
        assert figures.divergent == 0


def _racing_successor(spec: StoreSpec, ledger: Ledger, keys: list[str], found: Any) -> None:
    """One of several processes that call every key at once after the kills."""
    lookup = Lookup(ledger)
    outcomes = Outcomes()
    engine = engine_for(spec, reconcile=lookup)
    engine.on_event = outcomes
    tally = Tally()
    for key in keys:
        tally.ok(key, engine.run(key, fingerprint="fp", action=post_refund(ledger, key)))
    ledger.calls(tally.rows)
    with found.get_lock():
        found.value += outcomes.counts["found"]


@pytest.mark.campaign
def test_racing_successor_processes_reconcile_each_killed_call_once(
    spec: StoreSpec, ledger: Ledger, record: Callable[[Figures], None]
) -> None:
    n, racers = 30, 3
    stamp = f"{os.getpid()}-{time.monotonic_ns()}"
    keys = [f"rr-{i}-{stamp}" for i in range(n)]
    points = {key: FORK.Event() for key in keys}
    procs = {
        key: FORK.Process(target=_doomed, args=(spec, ledger, key, "after", points[key]))
        for key in keys
    }
    found = FORK.Value("i", 0)
    successors = [
        FORK.Process(target=_racing_successor, args=(spec, ledger, keys, found))
        for i in range(racers)
    ]
    for p in procs.values():
        p.start()
    _kill_at_points(procs, points)
    started = time.monotonic()
    for p in successors:
        p.start()
    for p in successors:
        p.join(120)
    took = time.monotonic() - started
    assert [p.exitcode for p in successors] == [0] * racers
    assert ledger.executions() == dict.fromkeys(keys, 1)  # 0 re-runs
    assert ledger.effects() == dict.fromkeys(keys, 1)
    assert found.value == n  # one reconcile per key; the other processes replayed it
    assert ledger.results() == {k: {f"{VALUE}|reconciled"} for k in keys}
    figures = _figures(
        f"9. {racers} processes race to take over {n} SIGKILLed calls, reconcile= ({spec.kind})",
        f"{n} SIGKILLs after the effect; {racers} successor processes call every key",
        ledger,
        stuck=0,
        notes=[
            f"{found.value} reconciles for {n} keys (one each, the others replayed it); "
            f"0 re-runs; all done in {took:.2f}s (lease {LEASE:g}s)"
        ],
    )
    record(figures)
    assert figures.duplicates == 0 and figures.divergent == 0


# -- an async task cancelled after the effect -----------------------------------------------


def _cancelled_after_post(spec: StoreSpec, ledger: Ledger, keys: list[str]) -> None:
    """For each key: start the tool as an asyncio task, cancel it once its POST is done.

    The worker then exits normally: its record says the attempt started and did not
    finish (``abandon``, reason ``cancelled``)."""

    async def one(engine: Engine, key: str) -> None:
        posted = asyncio.Event()

        async def action() -> str:
            ctx = get_idempotency_context()
            assert ctx is not None
            ledger.executed(key, ctx.fence, ctx.attempt, ctx.takeover)
            ledger.apply(key, ctx.fence, VALUE, idempotency_key=None)
            posted.set()
            await asyncio.Event().wait()  # the rest of the tool: cancelled here
            return "never"

        task = asyncio.ensure_future(engine.arun(key, fingerprint="fp", action=action))
        await posted.wait()
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return
        raise AssertionError(f"{key}: the cancelled call returned")

    async def main() -> None:
        engine = engine_for(spec)
        await asyncio.gather(*(one(engine, key) for key in keys))

    asyncio.run(main())


async def _arun_all(
    calls: list[tuple[Engine, str, Callable[[], Awaitable[str]]]],
) -> list[tuple[str, float]]:
    async def one(engine: Engine, key: str, action: Callable[[], Awaitable[str]]) -> Any:
        started = time.monotonic()
        answer = await engine.arun(key, fingerprint="fp", action=action)
        return answer, time.monotonic() - started

    return list(await asyncio.gather(*(one(*c) for c in calls)))


def test_an_async_task_cancelled_after_its_post_is_reconciled_by_the_next_process(
    spec: StoreSpec,
    tmp_path: Path,
    record: Callable[[Figures], None],
    campaign: bool,
) -> None:
    per_mode = 10 if campaign else 1
    ledgers = _ledgers(tmp_path)
    stamp = f"{os.getpid()}-{time.monotonic_ns()}"
    keys = {mode: [f"rc-{mode}-{i}-{stamp}" for i in range(per_mode)] for mode in ledgers}
    procs = [
        FORK.Process(target=_cancelled_after_post, args=(spec, ledgers[mode], keys[mode]))
        for mode in ledgers
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    for mode in ledgers:
        store = spec.open()
        for key in keys[mode]:
            rec = store.get(key)
            assert rec is not None and rec.state is State.RUNNING
            assert rec.uncertain(store.now_ms())  # did not finish: no lease to wait out
        store.close()

    lookup = Lookup(ledgers["reconcile"])
    outcomes = Outcomes()
    engines = {
        "reconcile": engine_for(spec, reconcile=lookup.async_hook),
        "none": engine_for(spec),
    }
    engines["reconcile"].on_event = outcomes

    def action(mode: str, key: str) -> Callable[[], Awaitable[str]]:
        sync = post_refund(ledgers[mode], key)

        async def run() -> str:
            return sync()

        return run

    work = [(mode, key) for mode in ledgers for key in keys[mode]]
    answers = asyncio.run(_arun_all([(engines[m], k, action(m, k)) for m, k in work]))
    replays = asyncio.run(_arun_all([(engines[m], k, action(m, k)) for m, k in work]))
    tallies = {mode: Tally() for mode in ledgers}
    for (mode, key), (answer, _), (again, _) in zip(work, answers, replays, strict=True):
        assert again == answer
        tallies[mode].ok(key, answer)
        tallies[mode].ok(key, again)
        if mode == "reconcile":
            assert answer == f"{VALUE}|reconciled"
    for mode, ledger in ledgers.items():
        ledger.calls(tallies[mode].rows)

    assert ledgers["reconcile"].effects() == dict.fromkeys(keys["reconcile"], 1)
    assert ledgers["reconcile"].executions() == dict.fromkeys(keys["reconcile"], 1)
    assert ledgers["none"].effects() == dict.fromkeys(keys["none"], 2)
    assert [c.reason for c in lookup.asked] == ["cancelled"] * per_mode
    assert outcomes.counts == {"found": per_mode}
    waited = max(t for _, t in answers)
    for mode, ledger in ledgers.items():
        figures = _figures(
            f"9. async task cancelled after its POST, {_label(mode)} ({spec.kind})",
            f"{per_mode} task.cancel() after the effect, in a worker process; downstream "
            "does not deduplicate",
            ledger,
            stuck=0,
            notes=(
                [
                    f"next process reconciled {outcomes.counts['found']}x (reason cancelled, "
                    f"no lease to wait out: answered in <= {waited:.2f}s); 0 re-runs"
                ]
                if mode == "reconcile"
                else [f"the next call re-ran the tool ({per_mode}x): a second effect each"]
            ),
        )
        record(figures)
        assert figures.duplicates == (0 if mode == "reconcile" else per_mode)
        assert figures.divergent == 0


# -- figures ---------------------------------------------------------------------------------


def _ledgers(tmp_path: Path) -> dict[str, Ledger]:
    """A non-deduplicating downstream per mode: with the hook, and without it."""
    return {"reconcile": Ledger(tmp_path / "hooked.sqlite"), "none": Ledger(tmp_path / "bare")}


def _label(mode: str) -> str:
    return "reconcile=" if mode == "reconcile" else "no reconcile= (blind re-run)"


def _figures(
    scenario: str, faults: str, ledger: Ledger, *, stuck: int, notes: list[str]
) -> Figures:
    """The ledger's figures; re-runs are described in ``notes`` (this downstream does not
    deduplicate, so :meth:`Figures.from_ledger`'s re-run note does not apply)."""
    effects = ledger.effects()
    return Figures(
        scenario,
        faults,
        calls=ledger.call_count(),
        effects=sum(effects.values()),
        duplicates=sum(n - 1 for n in effects.values() if n > 1),
        divergent=sum(1 for r in ledger.results().values() if len(r) > 1),
        stuck=stuck,
        errors=Counter(ledger.errors()),
        notes=notes,
    )
