"""Cost as workers grow: throughput and p99 with 1, 4, 16 and 64 concurrent workers.

``python -m benchmarks.workers`` (or ``python -m benchmarks --workers``) writes
``benchmarks/results/workers.{md,json,png}``. On a Redis server, a 3-shard Redis Cluster
(3 primaries, no replicas) and PostgreSQL — each a throwaway server it starts itself; one
that cannot start is skipped with the reason — it runs ``Engine.run`` from N workers at
once, for N in 1, 4, 16, 64:

* ``processes``: N processes (from a preloaded fork server), each with its own store
  object, as N LangGraph workers or API replicas would;
* ``threads``: N threads sharing one store object in one process, as a ``ToolNode`` runs
  parallel tool calls (its executor) or a threaded server does;
* ``asyncio``: N tasks on one event loop calling ``Engine.arun``, as an async graph does.

Key patterns (from :mod:`benchmarks.throughput`): ``distinct`` (every call a first run)
and ``hot`` (every worker goes through the same generations of 16 keys in its own order,
racing the others for each). Each action counts its executions per key; every case
reports duplicate executions (must be 0) and keys never run. Per case: calls/s over the
wall time from the barrier to the last worker's end, and the p50 / p99 of one call's
latency across all workers; for Redis, the server's CPU seconds per 1,000 calls
(``INFO cpu``), which says whether the server or the clients are the bottleneck.

Speed is reported, never asserted; the exit status is 1 when a case executed a key twice
(or never), or failed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing as mp
import os
import random
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from ._outputs import finish, progress, pyplot, started
from .stats import percentile
from .throughput import ThroughputSpec, expected_keys, summarize, worker_keys

__all__ = ["main"]

RESULTS_DIR = Path(__file__).resolve().parent / "results"
BACKENDS = ("redis", "cluster", "postgres")
MODES = ("processes", "threads", "asyncio")
WORKERS = (1, 4, 16, 64)
PRELOAD = ["langchain_idempotent", "langchain_idempotent.stores.redis",
           "langchain_idempotent.stores.postgres"]  # fmt: skip


def _store(backend: str, url: str) -> Any:
    from langchain_idempotent import RedisIdempotencyStore
    from langchain_idempotent.stores.postgres import PostgresIdempotencyStore

    if backend == "redis":
        return RedisIdempotencyStore.from_url(url)
    if backend == "cluster":
        return RedisIdempotencyStore.from_url(url, cluster=True)
    if backend == "postgres":
        return PostgresIdempotencyStore.from_url(url, table="workers_bench")
    raise ValueError(f"unknown backend {backend!r}; known: {', '.join(BACKENDS)}")


def _engine(store: Any) -> Any:
    from langchain_idempotent import Policy
    from langchain_idempotent.core.engine import Engine

    return Engine(store, Policy(lease=30, wait_timeout=60))


class _Tally:
    """One worker's counts: executions per key, errors by type, each call's latency (ns)."""

    def __init__(self) -> None:
        self.executions: dict[str, int] = {}
        self.errors: dict[str, int] = {}
        self.latencies: list[int] = []
        self.ok = 0
        self.t0 = time.monotonic()

    def ran(self, key: str) -> dict[str, bool]:
        """What the action does: count itself under ``key``."""
        self.executions[key] = self.executions.get(key, 0) + 1
        return {"ok": True}

    def answered(self, since_ns: int, exc: Exception | None) -> None:
        self.latencies.append(time.perf_counter_ns() - since_ns)
        if exc is None:
            self.ok += 1
        else:
            self.errors[type(exc).__name__] = self.errors.get(type(exc).__name__, 0) + 1

    def result(self) -> dict[str, Any]:
        return {"executions": self.executions, "errors": self.errors, "ok": self.ok,
                "t0": self.t0, "t1": time.monotonic(), "lat": self.latencies}  # fmt: skip


def _work(engine: Any, keys: list[str]) -> dict[str, Any]:
    """Call every key once (``Engine.run``), tallied."""
    tally = _Tally()
    for key in keys:
        since, error = time.perf_counter_ns(), None
        try:
            engine.run(key, fingerprint="fp", action=lambda key=key: tally.ran(key))
        except Exception as exc:
            error = exc
        tally.answered(since, error)
    return tally.result()


async def _awork(engine: Any, keys: list[str], start: asyncio.Event) -> dict[str, Any]:
    """The same on the event loop (``Engine.arun``), from when ``start`` is set."""
    await start.wait()
    tally = _Tally()
    for key in keys:

        async def action(key: str = key) -> dict[str, bool]:
            return tally.ran(key)

        since, error = time.perf_counter_ns(), None
        try:
            await engine.arun(key, fingerprint="fp", action=action)
        except Exception as exc:
            error = exc
        tally.answered(since, error)
    return tally.result()


def _process(spec: ThroughputSpec, url: str, tag: str, index: int, barrier: Any, out: Any) -> None:
    try:
        store = _store(spec.impl, url)
        engine = _engine(store)
        engine.run(f"{tag}:warm:{index}", fingerprint="fp", action=lambda: 1)  # connect first
        keys = worker_keys(spec, index, tag)
        barrier.wait(timeout=300)
        result: dict[str, Any] = _work(engine, keys)
        store.close()
    except BaseException as exc:
        result = {"failure": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()}
    out.put((index, result))
    out.close()
    out.join_thread()
    os._exit(0)  # skip interpreter teardown (seconds each, on a busy machine)


def _run_processes(spec: ThroughputSpec, url: str, tag: str) -> list[dict[str, Any]]:
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    barrier, out = ctx.Barrier(spec.workers), ctx.Queue()
    procs = [
        ctx.Process(target=_process, args=(spec, url, tag, i, barrier, out), daemon=True)
        for i in range(spec.workers)
    ]
    for p in procs:
        p.start()
    results: list[dict[str, Any]] = [{} for _ in procs]
    try:
        for _ in procs:
            i, result = out.get(timeout=600)
            results[i] = result
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return results


def _run_threads(spec: ThroughputSpec, url: str, tag: str) -> list[dict[str, Any]]:
    store = _store(spec.impl, url)
    engine = _engine(store)
    engine.run(f"{tag}:warm", fingerprint="fp", action=lambda: 1)
    barrier = threading.Barrier(spec.workers)
    results: list[dict[str, Any]] = [{} for _ in range(spec.workers)]

    def target(i: int) -> None:
        keys = worker_keys(spec, i, tag)
        barrier.wait()
        results[i] = _work(engine, keys)

    threads = [threading.Thread(target=target, args=(i,)) for i in range(spec.workers)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        store.close()
    return results


def _run_asyncio(spec: ThroughputSpec, url: str, tag: str) -> list[dict[str, Any]]:
    async def run() -> list[dict[str, Any]]:
        store = _store(spec.impl, url)
        engine = _engine(store)
        try:
            await engine.arun(f"{tag}:warm", fingerprint="fp", action=_one)
            start = asyncio.Event()
            tasks = [
                asyncio.create_task(_awork(engine, worker_keys(spec, i, tag), start))
                for i in range(spec.workers)
            ]
            await asyncio.sleep(0)
            start.set()
            return list(await asyncio.gather(*tasks))
        finally:
            await store.aclose()

    return asyncio.run(run())


async def _one() -> int:
    return 1


def _redis_cpu(ports: list[int]) -> float | None:
    """CPU seconds (user + sys) the Redis servers on ``ports`` used so far."""
    import redis

    total = 0.0
    for port in ports:
        with contextlib.closing(redis.Redis(port=port)) as c:
            info = c.info("cpu")
        total += float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    return total


def run_case(spec: ThroughputSpec, url: str, ports: list[int]) -> dict[str, Any]:
    tag = f"w{uuid.uuid4().hex[:8]}"
    run = {"processes": _run_processes, "threads": _run_threads, "asyncio": _run_asyncio}
    cpu0 = _redis_cpu(ports) if ports else None
    try:
        results = run[spec.mode](spec, url, tag)
    except Exception as exc:
        traceback.print_exc()
        return {"spec": spec.id, "status": "error", "detail": f"{type(exc).__name__}: {exc}"}
    failures = [r["failure"] for r in results if "failure" in r]
    if failures:
        return {"spec": spec.id, "status": "error", "detail": failures[0]}
    out = summarize(spec, results, expected_keys(spec, tag))
    lat = sorted(ns for r in results for ns in r["lat"])
    out["p50_us"] = percentile(lat, 0.5) / 1000
    out["p99_us"] = percentile(lat, 0.99) / 1000
    if cpu0 is not None:
        out["server_cpu_s_per_1k"] = (_redis_cpu(ports) - cpu0) / out["calls"] * 1000
    return out


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median calls/s (its own p50 / p99 with it); a failed run, if any,
    and every run's duplicates and errors, so none is hidden by the median."""
    failed = [r for r in runs if r.get("status") != "ok"]
    if failed:
        return failed[0]
    ranked = sorted(runs, key=lambda r: r["calls_per_s"])
    median = dict(ranked[(len(ranked) - 1) // 2])
    median["duplicate_executions"] = sum(r["duplicate_executions"] for r in runs)
    median["keys_never_run"] = sum(r["keys_never_run"] for r in runs)
    errors: dict[str, int] = {}
    for r in runs:
        for k, v in r["errors"].items():
            errors[k] = errors.get(k, 0) + v
    median["errors"] = errors
    median["calls_per_s_runs"] = [round(r["calls_per_s"]) for r in runs]
    return median


@contextlib.contextmanager
def backend(name: str, stack: ExitStack) -> Iterator[tuple[str, list[int]] | str]:
    """The server(s) for ``name``: (url, Redis ports to read CPU from), or why not."""
    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.insert(0, root)
    from tests.support.redis_servers import RedisCluster, RedisServer, redis_server_available

    if name in ("redis", "cluster") and not redis_server_available():
        yield "redis-server is not on PATH"
        return
    try:
        if name == "redis":
            server = stack.enter_context(RedisServer(loglevel="warning"))
            yield server.url, [server.port]
        elif name == "cluster":
            cluster = stack.enter_context(RedisCluster(masters=3, replicas=0, loglevel="warning"))
            yield cluster.url, [n.port for n in cluster.nodes]
        else:
            from tests.support.postgres_server import PostgresServer, postgres_unavailable_reason

            reason = postgres_unavailable_reason()
            if reason is not None:
                yield f"PostgreSQL unavailable: {reason}"
                return
            # 64 processes x (pool + LISTEN connection) need more than the default 100.
            pg = stack.enter_context(PostgresServer(max_connections="400"))
            yield pg.url, []
    except RuntimeError as exc:  # a server that could not start (no redis-cli, ...)
        yield f"{name} did not start: {exc}"


def markdown(report: dict[str, Any]) -> str:
    cfg = report["config"]
    lines = [
        "# Cost as workers grow",
        "",
        f"`{report['command']}` — {report['date']}, {report['elapsed_s']} s, load average "
        f"{report['loadavg_start']} at the start, {report['loadavg_end']} at the end, on "
        f"{report['cpus']} vCPUs shared with other work. {cfg['calls']} calls per case, "
        f"split across the workers; each row is the median of {cfg.get('reps', 1)} run(s) by "
        "calls/s (duplicates and errors summed over all runs); `hot`: generations of 16 keys "
        "every worker races for. Server CPU: the Redis servers' own user + system time "
        "(`INFO cpu`) per 1,000 calls.",
        "",
        "| backend | mode | keys | workers | calls/s | p50 (µs) | p99 (µs) "
        "| server CPU ms / 1k calls | duplicates | keys never run | errors |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for b in report["backends"]:
        if b["status"] != "ok":
            lines.append(f"| {b['backend']} | skipped: {b['detail']} | | | | | | | | | |")
            continue
        for c in b["cases"]:
            if c.get("status") != "ok":
                lines.append(f"| {b['backend']} | {c['spec']} | error: {c['detail']} "
                             "| | | | | | | | |")  # fmt: skip
                continue
            cpu = c.get("server_cpu_s_per_1k")
            lines.append(
                f"| {b['backend']} | {c['mode']} | {c['keys']} | {c['workers']} "
                f"| {c['calls_per_s']:,.0f} | {c['p50_us']:,.0f} | {c['p99_us']:,.0f} "
                f"| {'-' if cpu is None else f'{cpu * 1000:.0f}'} "
                f"| {c['duplicate_executions']} | {c['keys_never_run']} "
                f"| {', '.join(f'{k} {v}' for k, v in c['errors'].items()) or '-'} |"
            )
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(12, 8), sharex=True)
    for b in report["backends"]:
        if b["status"] != "ok":
            continue
        for col, keys in enumerate(("distinct", "hot")):
            for mode, style in (("processes", "o-"), ("threads", "s--"), ("asyncio", "^:")):
                cases = [c for c in b["cases"] if c.get("status") == "ok"
                         and c["keys"] == keys and c["mode"] == mode]  # fmt: skip
                if not cases:
                    continue
                n = [c["workers"] for c in cases]
                label = f"{b['backend']} {mode}"
                axes[0][col].plot(n, [c["calls_per_s"] for c in cases], style, label=label)
                axes[1][col].plot(n, [c["p99_us"] for c in cases], style, label=label)
            axes[0][col].set_title(f"calls/s, {keys} keys")
            axes[1][col].set_title(f"p99 latency (µs), {keys} keys")
    for ax in axes.flat:
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(WORKERS), [str(w) for w in WORKERS])
        ax.grid(True, alpha=0.3)
    for ax in axes[1]:
        ax.set_yscale("log")
        ax.set_xlabel("concurrent workers")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"langchain-idempotent: cost as workers grow ({report['date']}, "
                 f"{report['cpus']} vCPUs)")  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.workers", description=__doc__.split("\n")[0]
    )
    p.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated")
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated")
    p.add_argument("--workers", default=",".join(map(str, WORKERS)), help="comma-separated")
    p.add_argument("--calls", type=int, default=3200, help="calls per case, split across workers")
    p.add_argument("--reps", type=int, default=1, help="runs per case; the median is reported")
    p.add_argument("--quick", action="store_true", help="tiny sizes, for the smoke test")
    p.add_argument("--out", default=str(RESULTS_DIR))
    p.add_argument("--name", default=None, help="file stem (default workers; quick: workers-quick)")
    p.add_argument("--seed", type=int, default=None)
    args = p.parse_args(argv)
    if args.quick:
        args.workers, args.calls = "1,4", 128
    args.backends = [s.strip() for s in args.backends.split(",") if s.strip()]
    args.modes = [s.strip() for s in args.modes.split(",") if s.strip()]
    args.workers = [int(w) for w in str(args.workers).split(",")]
    unknown = sorted(set(args.backends) - set(BACKENDS)) + sorted(set(args.modes) - set(MODES))
    if unknown:
        p.error(f"unknown backend or mode {', '.join(unknown)}")
    args.name = args.name or ("workers-quick" if args.quick else "workers")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    report = started("benchmarks.workers", argv)
    say = progress(report["_t0"])
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    backends: list[dict[str, Any]] = []
    problems: list[str] = []
    for name in args.backends:
        with ExitStack() as stack:
            got = stack.enter_context(backend(name, stack))
            if isinstance(got, str):
                say(f"{name}: skipped: {got}")
                backends.append({"backend": name, "status": "skipped", "detail": got})
                continue
            url, ports = got
            specs = [
                ThroughputSpec(name, mode, n, keys, max(1, args.calls // n))
                for mode in args.modes
                for keys in ("distinct", "hot")
                for n in args.workers
            ]
            runs: dict[str, list[dict[str, Any]]] = {s.id: [] for s in specs}
            for rep in range(args.reps):
                order = list(specs)
                rng.shuffle(order)  # no case always runs first, or last, on a drifting machine
                for spec in order:
                    runs[spec.id].append(run_case(spec, url, ports))
                say(f"{name}: repetition {rep + 1}/{args.reps} done")
            cases: list[dict[str, Any]] = []
            for spec in specs:
                case = _median_run(runs[spec.id])
                if case.get("status") != "ok":
                    problems.append(f"{spec.id}: {case.get('detail')}")
                elif case["duplicate_executions"] or case["keys_never_run"] or case["errors"]:
                    problems.append(
                        f"{spec.id}: {case['duplicate_executions']} duplicates, "
                        f"{case['keys_never_run']} keys never run, errors {case['errors']}"
                    )
                else:
                    say(f"{spec.id}: {case['calls_per_s']:,.0f} calls/s, "
                        f"p99 {case['p99_us']:,.0f} us")  # fmt: skip
                cases.append(case)
            backends.append({"backend": name, "status": "ok", "cases": cases})
    report.update(
        seed=seed,
        config={
            "calls": args.calls,
            "workers": args.workers,
            "modes": args.modes,
            "reps": args.reps,
        },
        backends=backends,
        problems=problems,
    )
    return finish(report, args.out, args.name, markdown, plot)


if __name__ == "__main__":
    raise SystemExit(main())
