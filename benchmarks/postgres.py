"""Postgres rows: our store against one ``SELECT 1``, and against DBOS and LangGraph.

``python -m benchmarks.postgres [--quick] [--pg-url URL] [--rounds N] [--batch N]``

Starts a throwaway PostgreSQL cluster (``initdb`` + ``postgres`` on a free loopback port,
``fsync=off`` like the test clusters; see ``tests/support/postgres_server.py``), or uses
``--pg-url`` / ``IDEMPOTENCY_TEST_PG_URL``. Every latency case runs on the same server:

- ``select1``: one ``SELECT 1`` on a connection of the pool the store uses (the floor of a
  replay, which is one read);
- ``two_writes``: two committed single-row writes on that pool (an ``INSERT`` of a fresh row,
  then an ``UPDATE`` of it, each its own autocommit transaction) — the physical floor of a
  first run, which is two committed writes (claim, complete);
- ``ours``: ``Engine.run`` with ``PostgresIdempotencyStore`` on that pool, replay (one
  claim) and first run (claim + complete: two round trips), and transactional mode;
- ``dbos``: a DBOS 3.x workflow (``@DBOS.workflow``) running one ``@DBOS.step``: first run
  with a fresh workflow id, replay by re-running the same workflow id;
- ``langgraph``: LangGraph's functional API, an ``@entrypoint`` with ``PostgresSaver``
  running one ``@task``, on a fresh thread (first run).

Each protects the same no-op effect. Cases are sampled in interleaved shuffled rounds (every
round visits every case in random order, ``--batch`` calls each), so drift falls on all
alike; the figure is the median per call over all rounds, and ratios divide medians.
Throughput: 4 forked processes, each with its own store, on distinct keys (every call a
first run) and on 50 hot keys (mostly replays).

Goals (issue 24): replay <= 1.15x ``SELECT 1``; first run <= 3.0x ``SELECT 1``; >= 10x
cheaper per protected call than a DBOS step. The first run is also reported against
``two_writes``. ``python -m benchmarks --postgres`` runs this too.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import multiprocessing as mp
import os
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

__all__ = ["main", "markdown", "run_postgres"]

RESULTS_DIR = Path(__file__).with_name("results")
GOALS = {"first_vs_select1": 3.0, "replay_vs_select1": 1.15, "dbos_vs_ours": 10.0}


@contextmanager
def _server(url: str | None) -> Iterator[str]:
    url = url or os.environ.get("IDEMPOTENCY_TEST_PG_URL")
    if url:
        yield url
        return
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.support.postgres_server import PostgresServer

    with PostgresServer() as server:
        yield server.url


def _noop() -> dict[str, Any]:
    return {"ok": True}


# -- cases -------------------------------------------------------------------------------


def _cases(url: str, stack: ExitStack, run_id: str) -> dict[str, Callable[[], object]]:
    from psycopg_pool import ConnectionPool

    from langchain_idempotent import Policy
    from langchain_idempotent.core.engine import Engine
    from langchain_idempotent.stores.postgres import PostgresIdempotencyStore

    pool: ConnectionPool[Any] = ConnectionPool(
        url, min_size=2, max_size=4, kwargs={"autocommit": True}, open=True
    )
    stack.callback(pool.close)
    store = PostgresIdempotencyStore(pool, table="bench_records")
    store.setup()
    engine = Engine(store, Policy())
    txn_engine = Engine(store, Policy(transactional=True))
    counter = itertools.count()
    replay_key = f"{run_id}:replay"
    engine.run(replay_key, fingerprint="fp", action=_noop)
    floor_table = f"bench_floor_{run_id.replace('-', '_')}"
    with pool.connection() as conn:
        conn.execute(f"CREATE TABLE {floor_table} (k text PRIMARY KEY, v text NOT NULL)")
    stack.callback(_drop_table, pool, floor_table)

    def select1() -> object:
        with pool.connection() as conn:
            return conn.execute("SELECT 1").fetchone()

    def two_writes() -> object:
        key = str(next(counter))
        with pool.connection() as conn:  # autocommit: each statement commits on its own
            conn.execute(f"INSERT INTO {floor_table} (k, v) VALUES (%s, 'running')", (key,))
            return conn.execute(f"UPDATE {floor_table} SET v = 'done' WHERE k = %s", (key,))

    def ours_replay() -> object:
        return engine.run(replay_key, fingerprint="fp", action=_noop)

    def ours_first() -> object:
        return engine.run(f"{run_id}:first:{next(counter)}", fingerprint="fp", action=_noop)

    def ours_txn() -> object:
        return txn_engine.run(f"{run_id}:txn:{next(counter)}", fingerprint="fp", action=_noop)

    cases: dict[str, Callable[[], object]] = {
        "select1": select1,
        "two_writes": two_writes,
        "ours_replay": ours_replay,
        "ours_first": ours_first,
        "ours_txn_first": ours_txn,
    }
    cases.update(_dbos_cases(url, stack, run_id))
    cases.update(_langgraph_cases(url, stack, run_id))
    return cases


def _dbos_cases(url: str, stack: ExitStack, run_id: str) -> dict[str, Callable[[], object]]:
    try:
        from dbos import DBOS, SetWorkflowID
    except ImportError:
        return {}
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = 'dbos_bench'").fetchone():
            conn.execute("CREATE DATABASE dbos_bench")
    sys_url = url.rsplit("/", 1)[0] + "/dbos_bench"
    dbos = DBOS(config={"name": "bench", "system_database_url": sys_url, "log_level": "WARNING"})

    @DBOS.step()
    def effect() -> dict[str, Any]:
        return _noop()

    @DBOS.workflow()
    def protected() -> dict[str, Any]:
        return effect()

    DBOS.launch()
    stack.callback(DBOS.destroy)
    _ = dbos
    counter = itertools.count()
    replay_id = f"{run_id}-dbos-replay"
    with SetWorkflowID(replay_id):
        protected()

    def first() -> object:
        with SetWorkflowID(f"{run_id}-dbos-{next(counter)}"):
            return protected()

    def replay() -> object:
        with SetWorkflowID(replay_id):
            return protected()

    return {"dbos_first": first, "dbos_replay": replay}


def _langgraph_cases(url: str, stack: ExitStack, run_id: str) -> dict[str, Callable[[], object]]:
    try:
        from langgraph.checkpoint.postgres import PostgresSaver
        from langgraph.func import entrypoint, task
        from psycopg.rows import dict_row
        from psycopg_pool import ConnectionPool
    except ImportError:
        return {}
    pool: ConnectionPool[Any] = ConnectionPool(
        url,
        min_size=2,
        max_size=4,
        kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
        open=True,
    )
    stack.callback(pool.close)
    saver = PostgresSaver(pool)  # type: ignore[arg-type]
    saver.setup()

    @task
    def effect() -> dict[str, Any]:
        return _noop()

    @entrypoint(checkpointer=saver)
    def protected(_: int) -> dict[str, Any]:
        return effect().result()

    counter = itertools.count()

    def first() -> object:
        config: Any = {"configurable": {"thread_id": f"{run_id}-lg-{next(counter)}"}}
        return protected.invoke(1, config)

    return {"langgraph_first": first}


# -- sampling ------------------------------------------------------------------------------


def _sample(
    cases: dict[str, Callable[[], object]], rounds: int, batch: int, seed: int
) -> dict[str, list[int]]:
    rng = random.Random(seed)
    samples: dict[str, list[int]] = {name: [] for name in cases}
    for fn in cases.values():  # warm up (prepared statements, imports, pools)
        for _ in range(5):
            fn()
    for _ in range(rounds):
        order = list(cases)
        rng.shuffle(order)
        for name in order:
            fn = cases[name]
            gc.disable()
            try:
                for _ in range(batch):
                    t0 = time.perf_counter_ns()
                    fn()
                    samples[name].append(time.perf_counter_ns() - t0)
            finally:
                gc.enable()
    return samples


# -- throughput ----------------------------------------------------------------------------


def _throughput_worker(url: str, keys: list[str], barrier: Any, out: Any) -> None:
    from langchain_idempotent import Policy
    from langchain_idempotent.core.engine import Engine
    from langchain_idempotent.stores.postgres import PostgresIdempotencyStore

    store = PostgresIdempotencyStore.from_url(url, table="bench_records", max_size=2)
    engine = Engine(store, Policy(wait_timeout=120.0))
    engine.run(f"warm-{uuid.uuid4().hex}", fingerprint="fp", action=_noop)
    barrier.wait(60)
    t0 = time.perf_counter()
    for key in keys:
        engine.run(key, fingerprint="fp", action=_noop)
    out.put(time.perf_counter() - t0)
    store.close()


def _throughput(url: str, calls: int, hot: bool, run_id: str, processes: int = 4) -> float:
    ctx = mp.get_context("fork")
    per = calls // processes
    rng = random.Random(1)
    hot_keys = [f"{run_id}:hot:{i}" for i in range(50)]
    barrier, out = ctx.Barrier(processes), ctx.Queue()
    procs = []
    for p in range(processes):
        if hot:
            keys = [rng.choice(hot_keys) for _ in range(per)]
        else:
            keys = [f"{run_id}:distinct:{p}:{i}" for i in range(per)]
        procs.append(ctx.Process(target=_throughput_worker, args=(url, keys, barrier, out)))
    for proc in procs:
        proc.start()
    elapsed = max(out.get(timeout=600) for _ in procs)
    for proc in procs:
        proc.join(60)
    return per * processes / elapsed


# -- report --------------------------------------------------------------------------------


def _drop_table(pool: Any, table: str) -> None:
    with pool.connection() as conn:
        conn.execute(f"DROP TABLE IF EXISTS {table}")


def run_postgres(
    *,
    url: str | None = None,
    rounds: int = 20,
    batch: int = 100,
    throughput_calls: int = 8000,
    seed: int | None = None,
    progress: Callable[[str], None] = lambda _msg: None,
) -> dict[str, Any]:
    """Run every Postgres case and return the report (medians in µs, ratios, verdicts)."""
    seed = random.randrange(2**32) if seed is None else seed
    run_id = f"bench-{uuid.uuid4().hex[:8]}"
    with _server(url) as pg_url, ExitStack() as stack:
        progress(f"postgres latency: {rounds} rounds x {batch} calls per case")
        cases = _cases(pg_url, stack, run_id)
        samples = _sample(cases, rounds, batch, seed)
        medians = {name: statistics.median(s) / 1000 for name, s in samples.items()}
        stack.close()
        progress(f"postgres throughput: 4 processes, {throughput_calls} calls")
        throughput = {
            "distinct": _throughput(pg_url, throughput_calls, False, run_id),
            "hot": _throughput(pg_url, throughput_calls, True, run_id),
        }
        with __import__("psycopg").connect(pg_url) as conn:
            server_version = conn.execute("SHOW server_version").fetchone()[0]
    floor = medians["select1"]
    ratios = {
        "first_vs_select1": medians["ours_first"] / floor,
        "replay_vs_select1": medians["ours_replay"] / floor,
        "txn_first_vs_select1": medians["ours_txn_first"] / floor,
        "first_vs_two_writes": medians["ours_first"] / medians["two_writes"],
        "txn_first_vs_two_writes": medians["ours_txn_first"] / medians["two_writes"],
    }
    if "dbos_first" in medians:
        ratios["dbos_vs_ours"] = medians["dbos_first"] / medians["ours_first"]
        ratios["dbos_replay_vs_ours_replay"] = medians["dbos_replay"] / medians["ours_replay"]
    if "langgraph_first" in medians:
        ratios["langgraph_vs_ours"] = medians["langgraph_first"] / medians["ours_first"]
    verdicts = {}
    for goal, limit in GOALS.items():
        if goal not in ratios:
            verdicts[goal] = "not measured"
        elif goal == "dbos_vs_ours":
            verdicts[goal] = "met" if ratios[goal] >= limit else "not met"
        else:
            verdicts[goal] = "met" if ratios[goal] <= limit else "not met"
    return {
        "server_version": server_version,
        "rounds": rounds,
        "batch": batch,
        "seed": seed,
        "medians_us": medians,
        "p90_us": {name: sorted(s)[int(0.9 * (len(s) - 1))] / 1000 for name, s in samples.items()},
        "ratios": ratios,
        "throughput_calls_per_s": throughput,
        "goals": GOALS,
        "verdicts": verdicts,
    }


_LABELS = {
    "select1": "one `SELECT 1` on the same pool — the floor of a replay",
    "two_writes": "two committed single-row writes on the same pool — the floor of a first run",
    "ours_replay": "ours, `PostgresIdempotencyStore`, replay",
    "ours_first": "ours, `PostgresIdempotencyStore`, first run",
    "ours_txn_first": "ours, transactional mode, first run",
    "dbos_first": "DBOS 3.x `@DBOS.step` in a `@DBOS.workflow`, first run",
    "dbos_replay": "DBOS, the same workflow id again (replay)",
    "langgraph_first": "LangGraph `@task` in an `@entrypoint` with `PostgresSaver`, first run",
}


def markdown(report: dict[str, Any]) -> str:
    med, p90, ratios = report["medians_us"], report["p90_us"], report["ratios"]
    floor = med["select1"]
    lines = [
        f"### PostgreSQL {report['server_version']} (throwaway cluster, loopback, fsync off)",
        "",
        f"{report['rounds']} interleaved rounds x {report['batch']} calls per case "
        f"(seed {report['seed']}); medians per call.",
        "",
        "| case | median µs | p90 µs | x `SELECT 1` |",
        "|---|---:|---:|---:|",
    ]
    for name, label in _LABELS.items():
        if name in med:
            lines.append(
                f"| {label} | {med[name]:.0f} | {p90[name]:.0f} | {med[name] / floor:.2f} |"
            )
    tp = report["throughput_calls_per_s"]
    lines += [
        "",
        f"Throughput, 4 processes: distinct keys {tp['distinct']:,.0f} calls/s; "
        f"50 hot keys {tp['hot']:,.0f} calls/s.",
        "",
        "| goal | figure | verdict |",
        "|---|---:|---|",
        f"| first run <= {GOALS['first_vs_select1']}x `SELECT 1` | "
        f"{ratios['first_vs_select1']:.2f}x | {report['verdicts']['first_vs_select1']} |",
        f"| replay <= {GOALS['replay_vs_select1']}x `SELECT 1` | "
        f"{ratios['replay_vs_select1']:.2f}x | {report['verdicts']['replay_vs_select1']} |",
        f"| (for reference) first run vs two committed writes | "
        f"{ratios['first_vs_two_writes']:.2f}x | - |",
        f"| (for reference) transactional first run vs two committed writes | "
        f"{ratios['txn_first_vs_two_writes']:.2f}x | - |",
    ]
    if "dbos_vs_ours" in ratios:
        lines.append(
            f"| >= {GOALS['dbos_vs_ours']}x cheaper than a DBOS step (first run) | "
            f"{ratios['dbos_vs_ours']:.1f}x | {report['verdicts']['dbos_vs_ours']} |"
        )
    if "langgraph_vs_ours" in ratios:
        lines.append(
            f"| (for reference) LangGraph `@task` + `PostgresSaver` vs ours | "
            f"{ratios['langgraph_vs_ours']:.1f}x | - |"
        )
    lines += ["", "Re-run: `python -m benchmarks.postgres` (or `python -m benchmarks --postgres`)."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.postgres", description=__doc__)
    p.add_argument("--quick", action="store_true", help="a short run for CI")
    p.add_argument("--pg-url", help="an existing server (default: a throwaway cluster)")
    p.add_argument("--rounds", type=int)
    p.add_argument("--batch", type=int)
    p.add_argument("--throughput-calls", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--out", default=str(RESULTS_DIR))
    p.add_argument("--name", help="file stem (default postgres; quick: postgres-quick)")
    args = p.parse_args(argv)
    report = run_postgres(
        url=args.pg_url,
        rounds=args.rounds or (2 if args.quick else 20),
        batch=args.batch or (20 if args.quick else 100),
        throughput_calls=args.throughput_calls or (400 if args.quick else 8000),
        seed=args.seed,
        progress=lambda msg: print(msg, file=sys.stderr),
    )
    text = markdown(report)
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = args.name or ("postgres-quick" if args.quick else "postgres")
    (out / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / f"{stem}.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
