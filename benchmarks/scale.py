"""Cost as records grow: latency, bytes per record and expiry at 10^3 .. 10^6 stored records.

``python -m benchmarks.scale`` (or ``python -m benchmarks --scale``) writes
``benchmarks/results/scale.{md,json,png}``. For SQLite, Redis and PostgreSQL (each on a
throwaway server or file it starts itself; a store whose server cannot start is skipped
with the reason, never the whole run) it:

1. **Grows one store** to each size in turn (default 10^3, 10^5, 10^6 records). The records
   are the store's own: the engine writes a template record (a 100-byte result, the meta a
   LangGraph call carries), and the loader copies it under new keys (SHA-256 hex, like
   derived keys) with the store's own bytes: Redis ``COPY`` of the record hash (TTL
   included), ``INSERT ... SELECT`` of the row in SQLite and PostgreSQL. That is how 10^6
   records load in seconds rather than the half hour 10^6 first runs would take.
2. **Times first runs and replays** (``Engine.run``: claim + complete, and one claim) on
   the grown store and, interleaved in the same rounds, on a reference store kept at 10^3
   records, so each size has a same-moment ratio besides its ratio to the 10^3 stage.
3. **Weighs a record**: Redis ``used_memory`` delta per record, PostgreSQL
   ``pg_total_relation_size`` (heap, indexes and TOAST) per row, SQLite file size per row.
4. **Expiry**: Redis drops a record by its own TTL (``PEXPIRE``, lazily on access and by
   its active expire cycle); SQLite and PostgreSQL keep expired rows until a sweep (every
   64th write transaction in SQLite, every 64th claim of a store object in PostgreSQL,
   deletes at most 256 expired rows in its own transaction). With a backlog of expired
   records it times first runs next to a store without one, finds the calls that swept,
   and reports what a sweep costs and how fast the backlog goes away.

Speed is reported, never asserted; the exit status is 1 only if a case executed wrongly
(a first run not exactly once, a replay that executed).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import os
import random
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._outputs import finish, progress, pyplot, started
from .stats import percentile

__all__ = ["main"]

RESULTS_DIR = Path(__file__).resolve().parent / "results"
RESULT = "r" * 100  # the tool's 100-byte result
META = {  # what a LangGraph ToolNode call's record carries (keys.derive_key)
    "namespace": "",
    "thread_id": "ticket-1042",
    "tool": "issue_refund",
    "node": "tools",
    "graph_path": "tools",
    "agent": "",
    "parent_call": "",
    "key_version": "1",
}
FINGERPRINT = "f" * 32
LOAD_BATCH = 10_000
STORES = ("sqlite", "redis", "redis-listpack", "postgres")


def record_key(tag: str, i: int) -> str:
    """The ``i``-th bulk key of ``tag``: SHA-256 hex, like the keys the library derives."""
    return hashlib.sha256(f"{tag}:{i}".encode()).hexdigest()


# -- one store under test ------------------------------------------------------------------


@dataclass
class Target:
    """One store (a database file, a Redis db, a PostgreSQL table) and how to fill and weigh
    it. ``copy(template, keys)`` copies the template record under ``keys``; ``weight()`` is
    the bytes the store's records take (``None``: not measurable)."""

    name: str
    store: Any
    copy: Callable[[str, Sequence[str]], None]
    weight: Callable[[], float]
    count: Callable[[], int]
    tag: str
    #: After a bulk load: what the server would have done by itself meanwhile (PostgreSQL:
    #: autovacuum's VACUUM ANALYZE and a checkpoint), so the timing does not pay for it.
    settle: Callable[[], None] = lambda: None
    #: Redis only: give ``keys`` an absolute expiry (ms, server clock), as PEXPIRE does.
    expire_at: Callable[[Sequence[str], int], None] | None = None
    loaded: int = 0
    executions: list[int] = field(default_factory=lambda: [0])

    def engine(self, **policy: Any) -> Any:
        from langchain_idempotent import Policy
        from langchain_idempotent.core.engine import Engine

        return Engine(self.store, Policy(**policy))

    def template(self, key: str, **policy: Any) -> str:
        """Write one record through the engine (a first run) and return its key."""
        self.engine(**policy).run(key, fingerprint=FINGERPRINT, action=lambda: RESULT, meta=META)
        return key

    def grow(self, total: int) -> float:
        """Copy the template under new keys until ``total`` records are loaded; seconds."""
        started = time.perf_counter()
        template = self.template(f"{self.tag}:template")
        while self.loaded < total:
            n = min(LOAD_BATCH, total - self.loaded)
            self.copy(template, [record_key(self.tag, self.loaded + i) for i in range(n)])
            self.loaded += n
        self.settle()
        return time.perf_counter() - started

    def key(self, rng: random.Random) -> str:
        return record_key(self.tag, rng.randrange(self.loaded))


