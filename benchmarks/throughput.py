"""Throughput with threads and processes, counting how often each key's action ran.

Each worker gets its list of keys before a barrier, then calls ``run(key, action)`` for
every key as fast as it can; the action only counts itself per key. Two key patterns:

* ``distinct``: every call has its own key (every call is a first run);
* ``hot``: all workers go through the same generations of 16 keys, each worker in its own
  shuffled order, so several workers race for each key at about the same time. Exactly one
  execution per key is right; more are duplicates (the reference approach's GET / SET NX
  window), and a call answered with an error (its "Lock contention") is counted apart.

Reported per case: calls/s (every answered call), results/s (calls answered with a
result), errors by type, and executions per key (keys run more than once, duplicate
executions, keys never run). Process workers are started once and reused.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from . import ours
from .reference import ReferenceIdempotency

__all__ = ["ProcessPool", "ThroughputSpec", "run_case", "summarize"]

HOT_KEYS = 16

PRELOAD = [
    "benchmarks.throughput",
    "langchain_idempotent",
    "langchain_idempotent.stores.redis",
    "langchain_idempotent.stores.sqlite",
]

Call = Callable[[str, Callable[[], Any]], Any]


@dataclass(frozen=True)
class ThroughputSpec:
    impl: str  # "reference" | "ours_redis" | "ours_sqlite" | "ours_memory"
    mode: str  # "threads" | "processes"
    workers: int
    keys: str  # "distinct" | "hot"
    calls_per_worker: int

    @property
    def id(self) -> str:
        return f"{self.impl}:{self.mode}:{self.workers}:{self.keys}"


def make_caller(impl: str, redis_url: str, workdir: str) -> tuple[Call, Callable[[], None]]:
    """``run(key, action)`` for ``impl`` and a cleanup."""
    if impl == "reference":
        import redis

        client = redis.Redis.from_url(redis_url)
        ref = ReferenceIdempotency(client)
        return ref.run, client.close
    kind = impl.removeprefix("ours_")
    workdir = os.path.join(workdir, "throughput") if kind == "sqlite" else workdir
    os.makedirs(workdir, exist_ok=True)
    store = ours.make_store(kind, redis_url=redis_url, workdir=workdir)
    engine = ours.make_engine(store)

    def call(key: str, action: Callable[[], Any]) -> Any:
        return engine.run(key, fingerprint="fp", action=action)

    return call, store.close


def worker_keys(spec: ThroughputSpec, worker: int, tag: str) -> list[str]:
    if spec.keys == "distinct":
        return [f"tp:{tag}:d:{worker}:{i}" for i in range(spec.calls_per_worker)]
    rng = random.Random(f"{tag}:{worker}")
    generations = max(1, spec.calls_per_worker // HOT_KEYS)
    keys: list[str] = []
    for g in range(generations):
        order = list(range(HOT_KEYS))
        rng.shuffle(order)
        keys += [f"tp:{tag}:h:{g}:{j}" for j in order]
    return keys


def expected_keys(spec: ThroughputSpec, tag: str) -> set[str]:
    out: set[str] = set()
    for w in range(spec.workers):
        out.update(worker_keys(spec, w, tag))
    return out


def work(call: Call, keys: list[str]) -> dict[str, Any]:
    """Call every key once; count executions per key, results and errors."""
    executions: dict[str, int] = {}
    errors: dict[str, int] = {}
    ok = 0
    t0 = time.monotonic()
    for key in keys:

        def action(key: str = key) -> dict[str, bool]:
            executions[key] = executions.get(key, 0) + 1
            return {"ok": True}

        try:
            call(key, action)
            ok += 1
        except Exception as exc:
            name = type(exc).__name__
            errors[name] = errors.get(name, 0) + 1
    t1 = time.monotonic()
    return {"executions": executions, "errors": errors, "ok": ok, "t0": t0, "t1": t1}


def _run_threads(spec: ThroughputSpec, redis_url: str, workdir: str, tag: str) -> list[Any]:
    call, close = make_caller(spec.impl, redis_url, workdir)
    barrier = threading.Barrier(spec.workers)
    results: list[Any] = [None] * spec.workers

    def target(i: int) -> None:
        keys = worker_keys(spec, i, tag)
        barrier.wait()
        results[i] = work(call, keys)

    threads = [threading.Thread(target=target, args=(i,)) for i in range(spec.workers)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        close()
    return results


def _process_main(index: int, inbox: Any, outbox: Any, barrier: Any) -> None:
    while True:
        task = inbox.get()
        if task is None:
            return
        spec, redis_url, workdir, tag = task
        try:
            call, close = make_caller(spec.impl, redis_url, workdir)
            try:
                keys = worker_keys(spec, index, tag)
                barrier.wait(timeout=120)
                result: Any = work(call, keys)
            finally:
                close()
        except BaseException as exc:
            result = {"failure": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()}
        outbox.put((index, result))


def _process_entry(index: int, inbox: Any, outbox: Any, barrier: Any) -> None:
    try:
        _process_main(index, inbox, outbox, barrier)
    finally:
        # Flush the result queue, then skip interpreter teardown (seconds on a busy box).
        outbox.close()
        outbox.join_thread()
        os._exit(0)


class ProcessPool:
    """``n`` worker processes, kept for every process case of the run.

    They come from a fork server that imported the library once (``forkserver`` with
    preload), so no worker inherits this process's threads or connections and the heavy
    imports are paid once, not once per worker.
    """

    def __init__(self, n: int) -> None:
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)  # import errors are ignored there
        self.n = n
        self.barrier = ctx.Barrier(n)
        self.inboxes = [ctx.Queue() for _ in range(n)]
        self.outbox = ctx.Queue()
        self.procs = [
            ctx.Process(
                target=_process_entry,
                args=(i, self.inboxes[i], self.outbox, self.barrier),
                daemon=True,
            )
            for i in range(n)
        ]
        for p in self.procs:
            p.start()

    def run(self, spec: ThroughputSpec, redis_url: str, workdir: str, tag: str) -> list[Any]:
        for box in self.inboxes:
            box.put((spec, redis_url, workdir, tag))
        results: list[Any] = [None] * self.n
        for _ in range(self.n):
            i, res = self.outbox.get(timeout=600)
            results[i] = res
        if any("failure" in r for r in results):
            self.barrier.reset()
        return results

    def close(self) -> None:
        for box in self.inboxes:
            box.put(None)
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()


def run_case(
    spec: ThroughputSpec,
    redis_url: str,
    workdir: str,
    tag: str,
    pool: ProcessPool | None,
) -> dict[str, Any]:
    """Run one case and summarize it (or report why it could not run)."""
    try:
        if spec.mode == "threads":
            results = _run_threads(spec, redis_url, workdir, tag)
        else:
            if pool is None:
                raise RuntimeError("no process pool")
            results = pool.run(spec, redis_url, workdir, tag)
    except Exception as exc:
        traceback.print_exc()
        return {**asdict(spec), "status": "error", "detail": f"{type(exc).__name__}: {exc}"}
    failures = [r["failure"] for r in results if "failure" in r]
    if failures:
        return {**asdict(spec), "status": "error", "detail": failures[0]}
    return summarize(spec, results, expected_keys(spec, tag))


def summarize(spec: ThroughputSpec, results: list[Any], keys: set[str]) -> dict[str, Any]:
    executions: dict[str, int] = {}
    errors: dict[str, int] = {}
    ok = 0
    for r in results:
        for k, n in r["executions"].items():
            executions[k] = executions.get(k, 0) + n
        for k, n in r["errors"].items():
            errors[k] = errors.get(k, 0) + n
        ok += r["ok"]
    calls = ok + sum(errors.values())
    wall = max(r["t1"] for r in results) - min(r["t0"] for r in results)
    unexpected = set(executions) - keys
    return {
        **asdict(spec),
        "status": "ok",
        "calls": calls,
        "results": ok,
        "errors": errors,
        "wall_s": wall,
        "calls_per_s": calls / wall if wall > 0 else 0.0,
        "results_per_s": ok / wall if wall > 0 else 0.0,
        "key_count": len(keys),
        "executions": sum(executions.values()),
        "keys_run_more_than_once": sum(1 for n in executions.values() if n > 1),
        "duplicate_executions": sum(n - 1 for n in executions.values() if n > 1),
        "keys_never_run": len(keys - set(executions)),
        "unexpected_keys": len(unexpected),
    }
