"""What the PostgreSQL server behind a store says about itself: the facts ``doctor`` reads.

:func:`describe_op` is the store operation (see :class:`._pools.Op`) that reads them on one
of the store's pooled connections, through its error translation, and never creates anything:
the server's version, the two settings that decide whether a committed record survives a
crash (``fsync``, ``synchronous_commit``), whether the table and its schema version exist
(and which tables ``setup()`` made in this database),
and, when the table does, its rows, the expired rows not yet purged and its size. No
password is ever part of the answer.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from ._pools import CONN_INFO, Op, Stmt, _redact
from ._sql import SCHEMA_VERSION, _Queries

__all__ = ["describe_op"]


def describe_op(q: _Queries, conninfo: str | None) -> Op[dict[str, Any]]:
    def steps() -> Generator[Any, Any, dict[str, Any]]:
        info = yield CONN_INFO
        server_version, fsync, synchronous_commit, has_schema, has_table = yield Stmt(
            q.probe_tables
        )
        schema_version = records = expired = size = None
        tables: list[str] = []
        if has_schema:
            row = yield Stmt(q.read_version, (q.table,))
            schema_version = row[0] if row else None
            tables = [name for (name,) in (yield Stmt(q.known_tables, fetch="all"))]
        if has_table:
            records, expired, size = yield Stmt(q.table_facts)
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
            "tables_set_up": tables,
            "schema_version": schema_version,
            "expected_schema_version": SCHEMA_VERSION,
            "records": records,
            "expired_records": expired,
            "size_bytes": size,
        }

    return Op(steps)