def _sqlite(directory: str, tag: str) -> Target:
    from langchain_idempotent import SqliteIdempotencyStore
    from langchain_idempotent.stores.sqlite._schema import COLUMNS

    path = os.path.join(directory, f"{tag}.db")
    store = SqliteIdempotencyStore(path)
    db = sqlite3.connect(path, isolation_level=None, timeout=30)
    table = "idempotency_records"
    rest = [c.strip() for c in COLUMNS.split(",") if c.strip() != "key"] + ["expires_at"]
    insert = (
        f"INSERT INTO {table} (key, {', '.join(rest)}) "
        f"SELECT ?, {', '.join(rest)} FROM {table} WHERE key = ?"
    )

    def copy(template: str, keys: Sequence[str]) -> None:
        db.execute("BEGIN IMMEDIATE")
        db.executemany(insert, [(k, template) for k in keys])
        db.execute("COMMIT")

    def weight() -> float:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        wal = path + "-wal"
        return os.path.getsize(path) + (os.path.getsize(wal) if os.path.exists(wal) else 0)

    def count() -> int:
        return int(db.execute(f"SELECT count(*) FROM {table}").fetchone()[0])

    return Target("SQLite", store, copy, weight, count, tag)


def _redis(server: Any, db: int, tag: str) -> Target:
    import redis

    from langchain_idempotent import RedisIdempotencyStore

    client = redis.Redis(host="127.0.0.1", port=server.port, db=db)
    store = RedisIdempotencyStore(client)

    def copy(template: str, keys: Sequence[str]) -> None:
        pipe = client.pipeline(transaction=False)
        source = store._rkey(template)  # the store's own key layout ({prefix}{<key>})
        for k in keys:
            pipe.copy(source, store._rkey(k))
        pipe.execute()

    def weight() -> float:
        return float(client.info("memory")["used_memory"])

    def count() -> int:
        return int(client.dbsize())

    def expire_at(keys: Sequence[str], at_ms: int) -> None:
        for i in range(0, len(keys), LOAD_BATCH):
            pipe = client.pipeline(transaction=False)
            for k in keys[i : i + LOAD_BATCH]:
                pipe.pexpireat(store._rkey(k), at_ms)
            pipe.execute()

    return Target("Redis", store, copy, weight, count, tag, expire_at=expire_at)


def _postgres(url: str, tag: str) -> Target:
    import psycopg
    from psycopg_pool import ConnectionPool

    from langchain_idempotent.stores.postgres import PostgresIdempotencyStore

    table = f"scale_{tag}"
    pool: ConnectionPool[Any] = ConnectionPool(
        url, min_size=1, max_size=2, kwargs={"autocommit": True}, open=True
    )
    store = PostgresIdempotencyStore(pool, table=table)
    store.setup()
    conn = psycopg.connect(url, autocommit=True)
    columns = [
        r[0]
        for r in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = %s "
            "ORDER BY ordinal_position",
            (table,),
        )
        if r[0] != "key"
    ]
    rest = ", ".join(columns)

    def copy(template: str, keys: Sequence[str]) -> None:
        conn.execute(
            f"INSERT INTO {table} (key, {rest}) SELECT k, {rest} FROM {table}, "
            "unnest(%s::text[]) AS k WHERE key = %s",
            (list(keys), template),
        )

    def weight() -> float:
        row = conn.execute("SELECT pg_total_relation_size(%s)", (table,)).fetchone()
        assert row is not None
        return float(row[0])

    def count() -> int:
        row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
        assert row is not None
        return int(row[0])

    def settle() -> None:
        conn.execute(f"VACUUM (ANALYZE) {table}")
        conn.execute("CHECKPOINT")

    return Target("PostgreSQL", store, copy, weight, count, tag, settle=settle)


