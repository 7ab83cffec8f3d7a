"""What the PostgreSQL server behind a store says about itself: the facts ``doctor`` reads.

:func:`describe_server` runs on one of the store's pooled connections (through its error
boundary) and never creates anything: the server's version, the two settings that decide
whether a committed record survives a crash (``fsync``, ``synchronous_commit``), whether
the table and its schema version exist, and, when the table does, its rows, the expired
rows not yet purged and its size. No password is ever part of the answer.
"""

from __future__ import annotations

from typing import Any

import psycopg

from ._pools import _redact
from ._sql import SCHEMA_VERSION, _Queries

__all__ = ["describe_server"]


def describe_server(cur: psycopg.Cursor[Any], q: _Queries, conninfo: str | None) -> dict[str, Any]:
    info = cur.connection.info
    cur.execute(q.probe_tables)
    row = cur.fetchone()
    server_version, fsync, synchronous_commit, has_schema, has_table = row  # type: ignore[misc]
    schema_version = records = expired = size = None
    if has_schema:
        cur.execute(q.read_version, (q.table,))
        row = cur.fetchone()
        schema_version = row[0] if row else None
    if has_table:
        cur.execute(q.table_facts)
        records, expired, size = cur.fetchone()  # type: ignore[misc]
    return {
        "kind": "postgres",
        "url": _redact(conninfo),
        "host": info.host,
        "port": info.port,
        "database": info.dbname,
        "user": info.user,
        "server_version": server_version,
        "fsync": fsync,
        "synchronous_commit": synchronous_commit,
        "table": q.table,
        "has_table": bool(has_table),
        "schema_version": schema_version,
        "expected_schema_version": SCHEMA_VERSION,
        "records": records,
        "expired_records": expired,
        "size_bytes": size,
    }
