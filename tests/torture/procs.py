"""``python -m tests.torture.procs --store {sqlite,redis,postgres} --runs N --seed X``

Real processes, real signals: forked workers call the engine on the same keys (every worker
every key, in its own seeded order) against a real store, and the seed picks, per key, a
worker that is ``kill -9``-ed (``SIGKILL``, sent to itself) or stopped (``SIGSTOP``, its
renewal thread with it) past its lease and resumed by the parent, before or after the
effect. The downstream is the fault campaign's ledger (:class:`tests.support.faults.Ledger`:
deduplicates on the idempotency key, rejects a lower fence). A run is one key.

Checked per key: every caller that was not killed got an answer, and all the same one; the
record is completed and holds it; the tool body re-ran only after a kill or pause of an
owner of that key; the ledger applied the effect once. Prints the summary line last; exit 0
when nothing was violated, 1 otherwise, 2 on bad input.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import random
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from langchain_idempotent import Policy, get_idempotency_context
from langchain_idempotent.core.engine import Engine
from langchain_idempotent.core.record import State
from langchain_idempotent.core.serde import ResultSerializer
from langchain_idempotent.core.store import BaseIdempotencyStore
from langchain_idempotent.errors import IdempotencyError
from tests.support.faults import Ledger

from .stores import UsageError

FORK = mp.get_context("fork")
LEASE = 0.3
WORKERS = 4
KEYS_PER_BATCH = 50


class StaleFence(Exception):
    pass


def _open(kind: str, target: str, name: str) -> BaseIdempotencyStore:
    if kind == "sqlite":
        from langchain_idempotent.stores import SqliteIdempotencyStore

        return SqliteIdempotencyStore(target)
    if kind == "redis":
        from langchain_idempotent.stores import RedisIdempotencyStore

        return RedisIdempotencyStore.from_url(target, prefix=name, socket_timeout=5.0)
    from langchain_idempotent.stores import PostgresIdempotencyStore

    return PostgresIdempotencyStore.from_url(target, table=name, max_size=2)


def _worker(
    kind: str,
    target: str,
    name: str,
    ledger: Ledger,
    keys: list[str],
    faults: dict[str, tuple[str, str]],
) -> None:
    engine = Engine(_open(kind, target, name), Policy(lease=LEASE, wait_timeout=None))
    pid = os.getpid()

    def tool(key: str) -> Any:
        def run() -> str:
            ctx = get_idempotency_context()
            assert ctx is not None
            ledger.executed(key, ctx.fence, ctx.attempt, ctx.takeover)
            act, phase = faults.pop(key, ("", ""))
            sig = signal.SIGKILL if act == "kill" else signal.SIGSTOP
            if phase == "before":
                os.kill(pid, sig)
            reply = ledger.apply(key, ctx.fence, f"{key}|pid{pid}|f{ctx.fence}")
            if reply.status == "stale_fence":
                raise StaleFence(key)
            if phase == "after":
                os.kill(pid, sig)
            return str(reply.value)

        return run

    for key in keys:
        result: str | None = None
        error: str | None = None
        for _ in range(20):
            try:
                result = engine.run(key, fingerprint="fp", action=tool(key))
                error = None
                break
            except (IdempotencyError, StaleFence) as exc:
                error = type(exc).__name__
        ledger.calls([(key, result, error)])


def _stopped(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] in "tT"
    except (OSError, IndexError):
        return False


@dataclass
class Batch:
    keys: list[str]
    #: Per worker: its pid, its exit code, and its planned faults (key -> (act, phase)).
    pids: list[int]
    exits: list[int | None]
    plans: list[dict[str, tuple[str, str]]]


def batch(kind: str, target: str, name: str, ledger: Ledger, rng: random.Random, tag: str) -> Batch:
    keys = [f"{tag}-{i}" for i in range(KEYS_PER_BATCH)]
    plans: list[dict[str, tuple[str, str]]] = [{} for _ in range(WORKERS)]
    kills = set()
    for key in keys:
        if rng.random() < 0.6:
            w = rng.randrange(WORKERS)
            act = "kill" if w not in kills and rng.random() < 0.4 else "stop"
            if act == "kill":
                kills.add(w)
            plans[w][key] = (act, rng.choice(("before", "after")))
    procs = []
    for w in range(WORKERS):
        # Its faulted keys first, so that it is the one that runs their tool (a fault fires
        # only in the worker that runs the tool; the others replay or wait).
        mine = [k for k in keys if k in plans[w]]
        rest = [k for k in keys if k not in plans[w]]
        rng.shuffle(mine)
        rng.shuffle(rest)
        order = mine + rest
        p = FORK.Process(target=_worker, args=(kind, target, name, ledger, order, dict(plans[w])))
        p.start()
        procs.append(p)
    stopped_at: dict[int, float] = {}
    deadline = time.monotonic() + 600
    replaced: set[int] = set()
    while any(p.is_alive() for p in procs):
        for i, p in enumerate(list(procs)):
            if p.exitcode == -signal.SIGKILL and i not in replaced:
                # The killed worker's service restarts it: a new process, every key again.
                replaced.add(i)
                fresh = FORK.Process(target=_worker, args=(kind, target, name, ledger, keys[:], {}))
                fresh.start()
                procs.append(fresh)
                plans.append({})
        if time.monotonic() > deadline:
            for p in procs:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid or 0, signal.SIGKILL)
            raise RuntimeError("a batch of workers did not finish in 600 s")
        for p in procs:
            if p.pid is None or not _stopped(p.pid):
                stopped_at.pop(p.pid or 0, None)
                continue
            since = stopped_at.setdefault(p.pid, time.monotonic())
            if time.monotonic() - since > LEASE * 1.5:  # past its lease: a taker may run
                os.kill(p.pid, signal.SIGCONT)
                stopped_at.pop(p.pid)
        time.sleep(0.01)
    for p in procs:
        p.join()
    return Batch(keys, [p.pid or 0 for p in procs], [p.exitcode for p in procs], plans)


def check(store: BaseIdempotencyStore, ledger: Ledger, b: Batch) -> tuple[list[str], Counter[str]]:
    bad: list[str] = []
    stats: Counter[str] = Counter()
    db = ledger._db()
    inkeys = f"({','.join('?' * len(b.keys))})"
    ran: dict[str, list[int]] = {}
    first_runs: Counter[str] = Counter()
    takeovers: Counter[str] = Counter()
    for key, pid, takeover in db.execute(
        f"SELECT key, pid, takeover FROM executions WHERE key IN {inkeys}", b.keys
    ):
        ran.setdefault(key, []).append(pid)
        (takeovers if takeover else first_runs)[key] += 1
    answered: dict[str, dict[int, str | None]] = {}
    for key, result, pid in db.execute(
        f"SELECT key, result, pid FROM calls WHERE key IN {inkeys}", b.keys
    ):
        answered.setdefault(key, {})[pid] = result
    effects = ledger.effects()
    serde = ResultSerializer()
    for w, code in enumerate(b.exits):
        if code not in (0, -signal.SIGKILL):
            bad.append(f"worker {w} exited with {code}")
    for key in b.keys:
        # The faults that fired: the planned worker ran the tool on this key.
        fired = [
            (w, *b.plans[w][key])
            for w in range(len(b.pids))
            if key in b.plans[w] and b.pids[w] in ran.get(key, [])
        ]
        for _, act, phase in fired:
            stats[f"{act}_{phase}"] += 1
        got = answered.get(key, {})
        values = {v for v in got.values()}
        if len(values) != 1 or None in values:
            bad.append(f"{key}: callers got {sorted(map(str, values))}")
        for w in range(len(b.pids)):
            if b.exits[w] == 0 and b.pids[w] not in got:
                bad.append(f"{key}: worker {w} finished without answering it")
        rec = store.get(key)
        if rec is None or rec.state is not State.COMPLETED:
            bad.append(f"{key}: record {rec}")
        elif serde.loads(rec.payload, key=key) not in values:
            bad.append(f"{key}: the record holds another result than the callers got")
        runs = len(ran.get(key, []))
        # A run that was no takeover is a fresh claim: only one per key (nobody raised).
        if first_runs[key] > 1:
            bad.append(f"{key}: {first_runs[key]} runs that were not takeovers")
        # Takeovers beyond the faults that fired: leases that expired because a worker
        # stalled past its lease on this shared machine (the same fault, unplanned).
        stats["unplanned_takeovers"] += max(0, takeovers[key] - len(fired))
        if effects.get(key, 0) != 1:
            bad.append(f"{key}: {effects.get(key, 0)} effects applied downstream")
        stats["reruns"] += max(0, runs - 1)
    return bad, stats


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.torture.procs")
    p.add_argument("--store", required=True)
    p.add_argument("--runs", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    try:
        args = p.parse_args(argv)
    except SystemExit as exc:
        return 2 if exc.code else 0
    if args.store not in ("sqlite", "redis", "postgres"):
        print(
            f"error: unknown store {args.store!r}; choose sqlite, redis or postgres",
            file=sys.stderr,
        )
        return 2
    if args.runs < 1:
        print(f"error: --runs must be at least 1, got {args.runs}", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="torture-procs-"))
    server: Any = None
    name = f"torture_{uuid.uuid4().hex[:8]}"
    try:
        if args.store == "sqlite":
            target = str(work / "idem.sqlite")
        elif args.store == "redis":
            from tests.support.redis_servers import RedisServer

            server = RedisServer()
            target = server.url
            name += ":"
        else:
            from tests.support.postgres_server import PostgresServer

            server = PostgresServer()
            target = server.url
        store = _open(args.store, target, name)
        ledger = Ledger(work / "ledger.sqlite")
        rng = random.Random(args.seed)
        runs = 0
        bad: list[str] = []
        stats: Counter[str] = Counter()
        first = "-"
        started = time.monotonic()
        b = 0
        while runs < args.runs:
            tag = f"s{args.seed}-b{b}"
            done = batch(args.store, target, name, ledger, rng, tag)
            errs, st = check(store, ledger, done)
            stats.update(st)
            if errs and first == "-":
                first = f"{args.seed} (batch {b})"
            bad += errs[:5]
            runs += len(done.keys)
            b += 1
        for line in bad:
            print(f"  {line}")
        print(
            f"store {args.store}: {time.monotonic() - started:.1f} s; "
            + ", ".join(f"{k}={v}" for k, v in sorted(stats.items()))
        )
        print(
            f"runs={runs} kills={stats['kill_before'] + stats['kill_after']} "
            f"pauses={stats['stop_before'] + stats['stop_after']} violations={len(bad)} "
            f"first_failing_seed={first}"
        )
        with contextlib.suppress(Exception):
            store.close()
        return 1 if bad else 0
    except (RuntimeError, UsageError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        if server is not None:
            server.stop()
            shutil.rmtree(server.dir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
