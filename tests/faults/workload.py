"""The tool every fault scenario runs, and the callers that run it.

The tool is a refund: it logs that its body ran, sends the effect downstream with the
idempotency key and fence it was handed (``get_idempotency_context()``), and returns the
downstream's answer tagged with the run that produced it — so a caller that got a
different run's result shows up as a divergence.

:func:`hot_key_load` is the load scenario every store runs: forked processes x threads,
each call on a key drawn from a small hot set, every caller retrying until answered.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from langchain_idempotent import (
    IdempotencyError,
    InProgressError,
    StoreUnavailableError,
    get_idempotency_context,
)
from langchain_idempotent.core.engine import Engine
from tests.support.faults import Ledger, Tally

from .report import Figures

__all__ = ["PROCESSES", "THREADS", "StaleFence", "call_until_answered", "hot_key_load", "refund"]

FORK = mp.get_context("fork")
#: The load scenario's shape: forked processes, threads in each.
PROCESSES, THREADS = 4, 8


class StaleFence(Exception):
    """The downstream rejected the write: a newer owner (higher fence) already wrote."""


def refund(
    ledger: Ledger,
    key: str,
    *,
    value: str = "refund:140",
    sleep: float = 0.0,
    before: Callable[[], None] | None = None,
    during: Callable[[], None] | None = None,
    after: Callable[[], None] | None = None,
) -> Callable[[], str]:
    """The tool body for the call ``key``. ``before`` / ``during`` / ``after`` run around
    the downstream effect (``during`` inside its open transaction), for fault injection.

    Without an idempotency context (called outside the engine) it sends no idempotency
    key, like a tool that has none to send: the downstream cannot deduplicate that effect.
    A fail-open run has a context (``protected=False``, fence 0) and sends its key.
    """

    def action() -> str:
        ctx = get_idempotency_context()
        fence = ctx.fence if ctx is not None else 0
        ledger.executed(key, fence, ctx.attempt if ctx else 0, bool(ctx and ctx.takeover))
        if sleep:
            time.sleep(sleep)
        if before is not None:
            before()
        reply = ledger.apply(
            key, fence, value, idempotency_key=ctx.key if ctx else None, pause=during
        )
        if after is not None:
            after()
        if reply.status == "stale_fence":
            raise StaleFence(f"downstream rejected fence {fence} for {key}: a newer owner wrote")
        return f"{reply.value}|run={os.getpid()}.{fence}.{uuid.uuid4().hex[:8]}"

    return action


def call_until_answered(
    engine: Engine,
    key: str,
    action: Callable[[], str],
    tally: Tally,
    *,
    deadline_s: float = 30.0,
    retry_on: tuple[type[BaseException], ...] = (StoreUnavailableError, InProgressError),
    rng: random.Random | None = None,
) -> Any:
    """A caller with a retry loop (backoff 10 ms doubling to 200 ms) on ``retry_on``.

    Every error seen is tallied (so "errors surfaced" counts them); the final answer too.
    Returns the result, or the last error if the deadline passed.
    """
    rng = rng or random.Random()
    delay = 0.01
    give_up = time.monotonic() + deadline_s
    while True:
        try:
            result = engine.run(key, fingerprint="fp", action=action)
        except retry_on as exc:
            tally.error(key, exc)
            if time.monotonic() > give_up:
                return exc
            time.sleep(delay * (0.5 + rng.random()))
            delay = min(delay * 2, 0.2)
            continue
        except (IdempotencyError, StaleFence) as exc:
            tally.error(key, exc)
            return exc
        tally.ok(key, result)
        return result


def hot_key_load(
    open_engine: Callable[[], Engine],
    ledger: Ledger,
    keys: list[str],
    total: int,
    *,
    scenario: str,
) -> Figures:
    """``total`` calls on ``keys`` from :data:`PROCESSES` forked processes x :data:`THREADS`
    threads, each process with its own engine from ``open_engine()`` (its store closed at
    the end), each call a :func:`refund` through :func:`call_until_answered`.

    Every process must exit cleanly; the figures are the ledger's, named ``scenario``,
    with the throughput in a note.
    """
    barrier = FORK.Barrier(PROCESSES)
    procs = [
        FORK.Process(
            target=_load_worker,
            args=(i, open_engine, ledger, keys, total // PROCESSES, barrier),
        )
        for i in range(PROCESSES)
    ]
    started = time.perf_counter()
    for p in procs:
        p.start()
    for p in procs:
        p.join(540)
    elapsed = time.perf_counter() - started
    assert [p.exitcode for p in procs] == [0] * PROCESSES
    return Figures.from_ledger(
        scenario,
        "none (contention only)",
        ledger,
        notes=[f"{total / elapsed:,.0f} calls/s on 2 cores ({elapsed:.1f}s)"],
    )


def _load_worker(
    index: int,
    open_engine: Callable[[], Engine],
    ledger: Ledger,
    keys: list[str],
    calls: int,
    barrier: Any,
) -> None:
    engine = open_engine()
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
    engine.store.close()
