"""The SQLite store: the shared contract, plus what only a file shared by processes shows.

Multi-process tests fork (Linux): children inherit the parent's store object, so they also
prove that inherited connections are left alone and the child opens its own.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import random
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from langchain_idempotent.core.record import ClaimOutcome, Completion, State
from langchain_idempotent.core.store import ClaimRequest, CompleteRequest, Held
from langchain_idempotent.errors import StoreUnavailableError
from langchain_idempotent.stores import SqliteIdempotencyStore
from langchain_idempotent.stores.sqlite import _store as sqlite_module
from langchain_idempotent.testing import FakeClock, StoreContractTests

LONG_MS = 60_000
TTL_MS = 3_600_000
TABLE = "idempotency_records"

fork_only = pytest.mark.skipif(
    "fork" not in mp.get_all_start_methods(), reason="needs fork() to share the store object"
)


class TestSqliteStoreContract(StoreContractTests):
    picklable = True

    @pytest.fixture
    def clock(self) -> FakeClock:
        return FakeClock(ticking=True)

    @pytest.fixture
    def store(self, tmp_path: Path, clock: FakeClock) -> Iterator[SqliteIdempotencyStore]:
        s = SqliteIdempotencyStore(tmp_path / "idem.sqlite", clock=clock)
        yield s
        s.close()

    @pytest.fixture
    def second_store(
        self, store: SqliteIdempotencyStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
    ) -> Iterator[SqliteIdempotencyStore]:
        # It never polls within a test: a waiter on it is woken by the in-process wake-up.
        monkeypatch.setattr(sqlite_module, "_FIRST_POLL", 30.0)
        s = SqliteIdempotencyStore(store.path, clock=clock, poll_interval=30.0)
        yield s
        s.close()

    @pytest.fixture
    def corruptions(self, store: SqliteIdempotencyStore) -> dict[str, Callable[[str], None]]:
        def plant(change: str) -> Callable[[str], None]:
            def write(key: str) -> None:
                with closing(raw(store.path)) as db:
                    db.execute(f"UPDATE {TABLE} SET {change} WHERE key = ?", (key,))

            return write

        return {name: plant(change) for name, change in CORRUPTIONS.items()}

    @pytest.fixture
    def newer_schema(self, store: SqliteIdempotencyStore) -> Callable[[], SqliteIdempotencyStore]:
        def mark() -> SqliteIdempotencyStore:
            with closing(raw(store.path)) as db:
                db.execute("UPDATE langchain_idempotent_layout SET version = 99")
            return SqliteIdempotencyStore(store.path)

        return mark


#: Rows the store must refuse (``SET`` clauses), planted by the contract's corrupt-record test.
CORRUPTIONS = {
    "unknown format version": "version = 99",
    "unknown state": "state = 'exploded'",
    "fence is text": "fence = 'one'",
    "payload is text": "payload = 'not a blob'",
    "meta is not json": "meta = '{not json'",
    "meta is not an object of strings": "meta = '{\"thread_id\": 7}'",
    "expiry is text": "expires_at = 'someday'",
}


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "idem.sqlite"


@pytest.fixture
def store(db_path: Path) -> Iterator[SqliteIdempotencyStore]:
    s = SqliteIdempotencyStore(db_path)
    yield s
    s.close()


def claim(store: SqliteIdempotencyStore, key: str, owner: str, **kw: Any) -> Any:
    kw.setdefault("lease_ms", LONG_MS)
    kw.setdefault("ttl_ms", TTL_MS)
    return store.claim(ClaimRequest(key, owner=owner, fingerprint="fp", **kw))


def complete(
    store: SqliteIdempotencyStore, key: str, owner: str, fence: int, payload: bytes, **kw: Any
) -> Completion:
    kw.setdefault("ttl_ms", TTL_MS)
    return store.complete(
        CompleteRequest(
            key, owner=owner, fence=fence, fingerprint="fp", payload=payload, failed=False, **kw
        )
    )


def raw(db_path: Path) -> sqlite3.Connection:
    """A plain connection to the store's file, as another program would open it."""
    return sqlite3.connect(db_path, isolation_level=None, timeout=5, check_same_thread=False)


def pragma(store: SqliteIdempotencyStore, name: str) -> Any:
    """A PRAGMA as the store's own (pooled) connection sees it."""
    with store._connection(None) as db:
        return db.execute(f"PRAGMA {name}").fetchone()[0]


# -- construction and configuration ------------------------------------------------------------


