"""What a newcomer's first CLI commands do: look without writing, find what code configured.

``doctor``, ``ls`` and ``show`` pointed at a mistyped table, key prefix or file say so, exit
non-zero and create nothing (counted on the server before and after); the options an
application sets in code (``table=``, ``prefix=``, ``namespace=``) can be given to every
command; ``show`` takes a unique key prefix and prints hints that can be pasted as they are.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import psycopg
import pytest

from langchain_idempotent import Policy
from langchain_idempotent.cli import main
from langchain_idempotent.core.engine import Engine
from langchain_idempotent.core.store import ClaimRequest
from langchain_idempotent.settings import store_from_url
from langchain_idempotent.stores.postgres import PostgresIdempotencyStore
from langchain_idempotent.stores.redis import RedisIdempotencyStore
from tests.support.postgres_fixtures import pg_server, pg_table, pg_url
from tests.support.redis_servers import RedisServer

__all__ = ["pg_server", "pg_table", "pg_url"]  # fixtures used by this module

ENV = ("IDEMPOTENCY_STORE_URL", "IDEMPOTENCY_REDIS_URL", "REDIS_URL", "IDEMPOTENCY_SQLITE_PATH")
READ_ONLY = (["doctor", "--pings", "1"], ["ls"], ["show", "somekey"])


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*ENV, "IDEMPOTENCY_REDIS_PREFIX"):
        monkeypatch.delenv(name, raising=False)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def database_objects(url: str) -> int:
    """Tables, indexes, sequences and functions in the database's public schema."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM pg_class WHERE relnamespace = 'public'::regnamespace)"
            " + (SELECT count(*) FROM pg_proc WHERE pronamespace = 'public'::regnamespace)"
        ).fetchone()
    assert row is not None
    return int(row[0])


def completed(store: object, key: str, value: object, *, namespace: str = "default") -> None:
    engine = Engine(store, Policy(lease=5, ttl=3600, namespace=namespace))  # type: ignore[arg-type]
    meta = {"namespace": namespace, "thread_id": "t1", "tool": "refund"}
    engine.run(key, fingerprint=f"fp-{key}", action=lambda: value, tool="refund", meta=meta)


# -- read-only: a missing table, key prefix or file --------------------------------------


def test_doctor_ls_and_show_on_a_mistyped_table_say_so_exit_1_and_create_nothing(
    pg_url: str, pg_table: str, capsys: pytest.CaptureFixture[str]
) -> None:
    real = PostgresIdempotencyStore.from_url(pg_url, table=pg_table)
    completed(real, "somekey", 1)
    real.close()
    before = database_objects(pg_url)
    assert before >= 5  # the real table, its indexes and functions: the count can see them
    typo = f"{pg_table}_zz"
    for argv in READ_ONLY:
        code, _, err = run(capsys, *argv, "--url", f"{pg_url}?table={typo}")
        assert code == 1, (argv, err)
        assert f"no table '{typo}'" in err and "--table" in err, argv
        assert pg_table in err  # the tables that do exist are named
    assert database_objects(pg_url) == before


def test_a_read_only_command_on_a_fresh_database_creates_no_table(
    pg_url: str, pg_table: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = database_objects(pg_url)
    for argv in READ_ONLY:
        code, _, _ = run(capsys, *argv, "--url", f"{pg_url}?table={pg_table}")
        assert code == 1, argv
    assert database_objects(pg_url) == before


def test_doctor_ls_and_show_under_a_mistyped_key_prefix_say_so_exit_1_and_write_nothing(
    redis_server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    real = RedisIdempotencyStore.from_url(redis_server.url, prefix="app:")
    completed(real, "somekey", 1)
    real.close()
    client = redis_server.client()
    before = sorted(client.keys("*"))
    assert before  # the real record
    for argv in READ_ONLY:
        code, _, err = run(capsys, *argv, "--url", redis_server.url, "--prefix", "apq:")
        assert code == 1, (argv, err)
        assert "no records under the key prefix 'apq:'" in err and "--prefix" in err, argv
    assert sorted(client.keys("*")) == before
    code, out, _ = run(capsys, "ls", "--url", redis_server.url, "--prefix", "app:")
    assert code == 0 and "1 record(s)" in out


def test_doctor_ls_and_show_on_a_missing_sqlite_file_exit_1_and_create_no_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "typo.db"
    for argv in READ_ONLY:
        code, _, err = run(capsys, *argv, "--url", f"sqlite:///{missing}")
        assert code == 1 and "no SQLite database at" in err, argv
    assert not missing.exists()


# -- what the code configured, given to the CLI ------------------------------------------


def test_the_table_set_in_code_is_found_by_table_option_and_percent_encoded_url(
    pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    table = f"ho3_{uuid.uuid4().hex[:8]}"
    store = PostgresIdempotencyStore.from_url(pg_url, table=table)
    completed(store, "k1", 1)
    store.close()
    encoded = table.replace("_", "%5F")
    for extra in (["--url", f"{pg_url}?table={encoded}"], ["--url", pg_url, "--table", table]):
        code, out, err = run(capsys, "ls", *extra)
        assert (code, out.splitlines()[-1]) == (0, "1 record(s)"), err
    code, _, err = run(capsys, "ls", "--url", pg_url)  # the default table is not it
    assert code == 1 and "no table 'idempotency_records'" in err and table in err


def test_ls_filters_by_the_namespace_set_in_code(
    redis_server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = f"ns-{uuid.uuid4().hex[:6]}:"
    store = RedisIdempotencyStore.from_url(redis_server.url, prefix=prefix)
    completed(store, "a", 1, namespace="tenant-a")
    completed(store, "b", 2, namespace="tenant-b")
    store.close()
    code, out, _ = run(
        capsys, "ls", "--url", redis_server.url, "--prefix", prefix, "--namespace", "tenant-b"
    )
    assert code == 0 and "1 record(s)" in out and "\nb " in out


# -- show: a key prefix, and hints that can be pasted ------------------------------------


def test_show_takes_a_unique_key_prefix_and_refuses_an_ambiguous_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'idem.db'}"
    store = store_from_url(url)
    completed(store, "abc123", "first")
    completed(store, "abd456", "second")
    store.close()
    code, out, err = run(capsys, "show", "abc", "--url", url)
    assert code == 0 and "key:         abc123" in out and "first" in out, err
    code, _, err = run(capsys, "show", "ab", "--url", url)
    assert code == 1 and "2 records have keys starting 'ab'" in err
    assert "abc123" in err and "abd456" in err
    code, _, err = run(capsys, "show", "zz", "--url", url)
    assert code == 1 and "no record under key 'zz'" in err


def test_shows_hint_to_resolve_names_the_url_and_options_it_was_given(
    redis_server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = f"h-{uuid.uuid4().hex[:6]}:"
    store = RedisIdempotencyStore.from_url(redis_server.url, prefix=prefix)
    store.claim(ClaimRequest("crashed", owner="w", fingerprint="fp", lease_ms=1, ttl_ms=3_600_000))
    store.close()
    code, out, err = run(capsys, "show", "crash", "--url", redis_server.url, "--prefix", prefix)
    assert code == 0, err
    hint = (
        f"langchain-idempotent resolve crashed --result JSON --url {redis_server.url} "
        f"--prefix {prefix}"
    )
    assert hint in out
    # and the hint runs as printed
    argv = hint.split()[1:]
    argv[argv.index("JSON")] = '"done"'
    code, out, err = run(capsys, *argv, "--yes")
    assert code == 0 and "stored the result for crashed" in out, err
