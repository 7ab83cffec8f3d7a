"""One maintenance write for ``langchain-idempotent rotate``: replace a done record's payload,
compare-and-set.

:func:`replace_payload` writes the new payload only while the record under the key is
still completed or failed, unexpired, and holds the expected payload byte for byte; it
changes nothing else (state, owner, fence, expiry). A record that changed meanwhile (a
concurrent rotation, a delete, a purge, an expiry and a new call) is left as it is and the
answer is ``False``. It is not part of the store protocol (the engine never rewrites a done
record: completion is write-once); each built-in store does it in its own atomic step:
memory under its lock, SQLite in one ``BEGIN IMMEDIATE`` transaction, PostgreSQL in one
``UPDATE ... WHERE payload = expected``, Redis in one Lua script (``_RESEAL`` in
:mod:`.redis._scripts`, which knows how a payload is stored there).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..core.store import BaseIdempotencyStore
from .redis._scripts import _RESEAL_SCRIPT, _VERSION

__all__ = ["replace_payload"]


def replace_payload(
    store: BaseIdempotencyStore, key: str, *, expected: bytes, payload: bytes
) -> bool:
    """Whether ``payload`` replaced ``expected`` in the done record under ``key``."""
    kind = type(store).__name__
    if kind == "InMemoryIdempotencyStore":
        return _memory(store, key, expected, payload)
    if kind == "SqliteIdempotencyStore":
        return _sqlite(store, key, expected, payload)
    if kind == "RedisIdempotencyStore":
        client: Any = store._sync()  # type: ignore[attr-defined]
        rkey = store._rkey(key)  # type: ignore[attr-defined]
        return bool(client.eval(_RESEAL_SCRIPT.source, 1, rkey, expected, payload, _VERSION))
    if kind == "PostgresIdempotencyStore":
        return _postgres(store, key, expected, payload)
    raise TypeError(
        f"rewriting records in place is built for the memory, SQLite, Redis and PostgreSQL "
        f"stores, not {kind}"
    )


def _memory(store: Any, key: str, expected: bytes, payload: bytes) -> bool:
    with store._lock:
        entry = store._records.get(key)
        if entry is None:
            return False
        rec, expires = entry
        if not rec.done or rec.payload != expected or expires <= store.now_ms():
            return False
        store._records[key] = (dataclasses.replace(rec, payload=payload), expires)
        return True


def _sqlite(store: Any, key: str, expected: bytes, payload: bytes) -> bool:
    def body(db: Any, now: int) -> bool:
        cursor = db.execute(
            f"UPDATE {store.table} SET payload = ? WHERE key = ? AND payload = ? "
            "AND state IN ('completed', 'failed') AND expires_at > ?",
            (payload, key, expected, now),
        )
        return bool(cursor.rowcount)

    return bool(store._in_write_txn(key, body))


def _postgres(store: Any, key: str, expected: bytes, payload: bytes) -> bool:
    from .postgres._pools import Stmt, single
    from .postgres._sql import _NOW

    query = (
        f"UPDATE {store._table} SET payload = %s WHERE key = %s AND payload = %s "
        f"AND state IN ('completed', 'failed') AND expires_at > {_NOW} RETURNING 1"
    )
    op = single(Stmt(query, (payload, key, expected)), lambda row: row is not None)
    return bool(store._run(key, op))