def test_constructing_a_store_touches_no_file(tmp_path: Path) -> None:
    path = tmp_path / "later.sqlite"
    SqliteIdempotencyStore(path)
    SqliteIdempotencyStore.from_url(f"sqlite:///{path}")
    assert list(tmp_path.iterdir()) == []


def test_a_file_that_cannot_be_opened_is_store_unavailable_with_the_key(tmp_path: Path) -> None:
    store = SqliteIdempotencyStore(tmp_path / "missing-dir" / "idem.sqlite")
    with pytest.raises(StoreUnavailableError) as err:
        claim(store, "k1", "a")
    assert err.value.key == "k1"
    assert isinstance(err.value.__cause__, sqlite3.OperationalError)


def test_a_file_that_is_not_a_database_is_store_unavailable(db_path: Path) -> None:
    db_path.write_bytes(b"this is not an SQLite file " * 100)
    with pytest.raises(StoreUnavailableError) as err:
        SqliteIdempotencyStore(db_path).get("k1")
    assert err.value.key == "k1"
    assert isinstance(err.value.__cause__, sqlite3.DatabaseError)


@pytest.mark.parametrize("path", [":memory:", "", "file::memory:?cache=shared"])
def test_in_memory_databases_are_refused(path: str) -> None:
    with pytest.raises(ValueError, match="InMemoryIdempotencyStore"):
        SqliteIdempotencyStore(path)


def test_from_url_follows_sqlalchemy_paths_and_reads_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    rel = SqliteIdempotencyStore.from_url(
        "sqlite:///rel%20dir.sqlite?table=other&synchronous=FULL&busy_timeout=2.5"
    )
    assert (
        repr(rel) == f"SqliteIdempotencyStore({str(tmp_path / 'rel dir.sqlite')!r}, table='other')"
    )
    claim(rel, "k", "a")
    assert pragma(rel, "synchronous") == 2  # FULL
    with closing(raw(tmp_path / "rel dir.sqlite")) as db:
        assert db.execute("SELECT key FROM other").fetchall() == [("k",)]
    absolute = SqliteIdempotencyStore.from_url(f"sqlite:///{tmp_path}/abs.sqlite", table="t2")
    assert repr(absolute) == f"SqliteIdempotencyStore({str(tmp_path / 'abs.sqlite')!r}, table='t2')"
    rel.close()


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:///:memory:",
        "sqlite://host/idem.sqlite",
        "postgres:///idem",
        "sqlite:///idem.sqlite?tabel=x",
        "sqlite:///idem.sqlite?table=bad-name",
        "sqlite:///idem.sqlite?synchronous=OFF",
    ],
)
def test_from_url_refuses_what_it_cannot_honour(url: str) -> None:
    with pytest.raises(ValueError):
        SqliteIdempotencyStore.from_url(url)


@pytest.mark.parametrize(("synchronous", "level"), [("NORMAL", 1), ("FULL", 2)])
def test_the_file_runs_in_wal_mode_at_the_chosen_synchronous_level(
    db_path: Path, synchronous: Any, level: int
) -> None:
    store = SqliteIdempotencyStore(db_path, synchronous=synchronous)
    claim(store, "k", "a")
    assert pragma(store, "journal_mode") == "wal"
    assert pragma(store, "synchronous") == level
    store.close()


def test_records_survive_closing_and_reopening_the_file(db_path: Path) -> None:
    first = SqliteIdempotencyStore(db_path)
    c = claim(first, "k", "a", meta={"namespace": "ns", "thread_id": "t"})
    complete(first, "k", "a", c.fence, b"\x00result")
    first.close()
    second = SqliteIdempotencyStore(db_path)
    replay = claim(second, "k", "b")
    assert (replay.outcome, replay.payload) == (ClaimOutcome.REPLAY, b"\x00result")
    assert [r.key for r in second.list(namespace="ns", thread_id="t")] == ["k"]
    second.close()


def test_a_closed_store_reconnects_on_next_use(store: SqliteIdempotencyStore) -> None:
    c = claim(store, "k", "a")
    store.close()
    assert store.renew(Held("k", owner="a", fence=c.fence), lease_ms=LONG_MS)
    store.close()
    assert store.get("k") is not None


def test_two_tables_in_one_file_are_independent(db_path: Path) -> None:
    a = SqliteIdempotencyStore(db_path, table="tenant_a")
    b = SqliteIdempotencyStore(db_path, table="tenant_b")
    assert claim(a, "k", "a").outcome is ClaimOutcome.ACQUIRED
    assert claim(b, "k", "b").outcome is ClaimOutcome.ACQUIRED
    assert a.get("k").owner == "a"  # type: ignore[union-attr]
    a.close()
    b.close()


