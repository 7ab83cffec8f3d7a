"""How long a dead worker's call blocks its resume: from ``SIGKILL`` to the resumed call's
first effect, per store.

``python -m benchmarks.takeover [--runs N] [--stores sqlite,redis,postgres] [--lease S]``

For each run: a worker process claims a fresh key through the engine (the default
:class:`~langchain_idempotent.core.policy.Policy`, or ``--lease``) and starts its tool,
which never returns; a second process, already started and connected (a worker waiting
for work), is standing by. The worker is ``SIGKILL``ed at a random moment 0-1 s into its
tool (so the kill falls anywhere between two renewals), and the clock starts; the standing
process then calls the same key: it finds the dead worker's lease, waits (woken at its
expiry), takes over, and its tool's first line stops the clock. Both clocks are
``CLOCK_MONOTONIC`` (``time.monotonic``), one clock for every process on Linux. The figure
is the p50 / p95 / max over the runs, in seconds. Memory is one process, so it is not
measured; SQLite shares a file, Redis and PostgreSQL are throwaway servers on loopback.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STORES = ("sqlite", "redis", "postgres")


@contextmanager
def _spec(kind: str, stack: ExitStack) -> Iterator[str]:
    """How a child process opens the store: ``kind|address|name``."""
    if kind == "sqlite":
        folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-takeover-"))
        yield f"sqlite|{os.path.join(folder, 'records.db')}|"
    elif kind == "redis":
        from .server import RedisServer

        server = stack.enter_context(RedisServer())
        yield f"redis|{server.url}|takeover-{uuid.uuid4().hex[:8]}:"
    elif kind == "postgres":
        sys.path.insert(0, str(ROOT))
        from tests.support.postgres_server import PostgresServer

        server = stack.enter_context(PostgresServer())
        yield f"postgres|{server.url}|takeover_{uuid.uuid4().hex[:8]}"
    else:
        raise ValueError(f"unknown store {kind!r}; choose from {', '.join(STORES)}")


def _open(spec: str) -> object:
    kind, address, name = spec.split("|")
    if kind == "sqlite":
        from langchain_idempotent.stores.sqlite import SqliteIdempotencyStore

        return SqliteIdempotencyStore(address)
    if kind == "redis":
        from langchain_idempotent.stores.redis import RedisIdempotencyStore

        return RedisIdempotencyStore.from_url(address, prefix=name)
    from langchain_idempotent.stores.postgres import PostgresIdempotencyStore

    return PostgresIdempotencyStore.from_url(address, table=name)


def _child(role: str, spec: str, key: str, lease: str) -> None:
    """A worker (``role="dies"``: its tool never returns) or the standing process
    (``role="resumes"``: waits for ``go`` on stdin, then calls the key)."""
    from langchain_idempotent import Policy
    from langchain_idempotent.core.engine import Engine
    from langchain_idempotent.core.store import BaseIdempotencyStore

    store = _open(spec)
    assert isinstance(store, BaseIdempotencyStore)
    policy = Policy(lease=float(lease)) if lease else Policy()
    engine = Engine(store, policy)

    def hangs() -> str:
        print("started", flush=True)
        time.sleep(3600)
        return "never"

    def first_effect() -> str:
        print(f"effect {time.monotonic()!r}", flush=True)
        return "done"

    if role == "dies":
        engine.run(key, fingerprint="fp", action=hangs)
        return
    engine.run("warm-" + key, fingerprint="fp", action=lambda: "warm")  # connected, warm
    print("ready", flush=True)
    sys.stdin.readline()
    engine.run(key, fingerprint="fp", action=first_effect)


def _spawn(role: str, spec: str, key: str, lease: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "benchmarks.takeover", "--child", role, spec, key, lease],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )


def one_run(spec: str, lease: str, rng: random.Random) -> float:
    """Seconds from the worker's SIGKILL to the resumed call's first effect."""
    key = f"takeover-{uuid.uuid4().hex}"
    standing = _spawn("resumes", spec, key, lease)
    worker = _spawn("dies", spec, key, lease)
    try:
        assert standing.stdout is not None and worker.stdout is not None
        assert standing.stdout.readline().strip() == "ready"
        assert worker.stdout.readline().strip() == "started"
        time.sleep(rng.uniform(0.0, 1.0))
        worker.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        worker.wait()
        assert standing.stdin is not None
        standing.stdin.write("go\n")
        standing.stdin.flush()
        line = standing.stdout.readline().split()
        assert line and line[0] == "effect", line
        return float(line[1]) - killed
    finally:
        for process in (worker, standing):
            if process.poll() is None:
                process.kill()
            process.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--stores", default=",".join(STORES))
    parser.add_argument("--lease", default="", help="seconds (default: Policy's default)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(*args.child)
        return
    from langchain_idempotent import Policy

    lease = args.lease or f"{Policy().lease_s:g} (default)"
    print(f"SIGKILL -> resumed call's first effect, lease {lease} s, {args.runs} runs per store")
    print("| store | p50 s | p95 s | max s |\n|---|---|---|---|")
    rng = random.Random(args.seed)
    for kind in args.stores.split(","):
        with ExitStack() as stack, _spec(kind, stack) as spec:
            times = sorted(one_run(spec, args.lease, rng) for _ in range(args.runs))
        p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
        print(f"| {kind} | {statistics.median(times):.2f} | {p95:.2f} | {times[-1]:.2f} |")


if __name__ == "__main__":
    main()
