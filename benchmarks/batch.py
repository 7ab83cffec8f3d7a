"""Batched claims: ``claim_many`` of N requests against N separate ``claim`` calls.

``python -m benchmarks.batch [--quick] [--rounds N] [--reps N] [--stores memory,sqlite,...]``
(``python -m benchmarks --claim-batches`` runs it too.)

For each store — in-memory, SQLite (a temporary file, WAL, ``synchronous=NORMAL``), Redis (a
throwaway ``redis-server`` from :mod:`benchmarks.server`) and PostgreSQL (a throwaway
cluster, ``fsync=off`` like the test clusters) — and each N in 1, 4, 16, two cases:

- ``batched``: one ``store.claim_many(N requests)`` (one round trip);
- ``separate``: ``store.claim(...)`` N times, one after the other (N round trips) — what N
  parallel tool calls of one model message cost before the batch.

Each on fresh keys (every claim ``ACQUIRED``: a step's first run) and on completed keys
(every claim ``REPLAY``: a step run again); the requests (keys, owner tokens) are made
before the clock starts. The cases of one store are sampled in
interleaved, shuffled rounds (every round visits every case in random order, ``--reps``
operations each), so drift falls on all alike; the figure is the median per operation
(per N claims) over all rounds, and the ratio is ``separate / batched``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from langchain_idempotent.core.store import BaseIdempotencyStore, ClaimRequest, CompleteRequest

__all__ = ["main", "markdown", "run_batch"]

RESULTS_DIR = Path(__file__).with_name("results")
SIZES = (1, 4, 16)
STORES = ("memory", "sqlite", "redis", "postgres")
LEASE_MS, TTL_MS = 60_000, 3_600_000


@contextlib.contextmanager
def _store(kind: str, stack: ExitStack) -> Iterator[BaseIdempotencyStore]:
    prefix = f"bench-batch-{uuid.uuid4().hex[:8]}:"
    if kind == "memory":
        from langchain_idempotent.stores.memory import InMemoryIdempotencyStore

        yield InMemoryIdempotencyStore()
    elif kind == "sqlite":
        from langchain_idempotent.stores.sqlite import SqliteIdempotencyStore

        workdir = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-batch-"))
        store = SqliteIdempotencyStore(os.path.join(workdir, "batch.db"))
        yield store
        store.close()
    elif kind == "redis":
        from langchain_idempotent.stores.redis import RedisIdempotencyStore

        from .server import RedisServer

        server = stack.enter_context(RedisServer())
        redis_store = RedisIdempotencyStore.from_url(server.url, prefix=prefix)
        yield redis_store
        redis_store.close()
    elif kind == "postgres":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from langchain_idempotent.stores.postgres import PostgresIdempotencyStore
        from tests.support.postgres_server import PostgresServer

        server = stack.enter_context(PostgresServer())
        table = "bench_batch_" + uuid.uuid4().hex[:8]
        pg_store = PostgresIdempotencyStore.from_url(server.url, table=table)
        yield pg_store
        pg_store.close()
    else:
        raise ValueError(f"unknown store {kind!r}; choose from {', '.join(STORES)}")


def _requests(keys: list[str]) -> list[ClaimRequest]:
    return [ClaimRequest(k, uuid.uuid4().hex, "fp", LEASE_MS, TTL_MS) for k in keys]


def _cases(store: BaseIdempotencyStore) -> dict[str, Callable[[], Callable[[], object]]]:
    """``<fresh|replay>/<batched|separate>/<N>`` -> a preparation (untimed: new keys and
    owner tokens) returning one operation of N claims (timed)."""
    cases: dict[str, Callable[[], Callable[[], object]]] = {}
    for n in SIZES:
        done = [f"done-{n}-{i}-{uuid.uuid4().hex}" for i in range(n)]
        for r, c in zip(_requests(done), store.claim_many(_requests(done)), strict=True):
            store.complete(
                CompleteRequest(
                    r.key,
                    owner=r.owner,
                    fence=c.fence,
                    fingerprint="fp",
                    payload=b"result",
                    failed=False,
                    ttl_ms=TTL_MS,
                )
            )

        def fresh(n: int = n) -> list[ClaimRequest]:
            return _requests([uuid.uuid4().hex for _ in range(n)])

        def replay(keys: list[str] = done) -> list[ClaimRequest]:
            return _requests(keys)

        for kind, make in (("fresh", fresh), ("replay", replay)):
            cases[f"{kind}/batched/{n}"] = _batched(store, make)
            cases[f"{kind}/separate/{n}"] = _separate(store, make)
    return cases


def _batched(
    store: BaseIdempotencyStore, make: Callable[[], list[ClaimRequest]]
) -> Callable[[], Callable[[], object]]:
    def prepare() -> Callable[[], object]:
        requests = make()
        return lambda: store.claim_many(requests)

    return prepare


def _separate(
    store: BaseIdempotencyStore, make: Callable[[], list[ClaimRequest]]
) -> Callable[[], Callable[[], object]]:
    def prepare() -> Callable[[], object]:
        requests = make()
        return lambda: [_claim(store, r) for r in requests]

    return prepare


def _claim(store: BaseIdempotencyStore, r: ClaimRequest) -> object:
    return store.claim(r)


def _sample(
    cases: dict[str, Callable[[], Callable[[], object]]],
    rounds: int,
    reps: int,
    rng: random.Random,
) -> dict[str, list[int]]:
    samples: dict[str, list[int]] = {name: [] for name in cases}
    for prepare in cases.values():  # warm up (prepared statements, connections, scripts)
        for _ in range(3):
            prepare()()
    for _ in range(rounds):
        order = list(cases)
        rng.shuffle(order)
        for name in order:
            ops = [cases[name]() for _ in range(reps)]
            gc.disable()
            try:
                for op in ops:
                    t0 = time.perf_counter_ns()
                    op()
                    samples[name].append(time.perf_counter_ns() - t0)
            finally:
                gc.enable()
    return samples


def run_batch(
    stores: list[str], *, rounds: int, reps: int, seed: int, progress: Callable[[str], None]
) -> dict[str, Any]:
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    load_start = [round(x, 2) for x in os.getloadavg()]
    for kind in stores:
        with ExitStack() as stack:
            store = stack.enter_context(_store(kind, stack))
            samples = _sample(_cases(store), rounds, reps, rng)
        medians = {name: statistics.median(s) / 1000 for name, s in samples.items()}
        for kind_of in ("fresh", "replay"):
            for n in SIZES:
                b, s = medians[f"{kind_of}/batched/{n}"], medians[f"{kind_of}/separate/{n}"]
                rows.append(
                    {
                        "store": kind,
                        "claims": kind_of,
                        "n": n,
                        "batched_us": round(b, 1),
                        "separate_us": round(s, 1),
                        "ratio": round(s / b, 2),
                        "samples": len(samples[f"{kind_of}/batched/{n}"]),
                    }
                )
        progress(f"{kind}: done")
    return {
        "rows": rows,
        "rounds": rounds,
        "reps": reps,
        "seed": seed,
        "load_start": load_start,
        "load_end": [round(x, 2) for x in os.getloadavg()],
    }


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# Batched claims: one `claim_many` of N against N separate `claim` calls",
        "",
        f"`{report['command']}` — load average {report['load_start']} at the start, "
        f"{report['load_end']} at the end; {report['rounds']} interleaved rounds x "
        f"{report['reps']} operations per case; medians per operation (N claims).",
        "",
        "| store | claims | N | batched (µs) | separate (µs) | separate / batched |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in report["rows"]:
        lines.append(
            f"| {r['store']} | {r['claims']} | {r['n']} | {r['batched_us']:.1f} | "
            f"{r['separate_us']:.1f} | {r['ratio']:.2f}x |"
        )
    lines += [
        "",
        "`fresh`: new keys, every claim acquires (a step's first run); `replay`: completed "
        "keys, every claim replays (the step run again). N = 1 is the batch's own overhead "
        "(a one-element `claim_many` against one `claim`).",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.batch", description=__doc__.split("\n")[0]
    )
    p.add_argument("--quick", action="store_true", help="a short run for CI")
    p.add_argument("--rounds", type=int, help="interleaved rounds (default 15; quick 2)")
    p.add_argument("--reps", type=int, help="operations per case per round (default 40; quick 5)")
    p.add_argument("--stores", default=",".join(STORES), help="comma-separated store kinds")
    p.add_argument("--out", default=str(RESULTS_DIR), help="directory for the results")
    p.add_argument("--name", default=None, help="file stem (default batch; quick: batch-quick)")
    p.add_argument("--seed", type=int, default=None)
    args = p.parse_args(argv)
    rounds = args.rounds or (2 if args.quick else 15)
    reps = args.reps or (5 if args.quick else 40)
    name = args.name or ("batch-quick" if args.quick else "batch")
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    started = time.monotonic()

    def progress(msg: str) -> None:
        print(f"[{time.monotonic() - started:6.1f}s] {msg}", file=sys.stderr, flush=True)

    stores = [s for s in args.stores.split(",") if s]
    report = run_batch(stores, rounds=rounds, reps=reps, seed=seed, progress=progress)
    report["command"] = "python -m benchmarks.batch " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n")
    text = markdown(report)
    (out / f"{name}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
