"""``doctor``: what a store's backend promises about records, and what in it puts them at
risk.

:func:`diagnose` asks the store itself — :meth:`~BaseIdempotencyStore.describe` for the
facts, timed :meth:`~BaseIdempotencyStore.now_ms` calls for the latency — so it sees the
backend exactly as the application does (Sentinel, Cluster, TLS, key prefix), through the
store's error translation. It returns a :class:`Report`: *facts* and *findings*, each
``ok``, ``note`` or ``risk``. A ``risk`` is a setting under which a record can be lost, and
a lost record lets a tool run again:

Redis (every server the store writes to: the master, or every Cluster primary)

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
- latency: the median of ``pings`` reads of the server clock (``TIME``), each one round
  trip; a first run costs two, a replay one.

PostgreSQL (the server the store's pool connects to, and the store's table)

- ``fsync`` off: the server does not force writes to disk; a crash of its host (power
  loss, OS crash) can lose committed records, or corrupt the cluster.
- ``synchronous_commit`` off: a commit returns before its WAL is flushed; a server crash
  can lose the most recent committed records (up to three times ``wal_writer_delay``).
- the table: absent (a note: it is created by the first operation, or by ``setup()``
  when ``auto_setup`` is off), or one this version refuses (a risk): set up by an earlier
  development build (no layout version) or by a newer release.
- expired rows piling up: at least 1,000 expired rows, as many as live ones (a note:
  they are absent to every operation, but only claims purge them, 256 at a time).
- latency: as for Redis (``SELECT`` of the server clock, one round trip).

SQLite: the file (its path, size, journal mode, the store's ``synchronous`` setting, the
number of live records); a non-WAL journal, ``synchronous=NORMAL`` (the last commits
before a power loss can roll back) and a directory the process cannot write to are
reported. The file is opened read-only and never created.

Memory: records live inside one process; any other process, this one included, sees an
empty store.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TextIO

from ._common import PROG, nothing_there, redact

if TYPE_CHECKING:
    from ..core.store import BaseIdempotencyStore

__all__ = ["Finding", "Level", "Report", "diagnose", "run"]

Level = Literal["ok", "note", "risk"]


@dataclass(frozen=True, slots=True)
class Finding:
    level: Level
    topic: str
    message: str


@dataclass(slots=True)
class Report:
    kind: str
    facts: dict[str, Any] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)

    def add(self, level: Level, topic: str, message: str) -> None:
        self.findings.append(Finding(level, topic, message))

    @property
    def risks(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "risk"]


def diagnose(store: BaseIdempotencyStore, *, pings: int = 10) -> Report:
    """Report on ``store``'s backend, from ``store.describe()`` (and, for a remote store,
    ``pings`` timed ``store.now_ms()`` calls). Raises the store's own errors
    (:class:`~langchain_idempotent.errors.StoreUnavailableError`) when it cannot reach it."""
    facts = store.describe()
    kind = str(facts["kind"])
    if kind == "redis":
        return _diagnose_redis(facts, _latency(store, pings))
    if kind == "postgres":
        return _diagnose_postgres(facts, _latency(store, pings))
    if kind == "sqlite":
        return _diagnose_sqlite(facts)
    if kind == "memory":
        report = Report("memory", {"scope": "this process", "records": facts.get("records")})
        report.add(
            "risk",
            "scope",
            "memory:// keeps records inside one Python process: other processes (this CLI "
            "included) see an empty store, and a restart loses every record. Use sqlite:/// "
            "for the processes of one host, redis:// for many hosts",
        )
        return report
    report = Report(kind, {k: v for k, v in facts.items() if k != "kind"})
    report.add("note", "checks", f"doctor has no checks for a {kind} store; facts only")
    return report


def _latency(store: BaseIdempotencyStore, pings: int) -> dict[str, Any]:
    """The median and maximum of ``pings`` timed reads of the store's clock, in ms."""
    samples = []
    for _ in range(max(1, pings)):
        start = time.perf_counter()
        store.now_ms()
        samples.append((time.perf_counter() - start) * 1000)
    return {
        "median": round(statistics.median(samples), 3),
        "max": round(max(samples), 3),
        "pings": len(samples),
    }


