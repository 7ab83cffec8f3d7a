"""What a store's backend promises about records, and what in it puts them at risk.

:func:`diagnose` connects to the store at a URL and returns a :class:`Report`: *facts*
(what the server says) and *findings*, each ``ok``, ``note`` or ``risk``. A ``risk`` is a
setting under which a record can be lost, and a lost record lets a tool run again:

Redis (one short-lived client of its own, never the application's connections)

- ``maxmemory-policy``: with a ``maxmemory`` limit, ``allkeys-*`` evicts any key and
  ``volatile-*`` evicts keys with a TTL — every record carries one — so both can delete
  live leases and stored results. Only ``noeviction`` keeps them (a full server then
  refuses writes, and tools fail closed).
- persistence: no AOF means a restart loses what was written since the last RDB snapshot
  (everything, when snapshots are off); AOF with ``appendfsync everysec`` can lose about
  a second.
- replication: no replica means losing the host loses the records; with replicas,
  replication is asynchronous and a failover can drop the most recent records (unless the
  store waits for them: ``replicas=``). A replica itself refuses writes.
- latency: the median of ``pings`` round trips; a first run costs two, a replay one.

SQLite: the file (its path, size, journal mode, the store's ``synchronous`` setting, the
number of live records); a non-WAL journal, ``synchronous=NORMAL`` (the last commits
before a power loss can roll back) and a directory the process cannot write to are
reported. The file is opened read-only and never created.

Memory: records live inside one process; any other process, this one included, sees an
empty store.
"""

from __future__ import annotations

import os
import sqlite3
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import redis

from .stores.base import BaseIdempotencyStore

__all__ = ["Finding", "Level", "Report", "diagnose", "redis_client", "store_kind", "store_time_ms"]

Level = Literal["ok", "note", "risk"]
StoreKind = Literal["redis", "sqlite", "memory"]


@dataclass(frozen=True, slots=True)
class Finding:
    level: Level
    topic: str
    message: str


@dataclass(slots=True)
class Report:
    kind: StoreKind
    facts: dict[str, Any] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)

    def add(self, level: Level, topic: str, message: str) -> None:
        self.findings.append(Finding(level, topic, message))

    @property
    def risks(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "risk"]


def store_kind(url: str) -> StoreKind:
    """``redis``, ``sqlite`` or ``memory``, from the URL scheme (as ``store_from_url``)."""
    scheme = url.split(":", 1)[0].lower()
    if scheme in ("redis", "rediss", "unix"):
        return "redis"
    if scheme == "sqlite":
        return "sqlite"
    if scheme == "memory":
        return "memory"
    raise ValueError(
        f"unsupported store URL {url!r}: use redis://, rediss://, unix://, sqlite:///path "
        "or memory://"
    )


def redis_client(url: str) -> redis.Redis:
    """A client for operator commands: short timeouts, no retries, strings decoded."""
    return redis.Redis.from_url(
        url, socket_timeout=5.0, socket_connect_timeout=2.0, decode_responses=True
    )


def store_time_ms(url: str) -> int:
    """The store's clock in milliseconds: Redis ``TIME`` for Redis, the host clock otherwise."""
    if store_kind(url) != "redis":
        return int(time.time() * 1000)
    client = redis_client(url)
    try:
        seconds, micros = client.time()
    finally:
        client.close()
    return int(seconds) * 1000 + int(micros) // 1000


def sqlite_file(store: BaseIdempotencyStore) -> str:
    """The database file of a SQLite store (absolute path)."""
    from .stores.sqlite import SqliteIdempotencyStore

    assert isinstance(store, SqliteIdempotencyStore)
    return store._path