def _schema_of(db_path: Path) -> list[tuple[Any, ...]]:
    with closing(raw(db_path)) as db:
        return db.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall()


def test_a_table_an_earlier_development_build_wrote_is_refused_and_left_as_it_is(
    db_path: Path,
) -> None:
    # An earlier development build's marker: its table (here the layout before the
    # side-effect mark) and a schema version in langchain_idempotent_schema, with a record.
    with closing(raw(db_path)) as db:
        db.execute(
            f"CREATE TABLE {TABLE} (key TEXT PRIMARY KEY NOT NULL, state TEXT NOT NULL, "
            "owner TEXT NOT NULL, fence INTEGER NOT NULL, lease_until INTEGER NOT NULL, "
            "fingerprint TEXT NOT NULL, attempt INTEGER NOT NULL, payload BLOB, "
            "created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL, "
            "version INTEGER NOT NULL, meta TEXT NOT NULL, namespace TEXT, thread_id TEXT, "
            "expires_at INTEGER NOT NULL)"
        )
        db.execute(
            f"INSERT INTO {TABLE} VALUES ('k', 'completed', 'a', 1, 0, 'fp', 1, x'00', "
            "1, 1, 1, '{}', NULL, NULL, 9999999999999)"
        )
        db.execute("CREATE TABLE langchain_idempotent_schema (name TEXT PRIMARY KEY, version INT)")
        db.execute(f"INSERT INTO langchain_idempotent_schema VALUES ('{TABLE}', 1)")
    before = _schema_of(db_path)
    store = SqliteIdempotencyStore(db_path)
    for attempt in (lambda: store.get("k"), lambda: claim(store, "k", "b")):
        with pytest.raises(StoreUnavailableError) as err:
            attempt()
        message = str(err.value)
        assert "schema version 1 in langchain_idempotent_schema" in message
        assert "earlier development build" in message
        assert f"DROP TABLE {TABLE}" in message and "run again" in message
    store.close()
    # Left as it was: no column added, no layout table, the record still there.
    assert _schema_of(db_path) == before
    with closing(raw(db_path)) as db:
        assert db.execute(f"SELECT key, owner FROM {TABLE}").fetchall() == [("k", "a")]
        # The way out: drop it, and the store sets the table up afresh.
        db.execute(f"DROP TABLE {TABLE}")
    fresh = SqliteIdempotencyStore(db_path)
    assert claim(fresh, "k", "b").outcome is ClaimOutcome.ACQUIRED
    fresh.close()


def test_a_fresh_file_gets_layout_1_and_setting_it_up_again_changes_nothing(
    db_path: Path,
) -> None:
    first = SqliteIdempotencyStore(db_path)
    assert claim(first, "k", "a").outcome is ClaimOutcome.ACQUIRED
    first.close()
    with closing(raw(db_path)) as db:
        rows = db.execute("SELECT name, version FROM langchain_idempotent_layout").fetchall()
    assert rows == [(TABLE, 1)]
    before = _schema_of(db_path)
    again = SqliteIdempotencyStore(db_path)
    assert claim(again, "k", "a").outcome is ClaimOutcome.OWNED
    again.close()
    assert _schema_of(db_path) == before


# -- locking -----------------------------------------------------------------------------------


def test_a_write_lock_held_past_busy_timeout_is_store_unavailable(db_path: Path) -> None:
    store = SqliteIdempotencyStore(db_path, busy_timeout=0.05)
    c = claim(store, "k", "a")
    holder = raw(db_path)
    holder.execute("BEGIN IMMEDIATE")
    try:
        started = time.monotonic()
        with pytest.raises(StoreUnavailableError) as err:
            complete(store, "k", "a", c.fence, b"r")
        assert time.monotonic() - started >= 0.04  # it waited for the lock first
        assert err.value.key == "k"
        assert isinstance(err.value.__cause__, sqlite3.OperationalError)
        assert "locked" in str(err.value.__cause__)
        # WAL: readers are not blocked by the writer.
        assert store.get("k").state is State.RUNNING  # type: ignore[union-attr]
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert complete(store, "k", "a", c.fence, b"r").stored
    store.close()


def test_a_write_lock_released_within_busy_timeout_is_waited_for(db_path: Path) -> None:
    store = SqliteIdempotencyStore(db_path, busy_timeout=5.0)
    claim(store, "warm-up", "a")
    holder = raw(db_path)
    holder.execute("BEGIN IMMEDIATE")
    timer = threading.Timer(0.15, holder.execute, args=("COMMIT",))
    timer.start()
    try:
        started = time.monotonic()
        assert claim(store, "k", "a").outcome is ClaimOutcome.ACQUIRED
        assert time.monotonic() - started >= 0.1
    finally:
        timer.join()
        holder.close()
        store.close()