# -- Redis ------------------------------------------------------------------------------


def _diagnose_redis(described: Mapping[str, Any], latency: dict[str, Any]) -> Report:
    servers: list[Mapping[str, Any]] = list(described["servers"])
    topology = str(described["topology"])
    report = Report("redis", {"topology": topology, "prefix": described["prefix"]})
    several = len(servers) > 1
    for server in servers:
        where = f"{server['address']}: " if several else ""
        facts = _server_facts(server)
        if several:
            report.facts.setdefault("servers", {})[str(server["address"])] = facts
        else:
            report.facts.update(facts)
            report.facts["latency_ms"] = latency
        _eviction(report, facts, where)
        _persistence(report, facts, where)
        _replication(report, server, facts, where, topology, int(described["replicas"]))
    if several:
        report.facts["latency_ms"] = latency
    _round_trip(report, latency)
    return report


def _round_trip(report: Report, latency: Mapping[str, Any]) -> None:
    median = latency["median"]
    if median > 5:
        report.add(
            "note",
            "latency",
            f"median round trip {median:.1f} ms: a first run costs two, a replay one",
        )
    else:
        report.add("ok", "latency", f"median round trip {median:.2f} ms")


def _server_facts(server: Mapping[str, Any]) -> dict[str, Any]:
    """One server's facts, in the order and under the names the report shows them."""
    return {
        "version": str(server.get("redis_version") or "?"),
        "mode": str(server.get("redis_mode") or "standalone"),
        "maxmemory_policy": str(server.get("maxmemory_policy") or "?"),
        "maxmemory": int(server.get("maxmemory") or 0),
        "aof": int(server.get("aof_enabled") or 0) == 1,
        "appendfsync": server.get("appendfsync"),
        "rdb_save": server.get("save"),
        "rdb_changes_since_last_save": int(server.get("rdb_changes_since_last_save") or 0),
        "role": str(server.get("role") or "?"),
        "connected_replicas": int(server.get("connected_slaves") or 0),
    }


def _eviction(report: Report, facts: Mapping[str, Any], where: str) -> None:
    policy, maxmemory = facts["maxmemory_policy"], facts["maxmemory"]
    evicting = policy.startswith(("allkeys-", "volatile-"))
    if not evicting:
        report.add(
            "ok",
            "eviction",
            f"{where}maxmemory-policy {policy}: records are never evicted (a full server "
            "refuses writes; tools fail closed)",
        )
    elif maxmemory == 0:
        report.add(
            "note",
            "eviction",
            f"{where}maxmemory-policy {policy} with no maxmemory limit: nothing is evicted "
            "today, but once a limit is set this policy can evict records; prefer noeviction",
        )
    else:
        which = "any key" if policy.startswith("allkeys-") else "keys with a TTL"
        report.add(
            "risk",
            "eviction",
            f"{where}maxmemory-policy {policy} evicts {which} under memory pressure; every "
            "record carries a TTL, so live leases and stored results can be evicted and the "
            "tool run again. Use noeviction",
        )


def _persistence(report: Report, facts: Mapping[str, Any], where: str) -> None:
    fsync, save = facts["appendfsync"], facts["rdb_save"]
    if facts["aof"]:
        if fsync == "always":
            report.add("ok", "persistence", f"{where}AOF with appendfsync always")
        elif fsync == "no":
            report.add(
                "risk",
                "persistence",
                f"{where}AOF with appendfsync no: the OS decides when records reach the "
                "disk; a crash can lose many seconds of them",
            )
        else:
            report.add(
                "note",
                "persistence",
                f"{where}AOF with appendfsync {fsync or '?'}: a crash can lose about the last "
                "second of records",
            )
        return
    if save == "":
        report.add(
            "risk",
            "persistence",
            f"{where}no AOF and no RDB snapshots: a restart loses every record (enable appendonly)",
        )
    else:
        report.add(
            "risk",
            "persistence",
            f"{where}no AOF: a restart loses the records written since the last RDB snapshot "
            f"({facts['rdb_changes_since_last_save']} changes now); enable appendonly",
        )


