"""What encrypting results at rest costs: ``Engine.run`` with and without
``encryption=ResultEncryption(...)``, first runs and replays, side by side.

``python -m benchmarks.encryption [--rounds N] [--batch N] [--no-redis] [--out PATH]``

Interleaved rounds (one warm-up round not recorded): per store (in-memory, SQLite in a
temporary file, and Redis on a throwaway ``redis-server`` from :mod:`benchmarks.server`
unless ``--no-redis``), per result size (a refund receipt of ~150 bytes, a 16 KB text),
encryption off and on, a first run (a new key: claim, the tool, seal, complete) and a
replay (one claim answered with the stored payload: open, decode). Prints and writes (to
``results/encryption.md`` and ``.json``) the median µs per case, and per pair the
difference and the ratio on / off. Wall-clock figures: compare within one run.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from langchain_idempotent import (
    InMemoryIdempotencyStore,
    Policy,
    ResultEncryption,
    SqliteIdempotencyStore,
)
from langchain_idempotent.core.engine import Engine
from langchain_idempotent.core.store import BaseIdempotencyStore

from . import ours
from .adapter_timing import interleaved

__all__ = ["main", "timing"]

RESULTS = Path(__file__).resolve().parent / "results"
KEYS = ResultEncryption({"k2": os.urandom(32), "k1": os.urandom(32)})
RECEIPT = {"refund_id": "re_3Pq8", "amount": 140.0, "currency": "eur", "customer": "Ada"}
SIZES: dict[str, object] = {"receipt": RECEIPT, "16 KB": "x" * 16_384}


def _engine(store: BaseIdempotencyStore, encrypted: bool) -> Engine:
    policy = Policy(
        lease=ours.LEASE_S,
        wait_timeout=ours.WAIT_TIMEOUT_S,
        encryption=KEYS if encrypted else None,
    )
    return Engine(store, policy)


Case = tuple[Callable[[str], object], Callable[[int], list[str]]]


def _cases(stores: dict[str, BaseIdempotencyStore]) -> dict[tuple[str, str, str, str], Case]:
    cases: dict[tuple[str, str, str, str], Case] = {}
    counter = itertools.count()
    for store_name, store in stores.items():
        for size, value in SIZES.items():
            for mode in ("off", "on"):
                engine = _engine(store, mode == "on")
                tag = f"{store_name}-{size}-{mode}"

                def run(key: str, engine: Engine = engine, value: object = value) -> object:
                    return engine.run(key, fingerprint="fp", action=lambda: value)

                run(f"{tag}-replay")

                def fresh(n: int, tag: str = tag) -> list[str]:
                    return [f"{tag}-{next(counter)}" for _ in range(n)]

                def same(n: int, tag: str = tag) -> list[str]:
                    return [f"{tag}-replay"] * n

                cases[(store_name, size, "first run", mode)] = (run, fresh)
                cases[(store_name, size, "replay", mode)] = (run, same)
    return cases


def timing(
    stores: dict[str, BaseIdempotencyStore], rounds: int, batch: int
) -> dict[tuple[str, str, str, str], float]:
    """The median µs per case over ``rounds`` interleaved rounds of ``batch`` calls."""
    return interleaved(_cases(stores), rounds, batch)


@contextlib.contextmanager
def _stores(redis: bool) -> Iterator[dict[str, BaseIdempotencyStore]]:
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        stores: dict[str, BaseIdempotencyStore] = {
            "memory": InMemoryIdempotencyStore(),
            "sqlite": SqliteIdempotencyStore(os.path.join(tmp, "bench.db")),
        }
        if redis:
            from langchain_idempotent import RedisIdempotencyStore

            from .server import RedisServer

            server = stack.enter_context(RedisServer())
            stores["redis"] = RedisIdempotencyStore.from_url(server.url, prefix="bench-enc:")
        try:
            yield stores
        finally:
            for store in stores.values():
                store.close()


def _table(med: dict[tuple[str, str, str, str], float]) -> list[str]:
    rows = [
        "| store | result | call | off µs | on µs | on - off µs | on / off |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for (store, size, call, mode), off in med.items():
        if mode != "off":
            continue
        on = med[(store, size, call, "on")]
        rows.append(
            f"| {store} | {size} | {call} | {off:.1f} | {on:.1f} | {on - off:+.1f} | "
            f"{on / off:.3f}x |"
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.encryption", description=__doc__)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--batch", type=int, default=200)
    p.add_argument("--no-redis", action="store_true", help="leave the Redis rows out")
    p.add_argument("--out", type=Path, default=RESULTS / "encryption.md")
    args = p.parse_args(argv)
    started = time.time()
    load = os.getloadavg()[0]
    with _stores(not args.no_redis) as stores:
        med = timing(stores, args.rounds, args.batch)
    given = sys.argv[1:] if argv is None else argv
    command = " ".join(["python -m benchmarks.encryption", *given])
    lines = [
        "# Encryption at rest: cost per call",
        "",
        f"`{command}`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}, "
        f"{args.rounds} interleaved rounds of {args.batch} calls per case, medians; load "
        f"average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end; "
        f"Python {platform.python_version()}, {platform.machine()}. AES-256-GCM from "
        "`cryptography`; off and on run against the same store in the same rounds.",
        "",
        *_table(med),
        "",
    ]
    text = "\n".join(lines)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    doc = [
        {"store": s, "result": z, "call": c, "encryption": m, "median_us": round(v, 2)}
        for (s, z, c, m), v in med.items()
    ]
    args.out.with_suffix(".json").write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