# -- retention ---------------------------------------------------------------------------------


def test_an_expired_row_is_absent_everywhere_before_it_is_swept(db_path: Path) -> None:
    clock = FakeClock()
    store = SqliteIdempotencyStore(db_path, clock=clock)
    c = claim(store, "old", "a", lease_ms=1_000, ttl_ms=1_000, meta={"thread_id": "t"})
    complete(store, "old", "a", c.fence, b"r", ttl_ms=1_000)
    clock.now += 1.0
    assert store.get("old") is None
    assert store.list(thread_id="t") == []
    assert store.purge(thread_id="t") == 0
    assert not store.delete("old")
    store.close()


def test_expired_rows_are_swept_by_later_writes_a_bounded_batch_at_a_time(db_path: Path) -> None:
    clock = FakeClock()
    store = SqliteIdempotencyStore(db_path, clock=clock)
    for i in range(300):
        claim(store, f"old-{i}", "a", lease_ms=1_000, ttl_ms=1_000)
    clock.now += 2.0

    def rows() -> int:
        with closing(raw(db_path)) as db:
            return int(db.execute(f"SELECT count(*) FROM {TABLE}").fetchone()[0])

    assert rows() == 300
    for i in range(sqlite_module._SWEEP_EVERY):
        claim(store, f"new-{i}", "a")
    assert rows() == 300 - sqlite_module._SWEEP_LIMIT + sqlite_module._SWEEP_EVERY
    for i in range(sqlite_module._SWEEP_EVERY):
        claim(store, f"newer-{i}", "a")
    assert rows() == 2 * sqlite_module._SWEEP_EVERY  # only live rows are left
    store.close()


def test_an_expired_row_is_replaced_by_a_fresh_claim(db_path: Path) -> None:
    clock = FakeClock()
    store = SqliteIdempotencyStore(db_path, clock=clock)
    c = claim(store, "k", "a", ttl_ms=1_000, lease_ms=1_000)
    complete(store, "k", "a", c.fence, b"old", ttl_ms=1_000)
    clock.now += 5.0
    fresh = claim(store, "k", "b")
    assert (fresh.outcome, fresh.fence, fresh.attempt) == (ClaimOutcome.ACQUIRED, 1, 1)
    store.close()


# -- indexes -----------------------------------------------------------------------------------


def test_list_and_purge_by_thread_or_namespace_are_index_lookups(
    store: SqliteIdempotencyStore,
) -> None:
    for i in range(20):
        claim(store, f"k{i}", "a", meta={"namespace": f"n{i % 2}", "thread_id": f"t{i % 5}"})
    statements: list[str] = []
    with store._connection(None) as db:
        db.set_trace_callback(statements.append)
    store.list(thread_id="t1")
    store.list(namespace="n1")
    store.list(namespace="n1", thread_id="t1", limit=3)
    store.purge(thread_id="t2")
    store.purge(thread_id="t3", namespace="n1")
    with store._connection(None) as db:
        db.set_trace_callback(None)
        lookups = [s for s in statements if s.startswith(("SELECT", "DELETE"))]
        assert len(lookups) == 7
        for sql in lookups:
            plan = [row[-1] for row in db.execute("EXPLAIN QUERY PLAN " + sql)]
            on_table = [step for step in plan if f" {TABLE} " in f" {step} "]
            assert on_table, (sql, plan)
            assert all(step.startswith("SEARCH") and "INDEX" in step for step in on_table), (
                sql,
                plan,
            )


# -- wake-ups ----------------------------------------------------------------------------------


async def test_a_completion_in_this_process_wakes_an_async_waiter_without_polling(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_module, "_FIRST_POLL", 30.0)
    store = SqliteIdempotencyStore(db_path, poll_interval=30.0)
    c = await store.aclaim(
        ClaimRequest("k", owner="a", fingerprint="fp", lease_ms=LONG_MS, ttl_ms=TTL_MS)
    )

    async def finish() -> None:
        await asyncio.sleep(0.1)
        await store.acomplete(
            CompleteRequest(
                "k",
                owner="a",
                fence=c.fence,
                fingerprint="fp",
                payload=b"r",
                failed=False,
                ttl_ms=TTL_MS,
            )
        )

    task = asyncio.create_task(finish())
    started = time.monotonic()
    await store.awatch("k", fence=c.fence, timeout=10.0)
    waited = time.monotonic() - started
    await task
    assert 0.09 <= waited < 1.0
    store.close()