def _replication(
    report: Report,
    server: Mapping[str, Any],
    facts: Mapping[str, Any],
    where: str,
    topology: str,
    waited_for: int,
) -> None:
    role, replicas = facts["role"], facts["connected_replicas"]
    if role == "slave":
        link = server.get("master_link_status") or "?"
        report.add(
            "risk",
            "replication",
            f"{where}this server is a replica (link to master {link}): writes fail with "
            "READONLY; point the store at the master, or use Sentinel",
        )
    elif replicas == 0:
        report.add(
            "risk",
            "replication",
            f"{where}no connected replica: losing this host loses the records",
        )
    else:
        acked = server.get("min-replicas-to-write") or "0"
        if topology == "cluster":
            advice = "(replicas= is not available on a Cluster)"
        elif waited_for:
            advice = f"the store waits for {waited_for} of them on each claim and completion"
        else:
            advice = (
                f"IDEMPOTENCY_REDIS_REPLICAS={replicas} (replicas= in code) makes each claim "
                "and completion wait for them"
            )
        report.add(
            "note",
            "replication",
            f"{where}{replicas} replica(s); replication is asynchronous (min-replicas-to-write "
            f"{acked}), so a failover can drop the most recent records; {advice}",
        )


# -- PostgreSQL --------------------------------------------------------------------------

#: Expired rows are reported as piling up from this many on (and as many as live ones).
EXPIRED_PILE = 1000


def _diagnose_postgres(described: Mapping[str, Any], latency: dict[str, Any]) -> Report:
    names = ("server_version", "host", "port", "database", "user", "fsync", "synchronous_commit")
    report = Report("postgres", {name: described[name] for name in names})
    report.facts["latency_ms"] = latency
    if described["fsync"] == "off":
        report.add(
            "risk",
            "durability",
            "fsync off: the server does not force its writes to disk; a crash of its host "
            "(power loss, OS crash) can lose committed records, or corrupt the cluster. Turn "
            "fsync on",
        )
    else:
        report.add("ok", "durability", "fsync on: committed writes are forced to disk")
    commit = described["synchronous_commit"]
    if commit == "off":
        report.add(
            "risk",
            "commit",
            "synchronous_commit off: a commit returns before its WAL reaches the disk; a "
            "server crash can lose the most recent committed records (up to three times "
            "wal_writer_delay), and the tool run again. Use on",
        )
    else:
        report.add("ok", "commit", f"synchronous_commit {commit}: a commit is flushed first")
    _postgres_table(report, described)
    _round_trip(report, latency)
    return report


def _postgres_table(report: Report, described: Mapping[str, Any]) -> None:
    table = described["table"]
    report.facts["table"] = table
    if not described["has_table"]:
        report.add(
            "note",
            "table",
            f"no table {table!r}: the application's first operation creates it (or "
            "setup(), when auto_setup is off); if records should be there, the table is "
            "table= in code: pass --table NAME or ?table=NAME",
        )
        return
    for name in ("schema_version", "records", "expired_records", "size_bytes"):
        report.facts[name] = described[name]
    version, expected = described["schema_version"], described["expected_schema_version"]
    if version is not None and version > expected:
        report.add(
            "risk",
            "schema",
            f"{table!r} is at schema version {version}, written by a newer "
            f"langchain-idempotent (this one knows {expected}) and refuses it: upgrade",
        )
    elif version != expected:
        found = "no layout version" if version is None else f"schema version {version}"
        report.add(
            "risk",
            "schema",
            f"{table!r} has {found} (this release's is {expected}): an earlier development "
            "build set it up, and the store refuses it. Drop it and set up again (its "
            "records go with it)",
        )
    expired, records = int(described["expired_records"]), int(described["records"])
    if expired >= EXPIRED_PILE and expired >= records - expired:
        report.add(
            "note",
            "retention",
            f"{expired} of the {records} rows of {table!r} expired and are not purged yet: "
            "they are absent to every operation but take space; claims purge them, 256 "
            "every 64th claim of a store object; DELETE FROM "
            f"{table} WHERE expires_at < (extract(epoch FROM clock_timestamp()) * 1000) "
            "removes them all",
        )