@contextlib.contextmanager
def targets(
    name: str, workdir: str, stack: ExitStack
) -> Iterator[tuple[Target, Target, Target] | str]:
    """The store ``name`` three times (grown, reference, expiry backlog), or why not."""
    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.insert(0, root)
    if name == "sqlite":
        yield _sqlite(workdir, "grown"), _sqlite(workdir, "ref"), _sqlite(workdir, "expiry")
    elif name in ("redis", "redis-listpack"):
        from tests.support.redis_servers import RedisServer, redis_server_available

        if not redis_server_available():
            yield "redis-server is not on PATH"
            return
        # redis-listpack: hash-max-listpack-value above the record's largest field (the
        # payload), so a record stays a compact listpack rather than a hash table.
        options = {"hash_max_listpack_value": "1024"} if name == "redis-listpack" else {}
        try:
            server = stack.enter_context(RedisServer(loglevel="warning", **options))
        except Exception as exc:
            yield f"redis-server did not start: {exc}"
            return
        yield _redis(server, 0, "grown"), _redis(server, 1, "ref"), _redis(server, 2, "expiry")
    elif name == "postgres":
        from tests.support.postgres_server import PostgresServer, postgres_unavailable_reason

        url = os.environ.get("IDEMPOTENCY_TEST_PG_URL")
        if not url:
            reason = postgres_unavailable_reason()
            if reason is not None:
                yield f"PostgreSQL unavailable: {reason}"
                return
            try:
                server = stack.enter_context(PostgresServer(shared_buffers="128MB"))
            except Exception as exc:
                yield f"PostgreSQL did not start: {exc}"
                return
            url = server.url
        yield _postgres(url, "grown"), _postgres(url, "ref"), _postgres(url, "expiry")
    else:
        raise ValueError(f"unknown store {name!r}; known: {', '.join(STORES)}")


# -- timing ----------------------------------------------------------------------------------


def _time(calls: Sequence[Callable[[], object]]) -> list[int]:
    """Each call's wall time in ns, GC off (a collection is not the store's cost)."""
    out: list[int] = []
    gc.disable()
    try:
        for call in calls:
            t0 = time.perf_counter_ns()
            call()
            out.append(time.perf_counter_ns() - t0)
    finally:
        gc.enable()
    return out


def _first_runs(target: Target, engine: Any, n: int, run: str) -> list[Callable[[], object]]:
    done = target.executions

    def action() -> str:
        done[0] += 1
        return RESULT

    keys = [f"{target.tag}:{run}:{i}" for i in range(n)]
    return [
        lambda k=k: engine.run(k, fingerprint=FINGERPRINT, action=action, meta=META) for k in keys
    ]


def _replays(target: Target, engine: Any, n: int, rng: random.Random) -> list[Callable[[], object]]:
    done = target.executions

    def action() -> str:
        done[0] += 1  # a replay never gets here
        return RESULT

    keys = [target.key(rng) for _ in range(n)]
    return [
        lambda k=k: engine.run(k, fingerprint=FINGERPRINT, action=action, meta=META) for k in keys
    ]


def _stats(samples: Sequence[int]) -> dict[str, float]:
    s = sorted(samples)
    return {"p50_us": percentile(s, 0.5) / 1000, "p99_us": percentile(s, 0.99) / 1000}


def measure_stage(
    grown: Target, ref: Target, *, calls: int, rounds: int, rng: random.Random, stage: str
) -> dict[str, Any]:
    """First runs and replays on ``grown`` and ``ref``, interleaved in shuffled rounds."""
    engines = {id(t): t.engine() for t in (grown, ref)}
    samples: dict[tuple[str, str], list[int]] = {}
    problems: list[str] = []
    for r in range(rounds):
        cases = [(t, kind) for t in (grown, ref) for kind in ("first_run", "replay")]
        rng.shuffle(cases)
        for target, kind in cases:
            engine = engines[id(target)]
            before = target.executions[0]
            if kind == "first_run":
                batch = _first_runs(target, engine, calls, f"{stage}-{r}")
            else:
                batch = _replays(target, engine, calls, rng)
            samples.setdefault((target.tag, kind), []).extend(_time(batch))
            ran = target.executions[0] - before
            if ran != (calls if kind == "first_run" else 0):
                problems.append(f"{target.name} {target.tag} {kind}: {ran} executions")
    out: dict[str, Any] = {"problems": problems}
    for (tag, kind), s in samples.items():
        out[f"{tag}_{kind}"] = _stats(s)
    return out


