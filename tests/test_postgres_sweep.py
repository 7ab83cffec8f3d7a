"""The PostgreSQL claim's sweep of expired rows reads only expired rows, however many live
ones the table holds: it finds them by a range scan of the ``expires_at`` index (it used
to compare with the volatile clock and walk the whole index, on every 64th claim).

Counted with the server's own statistics (index tuples read), not timed."""

from __future__ import annotations

import time

import psycopg

from langchain_idempotent.core.store import ClaimRequest
from langchain_idempotent.stores.postgres import PostgresIdempotencyStore
from tests.support.postgres_fixtures import pg_server, pg_table, pg_url

__all__ = ["pg_server", "pg_table", "pg_url"]  # fixtures used by this module

LIVE = 5000
SWEEP_EVERY = 64


def _rows_read(conn: psycopg.Connection[tuple[object, ...]], table: str) -> int:
    """Rows the server read from ``table`` so far: by sequential scans and through indexes."""
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) "
        "FROM pg_stat_user_tables WHERE relname = %s",
        (table,),
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_sweep_reads_the_expired_rows_not_the_whole_table(pg_url: str, pg_table: str) -> None:
    seeding = PostgresIdempotencyStore.from_url(pg_url, table=pg_table)
    seeding.setup()
    seeding.claim(ClaimRequest("seed", "o", "fp", lease_ms=1000, ttl_ms=86_400_000))
    seeding.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        # LIVE live rows (a day to go) and 10 expired ones: copies of the store's own row.
        columns = [
            r[0]
            for r in conn.execute(
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_name = %s AND column_name NOT IN ('key', 'expires_at')",
                (pg_table,),
            )
        ]
        rest = ", ".join(columns)
        for n, expires in ((LIVE, "expires_at"), (10, "0")):
            conn.execute(
                f"INSERT INTO {pg_table} (key, expires_at, {rest}) "
                f"SELECT 'k' || %s || '-' || g, {expires}, {rest} FROM {pg_table}, "
                "generate_series(1, %s) g WHERE key = 'seed'",
                (expires, n),
            )
        conn.execute(f"ANALYZE {pg_table}")
        before = _rows_read(conn, pg_table)
        store = PostgresIdempotencyStore.from_url(pg_url, table=pg_table)
        for i in range(SWEEP_EVERY):  # one of them sweeps
            store.claim(ClaimRequest(f"new-{i}", "o", "fp", lease_ms=1000, ttl_ms=60_000))
        store.close()  # its sessions end: their statistics reach the shared counts
        expired = conn.execute(f"SELECT count(*) FROM {pg_table} WHERE expires_at = 0").fetchone()
        assert expired == (0,)  # the sweep ran and took the expired rows
        time.sleep(0.5)
        read = _rows_read(conn, pg_table) - before
    # 64 claims of absent keys and one sweep of 10 rows: far fewer than LIVE.
    assert read < LIVE // 10, f"{SWEEP_EVERY} claims read {read} of {LIVE + 10} rows"