def diagnose(url: str, store: BaseIdempotencyStore, *, pings: int = 10) -> Report:
    """Connect to the store at ``url`` and report on it. Raises when it cannot connect."""
    kind = store_kind(url)
    if kind == "redis":
        return _diagnose_redis(url, pings)
    if kind == "sqlite":
        return _diagnose_sqlite(store)
    report = Report("memory", {"scope": "this process"})
    report.add(
        "risk",
        "scope",
        "memory:// keeps records inside one Python process: other processes (this CLI "
        "included) see an empty store, and a restart loses every record. Use sqlite:/// "
        "for the processes of one host, redis:// for many hosts",
    )
    return report


# -- Redis ------------------------------------------------------------------------------


def _diagnose_redis(url: str, pings: int) -> Report:
    client = redis_client(url)
    try:
        latencies = []
        for _ in range(max(1, pings)):
            start = time.perf_counter()
            client.ping()
            latencies.append((time.perf_counter() - start) * 1000)
        info: Mapping[str, Any] = client.info()
        config = {
            name: _config_get(client, name)
            for name in ("appendfsync", "save", "min-replicas-to-write")
        }
    finally:
        client.close()

    report = Report("redis")
    facts = report.facts
    facts["version"] = str(info.get("redis_version", "?"))
    facts["mode"] = str(info.get("redis_mode", "standalone"))
    facts["latency_ms"] = {
        "median": round(statistics.median(latencies), 3),
        "max": round(max(latencies), 3),
        "pings": len(latencies),
    }
    _eviction(report, info)
    _persistence(report, info, config)
    _replication(report, info, config)
    median = facts["latency_ms"]["median"]
    if median > 5:
        report.add(
            "note",
            "latency",
            f"median round trip {median:.1f} ms: a first run costs two, a replay one",
        )
    else:
        report.add("ok", "latency", f"median round trip {median:.2f} ms")
    return report


def _config_get(client: redis.Redis, name: str) -> str | None:
    """``CONFIG GET name``, or ``None`` where ``CONFIG`` is refused (managed services)."""
    try:
        reply: Any = client.config_get(name)
    except redis.ResponseError:
        return None
    value = reply.get(name) if isinstance(reply, Mapping) else None
    return None if value is None else str(value)


def _eviction(report: Report, info: Mapping[str, Any]) -> None:
    policy = str(info.get("maxmemory_policy", "?"))
    maxmemory = int(info.get("maxmemory", 0) or 0)
    report.facts["maxmemory_policy"] = policy
    report.facts["maxmemory"] = maxmemory
    evicting = policy.startswith(("allkeys-", "volatile-"))
    if not evicting:
        report.add(
            "ok",
            "eviction",
            f"maxmemory-policy {policy}: records are never evicted (a full server refuses "
            "writes; tools fail closed)",
        )
    elif maxmemory == 0:
        report.add(
            "note",
            "eviction",
            f"maxmemory-policy {policy} with no maxmemory limit: nothing is evicted today, "
            "but once a limit is set this policy can evict records; prefer noeviction",
        )
    else:
        which = "any key" if policy.startswith("allkeys-") else "keys with a TTL"
        report.add(
            "risk",
            "eviction",
            f"maxmemory-policy {policy} evicts {which} under memory pressure; every record "
            "carries a TTL, so live leases and stored results can be evicted and the tool "
            "run again. Use noeviction",
        )


def _persistence(report: Report, info: Mapping[str, Any], config: Mapping[str, str | None]) -> None:
    aof = int(info.get("aof_enabled", 0) or 0) == 1
    save = config.get("save")
    fsync = config.get("appendfsync")
    report.facts["aof"] = aof
    report.facts["appendfsync"] = fsync
    report.facts["rdb_save"] = save
    report.facts["rdb_changes_since_last_save"] = int(
        info.get("rdb_changes_since_last_save", 0) or 0
    )
    if aof:
        if fsync == "always":
            report.add("ok", "persistence", "AOF with appendfsync always")
        elif fsync == "no":
            report.add(
                "risk",
                "persistence",
                "AOF with appendfsync no: the OS decides when records reach the disk; a "
                "crash can lose many seconds of them",
            )
        else:
            report.add(
                "note",
                "persistence",
                f"AOF with appendfsync {fsync or '?'}: a crash can lose about the last second "
                "of records",
            )
        return
    if save == "":
        report.add(
            "risk",
            "persistence",
            "no AOF and no RDB snapshots: a restart loses every record (enable appendonly)",
        )
    else:
        report.add(
            "risk",
            "persistence",
            "no AOF: a restart loses the records written since the last RDB snapshot "
            f"({report.facts['rdb_changes_since_last_save']} changes now); enable appendonly",
        )