async def test_a_waiter_never_sleeps_past_the_lease_deadline_even_with_slow_polling(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_module, "_FIRST_POLL", 30.0)
    store = SqliteIdempotencyStore(db_path, poll_interval=30.0)
    for via_async in (False, True):
        key = f"k-{via_async}"
        c = claim(store, key, "a", lease_ms=150)
        started = time.monotonic()
        if via_async:
            await store.awatch(key, fence=c.fence, timeout=10.0)
        else:
            store.watch(key, fence=c.fence, timeout=10.0)
        assert 0.1 <= time.monotonic() - started < 1.0, via_async
        assert claim(store, key, "b").outcome is ClaimOutcome.TAKEOVER
    store.close()


# -- several processes -------------------------------------------------------------------------


def _race(
    store: SqliteIdempotencyStore, worker: int, keys: list[str], barrier: Any, out: Any
) -> None:
    """Claim then complete every key (in a worker-specific order), reporting each answer."""
    try:
        order = keys[:]
        random.Random(worker).shuffle(order)
        owner = f"worker-{worker}"
        barrier.wait()
        report = {}
        for key in order:
            c = claim(store, key, owner)
            done = complete(store, key, owner, c.fence or 1, f"{owner}:{key}".encode())
            report[key] = (c.outcome.value, done.stored, done.payload)
        out.put((worker, report))
    except BaseException as exc:  # report, so the parent fails with the reason
        out.put((worker, repr(exc)))


@fork_only
def test_racing_processes_acquire_each_key_once_and_all_see_one_result(db_path: Path) -> None:
    # The file does not exist yet: the workers also race to create the schema.
    store = SqliteIdempotencyStore(db_path)
    keys = [f"key-{i}" for i in range(100)]
    n = 6
    ctx = mp.get_context("fork")
    barrier, out = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(store, w, keys, barrier, out)) for w in range(n)]
    for p in procs:
        p.start()
    reports = dict(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    failures = {w: r for w, r in reports.items() if isinstance(r, str)}
    assert not failures
    for key in keys:
        answers = [reports[w][key] for w in range(n)]
        outcomes = Counter(outcome for outcome, _, _ in answers)
        assert outcomes[ClaimOutcome.ACQUIRED.value] == 1, (key, outcomes)
        assert set(outcomes) <= {"acquired", "busy", "replay"}, (key, outcomes)
        assert sum(stored for _, stored, _ in answers) == 1, key  # write-once
        payloads = {payload for _, _, payload in answers}
        assert len(payloads) == 1, (key, payloads)
        assert store.get(key).payload == payloads.pop()  # type: ignore[union-attr]
    store.close()


def _wait_in_child(
    store: SqliteIdempotencyStore, fence: int, ready: Any, out: Any, inherited_use: list[str]
) -> None:
    try:
        ready.set()
        store.watch("k", fence=fence, timeout=10.0)
        woke = time.monotonic()
        payload = claim(store, "k", "child").payload
        out.put((woke, payload, inherited_use))
    except BaseException as exc:
        out.put((0.0, repr(exc).encode(), []))


@fork_only
def test_a_waiter_in_another_process_wakes_soon_after_a_completion(
    store: SqliteIdempotencyStore, db_path: Path
) -> None:
    c = claim(store, "k", "parent")  # the parent has a pooled connection when it forks
    inherited_use: list[str] = []  # filled (in the child's copy) if the child runs SQL on it
    with store._connection(None) as db:
        db.set_trace_callback(inherited_use.append)
    ctx = mp.get_context("fork")
    ready, out = ctx.Event(), ctx.Queue()
    child = ctx.Process(target=_wait_in_child, args=(store, c.fence, ready, out, inherited_use))
    child.start()
    assert ready.wait(10)
    time.sleep(0.3)  # the child now polls at its slowest interval
    completed_at = time.monotonic()
    complete(store, "k", "parent", c.fence, b"parent result")
    woke, payload, used_in_child = out.get(timeout=10)
    child.join(timeout=10)
    assert payload == b"parent result"
    assert used_in_child == [], "the child ran SQL on a connection inherited from the parent"
    assert completed_at <= woke < completed_at + 0.5  # polls are at most 50 ms apart
    # The parent's own connections survived the child's whole life.
    assert store.get("k").payload == b"parent result"  # type: ignore[union-attr]
    assert claim(store, "k2", "parent").outcome is ClaimOutcome.ACQUIRED
    assert os.path.exists(f"{db_path}-wal")