# -- SQLite -----------------------------------------------------------------------------


def _diagnose_sqlite(described: Mapping[str, Any]) -> Report:
    path = str(described["path"])
    table = described["table"]
    report = Report("sqlite", {"path": path, "synchronous": described["synchronous"]})
    directory = os.path.dirname(path)
    report.facts["exists"] = described["exists"]
    if not described["exists"]:
        if os.access(directory, os.W_OK):
            report.add("note", "file", f"{path} does not exist yet; it is created on first use")
        else:
            report.add(
                "risk",
                "file",
                f"{path} does not exist and {directory} is not writable: it cannot be created",
            )
        return report
    journal = described["journal_mode"]
    report.facts["size_bytes"] = described["size_bytes"]
    report.facts["journal_mode"] = journal
    report.facts["table"] = table
    report.facts["records"] = described["records"]
    if not described["has_table"]:
        report.add(
            "note",
            "file",
            f"{path} has no table {table!r} yet: no record was ever written to it (check the path)",
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
    if described["synchronous"] == "FULL":
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


# -- the command ------------------------------------------------------------------------


def run(
    args: argparse.Namespace, *, store: BaseIdempotencyStore, url: str, out: TextIO, **_: Any
) -> int:
    """``langchain-idempotent doctor``: print the report; 3 under ``--strict`` with a risk,
    else 1 when the place the URL names holds nothing (no file, table or key prefix)."""
    report = diagnose(store, pings=args.pings)
    missing = nothing_there(store)  # doctor reads only: nothing is created to look at
    if args.json:
        doc = {
            "url": redact(url),
            "kind": report.kind,
            "facts": report.facts,
            "findings": [
                {"level": f.level, "topic": f.topic, "message": f.message} for f in report.findings
            ],
            "nothing_there": missing,
        }
        print(json.dumps(doc, indent=2), file=out)
    else:
        _print_report(report, url, out, empty=missing is not None)
    if args.strict and report.risks:
        return 3
    if missing is not None:
        print(f"{PROG}: {missing}", file=sys.stderr)
        return 1
    return 0


def _print_report(report: Report, url: str, out: TextIO, *, empty: bool) -> None:
    rows = [("store", f"{report.kind} at {redact(url)}")]
    for name, value in report.facts.items():
        if name == "servers":
            rows.append(("servers", str(len(value))))
            for address, facts in value.items():
                rows.append(
                    (f"  {address}", ", ".join(f"{k} {_shown(v)}" for k, v in facts.items()))
                )
            continue
        if name == "latency_ms":
            value = (
                f"{value['median']:.2f} ms median, {value['max']:.2f} ms max "
                f"({value['pings']} pings)"
            )
        rows.append((name.replace("_", " "), _shown(value)))
    width = max(len(name) for name, _ in rows) + 2
    for name, value in rows:
        print(f"{name + ':':<{width}}{value}", file=out)
    print("", file=out)
    for finding in report.findings:
        print(f"[{finding.level.upper():>4}] {finding.topic}: {finding.message}", file=out)
    risks = len(report.risks)
    verdict = f"{risks} risk(s) to records" if risks else "no risk to records found"
    if empty:  # the exit status is 1: say why here too, not "no risk" alone
        verdict = f"{risks or 'no'} risk(s) seen, but no records here to check (exit status 1)"
    print(f"\n{verdict}", file=out)


def _shown(value: Any) -> str:
    if value == "":
        return "(empty)"
    if value is None:
        return "(unknown)"
    return str(value)
