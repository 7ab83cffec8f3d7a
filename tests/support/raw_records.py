"""Read and write a record's stored payload behind a store's back, the way each store
keeps it: memory's dict, SQLite's and PostgreSQL's ``payload`` column, Redis's ``payload``
hash fields (one, or pieces ``payload``, ``payload:2``, ...). For tests that plant or tamper
with records."""

from __future__ import annotations

import dataclasses
import sqlite3
from typing import Any

from langchain_idempotent.core.store import BaseIdempotencyStore

__all__ = ["get_payload", "set_payload"]


def get_payload(store: BaseIdempotencyStore, key: str) -> bytes:
    kind = type(store).__name__
    if kind == "InMemoryIdempotencyStore":
        rec, _ = store._records[key]  # type: ignore[attr-defined]
        assert rec.payload is not None
        return bytes(rec.payload)
    if kind == "SqliteIdempotencyStore":
        with sqlite3.connect(store.path) as db:  # type: ignore[attr-defined]
            row = db.execute(
                f"SELECT payload FROM {store.table} WHERE key = ?",  # type: ignore[attr-defined]
                (key,),
            ).fetchone()
        return bytes(row[0])
    if kind == "RedisIdempotencyStore":
        from langchain_idempotent.stores.redis._scripts import _payload

        client: Any = store._sync()  # type: ignore[attr-defined]
        return bytes(_payload(client.hgetall(store._rkey(key))) or b"")  # type: ignore[attr-defined]
    if kind == "PostgresIdempotencyStore":
        return bytes(_pg(store, f"SELECT payload FROM {store._table} WHERE key = %s", key)[0])  # type: ignore[attr-defined]
    raise TypeError(kind)


def set_payload(store: BaseIdempotencyStore, key: str, payload: bytes) -> None:
    kind = type(store).__name__
    if kind == "InMemoryIdempotencyStore":
        records = store._records  # type: ignore[attr-defined]
        rec, expires = records[key]
        records[key] = (dataclasses.replace(rec, payload=payload), expires)
    elif kind == "SqliteIdempotencyStore":
        with sqlite3.connect(store.path) as db:  # type: ignore[attr-defined]
            db.execute(
                f"UPDATE {store.table} SET payload = ? WHERE key = ?",  # type: ignore[attr-defined]
                (payload, key),
            )
    elif kind == "RedisIdempotencyStore":
        client: Any = store._sync()  # type: ignore[attr-defined]
        name = store._rkey(key)  # type: ignore[attr-defined]
        pieces = [f for f in client.hkeys(name) if f.startswith(b"payload:")]
        if pieces:
            client.hdel(name, *pieces)
        client.hset(name, "payload", payload)
    elif kind == "PostgresIdempotencyStore":
        table = store._table  # type: ignore[attr-defined]
        _pg(store, f"UPDATE {table} SET payload = %s WHERE key = %s RETURNING key", payload, key)
    else:
        raise TypeError(kind)


def _pg(store: BaseIdempotencyStore, sql: str, *params: Any) -> Any:
    import psycopg

    with psycopg.connect(store._conninfo, autocommit=True) as conn:  # type: ignore[attr-defined]
        return conn.execute(sql, params).fetchone()