def _replication(report: Report, info: Mapping[str, Any], config: Mapping[str, str | None]) -> None:
    role = str(info.get("role", "?"))
    replicas = int(info.get("connected_slaves", 0) or 0)
    report.facts["role"] = role
    report.facts["connected_replicas"] = replicas
    if role == "slave":
        link = info.get("master_link_status", "?")
        report.add(
            "risk",
            "replication",
            f"this server is a replica (link to master {link}): writes fail with READONLY; "
            "point the store at the master, or use Sentinel",
        )
    elif replicas == 0:
        report.add(
            "risk",
            "replication",
            "no connected replica: losing this host loses the records",
        )
    else:
        acked = config.get("min-replicas-to-write") or "0"
        report.add(
            "note",
            "replication",
            f"{replicas} replica(s); replication is asynchronous (min-replicas-to-write "
            f"{acked}), so a failover can drop the most recent records; "
            f"IDEMPOTENCY_REDIS_REPLICAS={replicas} (replicas= in code) makes each claim and "
            "completion wait for them",
        )


# -- SQLite -----------------------------------------------------------------------------


def _diagnose_sqlite(store: BaseIdempotencyStore) -> Report:
    from .stores.sqlite import SqliteIdempotencyStore

    assert isinstance(store, SqliteIdempotencyStore)
    path = sqlite_file(store)
    report = Report("sqlite", {"path": path, "synchronous": store._synchronous})
    directory = os.path.dirname(path)
    if not os.path.exists(path):
        report.facts["exists"] = False
        if os.access(directory, os.W_OK):
            report.add("note", "file", f"{path} does not exist yet; it is created on first use")
        else:
            report.add(
                "risk",
                "file",
                f"{path} does not exist and {directory} is not writable: it cannot be created",
            )
        return report
    report.facts["exists"] = True
    report.facts["size_bytes"] = sum(
        os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p)
    )
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5.0)
    try:
        journal = str(db.execute("PRAGMA journal_mode").fetchone()[0]).lower()
        has_table = db.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (store._table,)
        ).fetchone()
    finally:
        db.close()
    report.facts["journal_mode"] = journal
    report.facts["table"] = store._table
    if has_table:
        report.facts["records"] = len(store.list())
    else:
        report.facts["records"] = 0
        report.add(
            "note",
            "file",
            f"{path} has no table {store._table!r} yet: no record was ever written to it "
            "(check the path)",
        )
    if journal == "wal":
        report.add("ok", "journal", "journal_mode wal: readers do not wait for writers")
    else:
        report.add(
            "note",
            "journal",
            f"journal_mode {journal}: correct, but readers wait for writers (the store asks "
            "for WAL; a read-only directory or a network filesystem prevents it)",
        )
    if store._synchronous == "FULL":
        report.add("ok", "durability", "synchronous FULL: every commit is fsynced")
    else:
        report.add(
            "note",
            "durability",
            "synchronous NORMAL: a committed record survives any process crash, but the "
            "last commits before a power loss or OS crash can roll back (sqlite:///…"
            "?synchronous=FULL fsyncs every commit)",
        )
    if not os.access(directory, os.W_OK) or not os.access(path, os.W_OK):
        report.add(
            "risk",
            "file",
            f"{path} or its directory is not writable by this user: claims will fail",
        )
    return report