# -- expiry ----------------------------------------------------------------------------------


def measure_expiry(
    expiry: Target, ref: Target, *, records: int, calls: int, rng: random.Random
) -> dict[str, Any]:
    """A backlog of ``records`` expiring records on ``expiry``; first runs on it next to
    ``ref`` (no backlog); what goes away, how fast, and what it costs the calls.

    SQLite / PostgreSQL: copies of a record the engine wrote with a 1 s TTL, all expired
    when the calls start. Redis: copies given one expiry time 1 s after the calls start
    (``PEXPIREAT``), so its expire cycle runs while they do."""
    ttl_s = 1.0
    redis = expiry.expire_at is not None
    policy = {} if redis else {"lease": ttl_s, "ttl": ttl_s}
    template = expiry.template(f"{expiry.tag}:template", **policy)
    keys = [record_key(expiry.tag, i) for i in range(records)]
    started = time.perf_counter()
    for i in range(0, records, LOAD_BATCH):
        expiry.copy(template, keys[i : i + LOAD_BATCH])
    expiry.settle()
    expires_in = 0.0
    if expiry.expire_at is not None:
        # Far enough ahead for the PEXPIREAT pass itself (seconds for 10^5 keys on a busy
        # machine), then wait until the expiry is ttl_s away: the calls start then.
        at_ms = int(expiry.store.now_ms() + 2000 + records // 20)
        expiry.expire_at(keys, at_ms)
        time.sleep(max(0.0, (at_ms - expiry.store.now_ms()) / 1000 - ttl_s))
        expires_in = (at_ms - expiry.store.now_ms()) / 1000
    else:
        time.sleep(max(0.0, ttl_s + 0.1 - (time.perf_counter() - started)))
    before = expiry.count()
    out: dict[str, Any] = {"records": records, "count_before": before}
    engine, ref_engine = expiry.engine(), ref.engine()
    backlog: list[int] = []
    clean: list[int] = []
    t0 = time.perf_counter()
    drained: list[tuple[float, int]] = [(-expires_in, before)]  # seconds after the expiry
    batch = 64
    for r in range(max(1, calls // batch)):
        order = [("backlog", engine, expiry), ("clean", ref_engine, ref)]
        rng.shuffle(order)
        for label, e, target in order:
            got = _time(_first_runs(target, e, batch, f"exp-{r}"))
            (backlog if label == "backlog" else clean).extend(got)
        if redis:
            drained.append((time.perf_counter() - t0 - expires_in, expiry.count()))
    out["calls"] = len(backlog)
    out["backlog"] = _stats(backlog)
    out["clean"] = _stats(clean)
    if redis:
        # The active expire cycle goes on without calls: wait (bounded) until it is done.
        deadline = time.perf_counter() + 60
        while expiry.count() > len(backlog) + 1 and time.perf_counter() < deadline:
            time.sleep(0.05)
            drained.append((time.perf_counter() - t0 - expires_in, expiry.count()))
        out["drain"] = drained
        out["drain_s"] = next((t for t, n in drained if n <= len(backlog) + 1), None)
    else:
        # Each call's index within its store object's write / claim counter: the sweeping
        # calls are one residue class of the period; find it by its median.
        period = 32 if expiry.name == "SQLite" else 64
        by_phase: dict[int, list[int]] = {}
        for i, ns in enumerate(backlog):
            by_phase.setdefault(i % period, []).append(ns)
        medians = {p: percentile(sorted(v), 0.5) for p, v in by_phase.items()}
        phase = max(medians, key=lambda p: medians[p])
        others = sorted(ns for p, v in by_phase.items() if p != phase for ns in v)
        sweeping = sorted(by_phase[phase])
        out["sweep_period_calls"] = period
        out["sweeping_call_p50_us"] = percentile(sweeping, 0.5) / 1000
        out["other_call_p50_us"] = percentile(others, 0.5) / 1000
        out["sweep_cost_us"] = out["sweeping_call_p50_us"] - out["other_call_p50_us"]
    after = expiry.count()
    out["count_after"] = after
    out["removed"] = before + len(backlog) - after
    out["elapsed_s"] = time.perf_counter() - t0
    return out


# -- the run ---------------------------------------------------------------------------------


def run_store(name: str, args: argparse.Namespace, rng: random.Random) -> dict[str, Any]:
    say = progress(args.started)
    with ExitStack() as stack:
        workdir = stack.enter_context(tempfile.TemporaryDirectory(prefix=f"scale-{name}-"))
        got = stack.enter_context(targets(name, workdir, stack))
        if isinstance(got, str):
            say(f"{name}: skipped: {got}")
            return {"store": name, "status": "skipped", "detail": got}
        grown, ref, expiry = got
        grown.template(f"{grown.tag}:template")  # the schema exists before it is weighed
        ref.grow(args.sizes[0])
        stages: list[dict[str, Any]] = []
        problems: list[str] = []
        for size in args.sizes:
            w0, n0 = grown.weight(), grown.count()
            load_s = grown.grow(size)
            w1, n1 = grown.weight(), grown.count()
            redis = name.startswith("redis")  # used_memory: the delta; the others: the total
            per_record = (w1 - w0) / max(1, n1 - n0) if redis else w1 / n1
            say(f"{name}: {n1:,} records loaded in {load_s:.1f}s, {per_record:.0f} B each")
            stage = measure_stage(
                grown, ref, calls=args.calls, rounds=args.rounds, rng=rng, stage=str(size)
            )
            problems += stage.pop("problems")
            stages.append(
                {
                    "size": size,
                    "records": n1,
                    "load_s": round(load_s, 2),
                    "bytes_per_record": round(per_record, 1),
                    **stage,
                }
            )
            say(
                f"{name} @ {size:,}: first run p50 {stage['grown_first_run']['p50_us']:.0f} us, "
                f"replay p50 {stage['grown_replay']['p50_us']:.0f} us"
            )
        say(f"{name}: expiry backlog of {args.expiry_records:,}")
        expiry_out = measure_expiry(
            expiry, ref, records=args.expiry_records, calls=args.expiry_calls, rng=rng
        )
    return {
        "store": name,
        "status": "ok",
        "stages": stages,
        "expiry": expiry_out,
        "problems": problems,
    }


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# Cost as records grow",
        "",
        f"`{report['command']}` — {report['date']}, {report['elapsed_s']} s, load average "
        f"{report['loadavg_start']} at the start, {report['loadavg_end']} at the end "
        f"(2 vCPUs shared with other work: compare the ratios, measured in the same run).",
        "",
        f"Per size: {report['config']['rounds']} shuffled rounds of "
        f"{report['config']['calls']} first runs and {report['config']['calls']} replays on "
        f"the grown store and on a reference store of {report['config']['sizes'][0]:,} "
        "records, interleaved. `vs ref` is the grown store's p50 over the reference's in the "
        "same rounds; `vs first size` is its p50 over its own at the first size. A record: a "
        "100-byte result with a LangGraph call's meta.",
        "",
        "| store | records | first run p50 / p99 (µs) | replay p50 / p99 (µs) "
        "| first run p50 vs ref / vs first size | replay p50 vs ref / vs first size "
        "| bytes per record |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for s in report["stores"]:
        if s["status"] != "ok":
            lines.append(f"| {s['store']} | skipped: {s['detail']} | | | | | |")
            continue
        first = s["stages"][0]
        for st in s["stages"]:
            f, r = st["grown_first_run"], st["grown_replay"]
            lines.append(
                f"| {s['store']} | {st['records']:,} | {f['p50_us']:.0f} / {f['p99_us']:.0f} "
                f"| {r['p50_us']:.0f} / {r['p99_us']:.0f} "
                f"| {_ratio(f['p50_us'], st['ref_first_run']['p50_us'])} / "
                f"{_ratio(f['p50_us'], first['grown_first_run']['p50_us'])} "
                f"| {_ratio(r['p50_us'], st['ref_replay']['p50_us'])} / "
                f"{_ratio(r['p50_us'], first['grown_replay']['p50_us'])} "
                f"| {st['bytes_per_record']:.0f} |"
            )
    lines += [
        "",
        "## Expiry",
        "",
        "A backlog of expiring records, then first runs on that store interleaved with first "
        "runs on one without a backlog (the reference store). SQLite and PostgreSQL: copies "
        "of a record the engine wrote with a 1 s TTL, all expired when the calls start. "
        "Redis: copies set to expire (`PEXPIREAT`) 1 s after the calls start, so its expire "
        "cycle runs while they do. `sweep cost`: the sweeping calls' p50 over the others'.",
        "",
        "| store | expiring records | first run p50 / p99 with backlog (µs) "
        "| without (µs) | how they go | removed during the calls | sweep cost / drain |",
        "|---|---:|---:|---:|---|---:|---:|",
    ]
    for s in report["stores"]:
        if s["status"] != "ok":
            continue
        e = s["expiry"]
        if s["store"].startswith("redis"):
            how = "own TTL: lazy on access + active expire cycle"
            drain = e.get("drain_s")
            sweep = (
                f"all {e['count_before']:,} gone {drain:.2f} s after their expiry time"
                if drain is not None
                else "not drained in 60 s"
            )
        else:
            per = "write transaction" if s["store"] == "sqlite" else "claim of a store object"
            how = f"sweep: ≤ 256 rows every 64th {per}"
            sweep = (
                f"+{e['sweep_cost_us']:.0f} µs on 1 call in {e['sweep_period_calls']} "
                f"({e['sweeping_call_p50_us']:.0f} vs {e['other_call_p50_us']:.0f} µs p50)"
            )
        lines.append(
            f"| {s['store']} | {e['count_before']:,} | {e['backlog']['p50_us']:.0f} / "
            f"{e['backlog']['p99_us']:.0f} | {e['clean']['p50_us']:.0f} / "
            f"{e['clean']['p99_us']:.0f} | {how} | {e['removed']:,} in {e['calls']:,} calls "
            f"({e['elapsed_s']:.1f} s) | {sweep} |"
        )
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    for s in report["stores"]:
        if s["status"] != "ok":
            continue
        sizes = [st["records"] for st in s["stages"]]
        for ax, kind in zip(axes[:2], ("first_run", "replay"), strict=True):
            ax.plot(sizes, [st[f"grown_{kind}"]["p50_us"] for st in s["stages"]], "o-",
                    label=f"{s['store']} p50")  # fmt: skip
            ax.plot(sizes, [st[f"grown_{kind}"]["p99_us"] for st in s["stages"]], "x--",
                    alpha=0.6, label=f"{s['store']} p99")  # fmt: skip
        axes[2].plot(sizes, [st["bytes_per_record"] for st in s["stages"]], "o-", label=s["store"])
    for ax, title in zip(axes, ("first run (µs)", "replay (µs)", "bytes per record"), strict=True):
        ax.set_xscale("log")
        ax.set_yscale("log" if "µs" in title else "linear")
        ax.set_xlabel("stored records")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    axes[2].axhline(1024, color="grey", linestyle=":", label="1 KiB")
    axes[0].legend(fontsize=7)
    axes[2].legend(fontsize=7)
    fig.suptitle(f"langchain-idempotent: cost as records grow ({report['date']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.scale", description=__doc__.split("\n")[0]
    )
    p.add_argument("--stores", default=",".join(STORES), help="comma-separated")
    p.add_argument("--sizes", default="1000,100000,1000000", help="records, ascending")
    p.add_argument("--calls", type=int, default=500, help="calls per case per round")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--expiry-records", type=int, default=100_000)
    p.add_argument("--expiry-calls", type=int, default=2048, help="first runs during expiry")
    p.add_argument("--quick", action="store_true", help="tiny sizes, for the smoke test")
    p.add_argument("--out", default=str(RESULTS_DIR))
    p.add_argument("--name", default=None, help="file stem (default scale; quick: scale-quick)")
    p.add_argument("--seed", type=int, default=None)
    args = p.parse_args(argv)
    if args.quick:
        args.sizes, args.calls, args.rounds = "200,1000", 20, 1
        args.expiry_records, args.expiry_calls = 500, 128
    args.sizes = [int(s) for s in str(args.sizes).split(",")]
    if args.sizes != sorted(args.sizes) or args.sizes[0] < 1:
        p.error("--sizes must be positive and ascending")
    args.stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    args.name = args.name or ("scale-quick" if args.quick else "scale")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    report = started("benchmarks.scale", argv)
    args.started = report["_t0"]
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    stores = [run_store(name, args, rng) for name in args.stores]
    report.update(
        seed=seed,
        config={
            "sizes": args.sizes,
            "calls": args.calls,
            "rounds": args.rounds,
            "expiry_records": args.expiry_records,
            "expiry_calls": args.expiry_calls,
        },
        stores=stores,
        problems=[p for s in stores for p in s.get("problems", [])],
    )
    return finish(report, args.out, args.name, markdown, plot)


if __name__ == "__main__":
    raise SystemExit(main())
