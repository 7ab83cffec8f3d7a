"""The operator CLI, end to end against a throwaway Redis, PostgreSQL and a SQLite file.

Each test seeds records through the library (``Engine``, or a raw ``claim`` by a "crashed"
owner), runs ``main([...])`` in-process and checks its output, its exit status and the
store afterwards. One test runs the console entry as a real subprocess.
"""

from __future__ import annotations

import json
import os
import pickle
import shlex
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from langchain_core.messages import ToolMessage

from langchain_idempotent import Policy, get_idempotency_context
from langchain_idempotent.cli import URL_HELP, main
from langchain_idempotent.cli.doctor import diagnose
from langchain_idempotent.core.engine import Engine
from langchain_idempotent.core.record import State
from langchain_idempotent.core.store import BaseIdempotencyStore, ClaimRequest, CompleteRequest
from langchain_idempotent.errors import StoreUnavailableError
from langchain_idempotent.settings import store_from_url
from langchain_idempotent.stores._url import SCHEMES, parse_store_url
from langchain_idempotent.stores.memory import InMemoryIdempotencyStore
from langchain_idempotent.stores.postgres._sql import SCHEMA_VERSION
from langchain_idempotent.stores.redis import RedisIdempotencyStore
from langchain_idempotent.stores.sqlite import SqliteIdempotencyStore
from tests.support.postgres_fixtures import pg_server, pg_table, pg_url
from tests.support.postgres_server import PostgresServer
from tests.support.redis_servers import (
    RedisCluster,
    RedisServer,
    free_port,
    redis_server_available,
)

needs_redis = pytest.mark.skipif(not redis_server_available(), reason="redis-server not on PATH")
BACKENDS = [pytest.param("redis", marks=[needs_redis, pytest.mark.redis]), "sqlite", "postgres"]
ENV = ("IDEMPOTENCY_STORE_URL", "IDEMPOTENCY_REDIS_URL", "REDIS_URL", "IDEMPOTENCY_SQLITE_PATH")

__all__ = ["pg_server", "pg_table", "pg_url"]  # fixtures used by this module


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)


@dataclass
class Backend:
    url: str
    store: BaseIdempotencyStore
    prefix: str = ""

    def corrupt(self, key: str) -> None:
        """Give the record under ``key`` a format version no reader knows."""
        if self.url.startswith("redis"):
            client = redis.Redis.from_url(self.url)
            client.hset(f"{self.prefix}{{{key}}}", "version", "99")
            client.close()
        elif self.url.startswith("postgres"):
            table = self.url.rpartition("table=")[2]
            with psycopg.connect(self.url.partition("?")[0], autocommit=True) as conn:
                conn.execute(f"UPDATE {table} SET version = 99 WHERE key = %s", (key,))
        else:
            db = sqlite3.connect(self.url.removeprefix("sqlite:///"))
            with db:
                db.execute("UPDATE idempotency_records SET version = 99 WHERE key = ?", (key,))
            db.close()

    def completed(self, key: str, value: Any, *, thread: str, namespace: str = "default") -> None:
        engine = Engine(self.store, Policy(lease=5, ttl=3600, namespace=namespace))
        engine.run(
            key,
            fingerprint=f"fp-{key}",
            action=lambda: value,
            tool="issue_refund",
            meta=_meta(thread, namespace),
        )

    def running(self, key: str, *, thread: str, lease_ms: int, namespace: str = "default") -> None:
        self.store.claim(
            ClaimRequest(
                key,
                owner="crashed-worker",
                fingerprint=f"fp-{key}",
                lease_ms=lease_ms,
                ttl_ms=3_600_000,
                meta=_meta(thread, namespace),
            )
        )

    def expired(self, key: str, *, thread: str, namespace: str = "default") -> None:
        self.running(key, thread=thread, lease_ms=1, namespace=namespace)
        time.sleep(0.01)

    def engine(self) -> Engine:
        return Engine(self.store, Policy(lease=5, ttl=3600))


def _meta(thread: str, namespace: str) -> dict[str, str]:
    return {
        "namespace": namespace,
        "thread_id": thread,
        "tool": "issue_refund",
        "node": "tools",
        "graph_path": "",
    }


@pytest.fixture(params=BACKENDS)
def backend(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Backend]:
    if request.param == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")  # tests/conftest.py
        prefix = f"cli-{uuid.uuid4().hex[:8]}:"  # each test sees only its own records
        monkeypatch.setenv("IDEMPOTENCY_REDIS_PREFIX", prefix)
        url = server.url
        store = store_from_url(url, redis_prefix=prefix)
    elif request.param == "postgres":
        prefix = ""  # each test has its own table
        url = f"{request.getfixturevalue('pg_url')}?table={request.getfixturevalue('pg_table')}"
        store = store_from_url(url)
    else:
        prefix = ""
        url = f"sqlite:///{tmp_path / 'idem.db'}"
        store = store_from_url(url)
        store.list()  # creates the file, as an application's first call would
    yield Backend(url, store, prefix)
    store.close()


class _Terminal:
    """A stand-in for a terminal on standard input that types ``answer``."""

    closed = False

    def __init__(self, answer: str) -> None:
        self.answer = answer
        self.asked = False

    def isatty(self) -> bool:
        return True

    def readline(self) -> str:
        self.asked = True
        return self.answer + "\n"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# -- ls -----------------------------------------------------------------------------------


def test_ls_shows_state_age_attempt_fence_tool_and_thread(
    backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    backend.completed("k-done", "refund r_1 issued", thread="t1")
    backend.running("k-live", thread="t2", lease_ms=60_000)
    backend.expired("k-lost", thread="t2")

    code, out, _ = run(capsys, "ls", "--url", backend.url)

    assert code == 0
    lines = {line.split()[0]: line for line in out.splitlines()[1:-1]}
    assert out.splitlines()[0].split() == [
        "KEY",
        "STATE",
        "AGE",
        "ATTEMPT",
        "FENCE",
        "TOOL",
        "THREAD",
    ]
    assert lines["k-done"].split() == ["k-done", "completed", "0s", "1", "1", "issue_refund", "t1"]
    assert lines["k-live"].split()[1] == "running"
    assert "running (expired)" in lines["k-lost"]
    assert out.splitlines()[-1] == "3 record(s)"


def test_ls_filters_by_namespace_and_thread_and_prints_json(
    backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    backend.completed("a", 1, thread="t1")
    backend.completed("b", 2, thread="t2")
    backend.completed("c", 3, thread="t1", namespace="tenant-b")
    backend.expired("d", thread="t1")

    code, out, _ = run(capsys, "ls", "--url", backend.url, "--thread", "t1", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["count"] == 3
    assert {r["key"]: r["status"] for r in doc["records"]} == {
        "a": "completed",
        "c": "completed",
        "d": "outcome_unknown",
    }

    code, out, _ = run(
        capsys, "ls", "--url", backend.url, "--thread", "t1", "--namespace", "tenant-b", "--json"
    )
    assert [r["key"] for r in json.loads(out)["records"]] == ["c"]

    code, out, _ = run(capsys, "ls", "--url", backend.url, "--thread", "nobody")
    assert (code, out.strip()) == (0, "no records")


# -- show ---------------------------------------------------------------------------------


def test_show_prints_every_field_and_the_decoded_result(
    backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    backend.completed(
        "k", ToolMessage(content="refund r_9 issued", tool_call_id="call_1"), thread="t1"
    )

    code, out, _ = run(capsys, "show", "k", "--url", backend.url)
    assert code == 0
    for field in ("key:", "state:", "thread:", "tool:", "attempt:", "fence:", "fingerprint:"):
        assert field in out
    assert "result (ToolMessage):" in out
    assert "refund r_9 issued" in out

    code, out, _ = run(capsys, "show", "k", "--url", backend.url, "--json")
    doc = json.loads(out)
    assert (doc["state"], doc["fence"], doc["attempt"]) == ("completed", 1, 1)
    assert doc["result"]["content"] == "refund r_9 issued"
    assert doc["result"]["tool_call_id"] == "call_1"


def test_show_explains_a_record_whose_outcome_is_unknown(
    backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    backend.expired("k", thread="t1")
    code, out, _ = run(capsys, "show", "k", "--url", backend.url)
    assert code == 0
    assert "running (expired)" in out
    assert "lease:       expired" in out
    assert "resolve k --result JSON" in out


def test_show_reports_a_payload_it_cannot_decode_and_never_unpickles_it(
    backend: Backend, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self) -> tuple[Any, ...]:
            return (Path.touch, (marker,))

    store = backend.store
    for key, payload in (
        ("pickled", b"pickle\n" + pickle.dumps(Exploit())),
        ("garbled", b"msgpack\n\xc1\xff\x00"),
    ):
        claim = store.claim(
            ClaimRequest(key, owner="o", fingerprint="f", lease_ms=5000, ttl_ms=60_000)
        )
        store.complete(
            CompleteRequest(
                key,
                owner="o",
                fence=claim.fence,
                fingerprint="f",
                payload=payload,
                failed=False,
                ttl_ms=60_000,
            )
        )
        code, out, _ = run(capsys, "show", key, "--url", backend.url)
        assert code == 1
        assert "payload cannot be decoded (it was not executed)" in out
        code, out, _ = run(capsys, "show", key, "--url", backend.url, "--json")
        assert code == 1
        assert "payload_error" in json.loads(out)
    assert not marker.exists()


def test_a_record_that_cannot_be_read_is_reported_not_used(
    backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    backend.expired("k", thread="t1")
    backend.corrupt("k")
    for argv in (["show", "k"], ["resolve", "k", "--free", "--yes"]):
        code, _, err = run(capsys, *argv, "--url", backend.url)
        assert code == 1
        assert err.startswith("langchain-idempotent: corrupt record:")


def test_show_of_an_absent_key_exits_1(
    backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    backend.completed("other", 1, thread="t1")
    code, _, err = run(capsys, "show", "nope", "--url", backend.url)
    assert code == 1
    assert "no record under key 'nope'" in err


# -- delete -------------------------------------------------------------------------------


def test_delete_removes_one_record_and_leaves_the_rest(
    backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    backend.completed("a", 1, thread="t1")
    backend.completed("b", 2, thread="t1")
    code, out, _ = run(capsys, "delete", "a", "--yes", "--url", backend.url)
    assert code == 0 and "deleted record a" in out
    assert backend.store.get("a") is None and backend.store.get("b") is not None


def test_delete_removes_a_record_nothing_else_can_read(
    backend: Backend, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    backend.expired("k", thread="t1")
    backend.corrupt("k")
    yes = _Terminal("y")
    monkeypatch.setattr(sys, "stdin", yes)
    code, _, err = run(capsys, "delete", "k", "--url", backend.url)
    assert yes.asked and code == 0
    assert "(unreadable:" in err  # the question says what is being deleted
    backend.completed("other", 1, thread="t1")
    code, _, err = run(capsys, "show", "k", "--url", backend.url)
    assert code == 1 and "no record under key 'k'" in err


def test_delete_asks_warns_about_a_live_lease_and_obeys_no(
    backend: Backend, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    backend.running("k", thread="t1", lease_ms=60_000)
    no = _Terminal("n")
    monkeypatch.setattr(sys, "stdin", no)
    code, _, err = run(capsys, "delete", "k", "--url", backend.url)
    assert no.asked and code == 1
    assert "holds a live lease" in err and "aborted: nothing was changed" in err
    assert backend.store.get("k") is not None
    monkeypatch.setattr(sys, "stdin", open(os.devnull))  # noqa: SIM115 - closed by pytest
    code, _, err = run(capsys, "delete", "k", "--url", backend.url)
    assert code == 1 and "add --yes" in err
    assert backend.store.get("k") is not None


def test_delete_of_an_absent_key_exits_1(
    backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    backend.completed("other", 1, thread="t1")
    code, _, err = run(capsys, "delete", "nope", "--yes", "--url", backend.url)
    assert code == 1
    assert "no record under key 'nope'" in err


def test_delete_takes_the_key_prefix_show_takes_and_deletes_that_record_only(
    backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    backend.completed("refund-a1b2c3d4", 1, thread="t1")
    backend.completed("refund-ffff0000", 2, thread="t1")
    code, out, _ = run(capsys, "show", "refund-a1", "--url", backend.url)
    assert code == 0 and "refund-a1b2c3d4" in out
    code, out, _ = run(capsys, "delete", "refund-a1", "--yes", "--url", backend.url)
    assert code == 0 and "deleted record refund-a1b2c3d4" in out
    assert backend.store.get("refund-a1b2c3d4") is None
    assert backend.store.get("refund-ffff0000") is not None
    # A prefix of two keys deletes neither and names both.
    backend.completed("refund-a1b2eeee", 3, thread="t1")
    backend.completed("refund-a1b2ffff", 4, thread="t1")
    code, _, err = run(capsys, "delete", "refund-a1b2", "--yes", "--url", backend.url)
    assert code == 1 and "2 records have keys starting 'refund-a1b2'" in err
    assert "refund-a1b2eeee" in err and "give more of the key" in err
    assert backend.store.get("refund-a1b2eeee") is not None


def test_a_key_no_record_has_says_what_was_looked_for_and_how_to_list_them(
    backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    backend.completed("other", 1, thread="t1")
    for command in (["show", "nope"], ["delete", "nope", "--yes"]):
        code, _, err = run(capsys, *command, "--url", backend.url)
        assert code == 1
        assert "nor one whose key starts with it" in err, err
        assert f"`{shlex.join(['langchain-idempotent', 'ls', '--url', backend.url])}`" in err


# -- purge --------------------------------------------------------------------------------


def test_purge_refuses_without_a_terminal_or_yes_and_deletes_nothing(
    backend: Backend, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    backend.completed("a", 1, thread="t1")
    monkeypatch.setattr(sys, "stdin", open(os.devnull))  # noqa: SIM115 - closed by pytest
    code, _, err = run(capsys, "purge", "--thread", "t1", "--url", backend.url)
    assert code == 1
    assert "not confirmed: standard input is not a terminal; add --yes" in err
    assert backend.store.get("a") is not None


def test_purge_with_yes_deletes_only_that_threads_records(
    backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    backend.completed("a", 1, thread="t1")
    backend.expired("b", thread="t1")
    backend.completed("c", 3, thread="t2")
    backend.completed("d", 4, thread="t1", namespace="tenant-b")

    code, out, _ = run(
        capsys, "purge", "--thread", "t1", "--namespace", "default", "--yes", "--url", backend.url
    )
    assert code == 0
    assert "deleted 2 record(s)" in out
    assert [backend.store.get(k) is None for k in "abcd"] == [True, True, False, False]


def test_purge_asks_on_a_terminal_and_obeys_the_answer(
    backend: Backend, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    backend.completed("a", 1, thread="t1")
    backend.running("b", thread="t1", lease_ms=60_000)

    no = _Terminal("n")
    monkeypatch.setattr(sys, "stdin", no)
    code, _, err = run(capsys, "purge", "--thread", "t1", "--url", backend.url)
    assert no.asked and code == 1
    assert "1 of them hold a live lease" in err
    assert "aborted: nothing was changed" in err
    assert backend.store.get("a") is not None

    yes = _Terminal("y")
    monkeypatch.setattr(sys, "stdin", yes)
    code, _, _ = run(capsys, "purge", "--thread", "t1", "--url", backend.url)
    assert yes.asked and code == 0
    assert backend.store.get("a") is None and backend.store.get("b") is None


# -- resolve ------------------------------------------------------------------------------


def test_resolve_stores_a_result_that_the_next_call_replays(
    backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    backend.expired("k", thread="t1")
    code, out, _ = run(
        capsys, "resolve", "k", "--result", '{"refund_id": "r_7"}', "--yes", "--url", backend.url
    )
    assert code == 0, out
    assert "stored the result" in out

    ran: list[int] = []
    result = backend.engine().run(
        "k", fingerprint="fp-k", action=lambda: ran.append(1) or {"refund_id": "again"}
    )
    assert result == {"refund_id": "r_7"}
    assert ran == []

    code, out, _ = run(capsys, "resolve", "k", "--text", "x", "--yes", "--url", backend.url)
    assert code == 1  # completed now: nothing to resolve


def test_resolve_free_lets_the_next_call_run_with_a_higher_fence(
    backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    backend.expired("k", thread="t1")
    code, _, _ = run(capsys, "resolve", "k", "--free", "--yes", "--url", backend.url)
    assert code == 0
    rec = backend.store.get("k")
    assert rec is not None and rec.state is State.FREE

    def action() -> str:
        ctx = get_idempotency_context()
        assert ctx is not None
        return f"fence {ctx.fence} attempt {ctx.attempt}"

    assert backend.engine().run("k", fingerprint="fp-k", action=action) == "fence 2 attempt 2"


def test_resolve_refuses_absent_completed_and_live_records_unless_forced(
    backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    backend.completed("done", "ok", thread="t1")
    backend.running("live", thread="t1", lease_ms=60_000)

    code, _, err = run(capsys, "resolve", "absent", "--free", "--yes", "--url", backend.url)
    assert code == 1 and "no record under key 'absent'" in err
    code, _, err = run(capsys, "resolve", "done", "--free", "--yes", "--url", backend.url)
    assert code == 1 and "already completed" in err
    code, _, err = run(capsys, "resolve", "live", "--text", "t", "--yes", "--url", backend.url)
    assert code == 1 and "live lease" in err and "--force" in err
    rec = backend.store.get("live")
    assert rec is not None and rec.state is State.RUNNING

    code, _, _ = run(
        capsys, "resolve", "live", "--text", "t", "--force", "--yes", "--url", backend.url
    )
    assert code == 0
    assert backend.engine().run("live", fingerprint="fp-live", action=lambda: "rerun") == "t"


def test_resolve_asks_first_and_changes_nothing_when_not_confirmed(
    backend: Backend, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    backend.expired("k", thread="t1")
    monkeypatch.setattr(sys, "stdin", _Terminal("no"))
    code, _, err = run(capsys, "resolve", "k", "--free", "--url", backend.url)
    assert code == 1 and "aborted" in err
    monkeypatch.setattr(sys, "stdin", open(os.devnull))  # noqa: SIM115 - closed by pytest
    code, _, err = run(capsys, "resolve", "k", "--text", "x", "--url", backend.url)
    assert code == 1 and "add --yes" in err
    rec = backend.store.get("k")
    assert rec is not None and rec.state is State.RUNNING and rec.owner == "crashed-worker"


def test_resolve_rejects_a_result_that_is_not_json(
    backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    backend.expired("k", thread="t1")
    code, _, err = run(
        capsys, "resolve", "k", "--result", "not json", "--yes", "--url", backend.url
    )
    assert code == 2
    assert "--result must be JSON" in err and "--text" in err


# -- arguments and URLs -------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["frobnicate"],
        ["ls", "--bogus"],
        ["ls", "--limit", "0"],
        ["purge"],
        ["purge", "--thread", ""],
        ["resolve", "k"],
        ["resolve", "k", "--free", "--text", "x"],
        ["doctor", "--pings", "many"],
    ],
)
def test_bad_arguments_exit_2_with_a_usage_message(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, *argv, "--url", "memory://") if argv else run(capsys)
    assert code == 2
    assert "usage: langchain-idempotent" in err


def test_a_missing_or_unsupported_url_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "ls")
    assert code == 2 and "pass --url" in err and "IDEMPOTENCY_STORE_URL" in err
    code, _, err = run(capsys, "ls", "--url", "mongodb://db/x")
    assert code == 2 and "unsupported store URL" in err


def test_the_url_defaults_to_the_environment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'env.db'}"
    Backend(url, store_from_url(url)).completed("k", 1, thread="t1")
    monkeypatch.setenv("IDEMPOTENCY_STORE_URL", url)
    assert run(capsys, "ls")[1].splitlines()[-1] == "1 record(s)"
    monkeypatch.delenv("IDEMPOTENCY_STORE_URL")
    monkeypatch.setenv("IDEMPOTENCY_SQLITE_PATH", str(tmp_path / "env.db"))
    assert run(capsys, "ls")[1].splitlines()[-1] == "1 record(s)"


def test_a_sqlite_url_naming_no_file_is_refused_and_no_file_is_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "typo.db"
    code, _, err = run(capsys, "ls", "--url", f"sqlite:///{path}")
    assert code == 1 and "no SQLite database at" in err
    assert not path.exists()


@needs_redis
def test_an_unreachable_redis_exits_1_without_printing_the_password(
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = f"redis://:hunter2@127.0.0.1:{free_port()}/0"
    for argv in (["ls"], ["doctor"]):
        code, out, err = run(capsys, *argv, "--url", url)
        assert code == 1
        assert "cannot use the store at redis://:***@127.0.0.1" in err
        assert "hunter2" not in out + err


# -- doctor -------------------------------------------------------------------------------


@needs_redis
def test_doctor_reports_a_default_redis_as_at_risk(capsys: pytest.CaptureFixture[str]) -> None:
    with RedisServer(maxmemory="50mb", maxmemory_policy="allkeys-lru") as server:
        code, out, err = run(capsys, "doctor", "--url", server.url, "--pings", "3")
        assert code == 1  # reported, and the empty key prefix said too
        assert "no records under the key prefix 'idem:'" in err
        facts = dict(line.split(":", 1) for line in out.split("\n\n")[0].splitlines())
        assert facts["maxmemory policy"].strip() == "allkeys-lru"
        assert facts["version"].strip()
        assert "[RISK] eviction: maxmemory-policy allkeys-lru evicts any key" in out
        assert "[RISK] persistence: no AOF and no RDB snapshots" in out
        assert "[RISK] replication: no connected replica" in out
        assert "3 risk(s) seen, but no records here to check (exit status 1)" in out

        code, out, _ = run(capsys, "doctor", "--url", server.url, "--json", "--strict")
        assert code == 3
        doc = json.loads(out)
        assert doc["facts"]["version"].split(".")[0].isdigit()
        assert doc["facts"]["latency_ms"]["pings"] == 10
        assert doc["facts"]["role"] == "master" and doc["facts"]["aof"] is False
        assert {f["topic"] for f in doc["findings"] if f["level"] == "risk"} == {
            "eviction",
            "persistence",
            "replication",
        }

        server.client().config_set("maxmemory-policy", "volatile-lru")
        code, out, _ = run(capsys, "doctor", "--url", server.url, "--json")
        assert any("keys with a TTL" in f["message"] for f in json.loads(out)["findings"])


@needs_redis
def test_doctor_finds_no_risk_on_a_replicated_aof_noeviction_redis(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with (
        RedisServer(appendonly="yes", appendfsync="always") as primary,
        RedisServer(replicaof=f"127.0.0.1 {primary.port}") as replica,
    ):
        deadline = time.monotonic() + 10
        while primary.client().info("replication")["connected_slaves"] < 1:
            assert time.monotonic() < deadline, "the replica did not connect"
            time.sleep(0.05)
        store_from_url(primary.url).claim(
            ClaimRequest("k", owner="o", fingerprint="fp", lease_ms=60_000, ttl_ms=3_600_000)
        )
        code, out, _ = run(capsys, "doctor", "--url", primary.url, "--strict", "--json")
        assert code == 0, out
        doc = json.loads(out)
        assert doc["facts"]["connected_replicas"] == 1
        assert doc["facts"]["aof"] is True and doc["facts"]["appendfsync"] == "always"
        assert [f["level"] for f in doc["findings"]].count("risk") == 0
        assert any(  # and it says how to make the store wait for the replica
            "IDEMPOTENCY_REDIS_REPLICAS=1" in f["message"] for f in doc["findings"]
        )

        code, out, _ = run(capsys, "doctor", "--url", replica.url, "--json")
        assert any(
            f["level"] == "risk" and "is a replica" in f["message"]
            for f in json.loads(out)["findings"]
        )


def test_doctor_reports_a_sqlite_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "idem.db"
    url = f"sqlite:///{path}"
    backend = Backend(url, store_from_url(url))
    backend.completed("a", 1, thread="t1")
    backend.completed("b", 2, thread="t1")

    code, out, _ = run(capsys, "doctor", "--url", url, "--json", "--strict")
    assert code == 0
    facts = json.loads(out)["facts"]
    assert facts["path"] == str(path)
    assert facts["journal_mode"] == "wal"
    assert facts["synchronous"] == "NORMAL"
    assert facts["records"] == 2
    assert facts["size_bytes"] > 0

    missing = tmp_path / "missing.db"
    code, out, err = run(capsys, "doctor", "--url", f"sqlite:///{missing}")
    assert code == 1 and "does not exist yet" in out and "no SQLite database at" in err
    assert not missing.exists()
    # The verdict agrees with the exit status: it does not end on "no risk found" alone.
    assert out.rstrip().splitlines()[-1] == (
        "no risk(s) seen, but no records here to check (exit status 1)"
    )
    code, out, _ = run(capsys, "doctor", "--url", f"sqlite:///{missing}", "--json")
    assert code == 1 and "no SQLite database at" in json.loads(out)["nothing_there"]


def test_doctor_reports_postgres_durability_settings_table_and_expired_rows(
    pg_server: PostgresServer | None, pg_url: str, pg_table: str, capsys: pytest.CaptureFixture[str]
) -> None:
    if pg_server is None:
        pytest.skip("needs the throwaway cluster (fsync and synchronous_commit off)")
    url = f"{pg_url}?table={pg_table}"
    code, out, err = run(capsys, "doctor", "--url", url, "--pings", "3")
    assert code == 1 and f"no table '{pg_table}'" in err
    facts = dict(line.split(":", 1) for line in out.split("\n\n")[0].splitlines())
    assert facts["server version"].strip().split(".")[0].isdigit()
    assert facts["fsync"].strip() == "off" and facts["synchronous commit"].strip() == "off"
    assert "[RISK] durability: fsync off" in out
    assert "[RISK] commit: synchronous_commit off" in out
    assert f"[NOTE] table: no table '{pg_table}':" in out
    assert "2 risk(s) seen, but no records here to check (exit status 1)" in out

    store = store_from_url(url)
    backend = Backend(url, store)
    backend.completed("a", 1, thread="t1")
    with psycopg.connect(pg_url, autocommit=True) as conn:  # a pile of expired rows
        conn.execute(
            f"INSERT INTO {pg_table} (key, state, owner, fence, lease_until, fingerprint, "
            "attempt, created_at, updated_at, version, meta, expires_at) SELECT 'old-' || i, "
            "'completed', 'w', 1, 0, 'fp', 1, 0, 0, 1, '{}', 1 FROM generate_series(1, 1200) i"
        )
    store.close()
    code, out, _ = run(capsys, "doctor", "--url", url, "--json", "--strict")
    assert code == 3
    doc = json.loads(out)
    assert doc["facts"]["table"] == pg_table and doc["facts"]["records"] == 1201
    assert doc["facts"]["expired_records"] == 1200
    assert doc["facts"]["schema_version"] == SCHEMA_VERSION
    assert doc["facts"]["latency_ms"]["pings"] == 10
    notes = {f["topic"]: f["message"] for f in doc["findings"] if f["level"] == "note"}
    assert notes["retention"].startswith(f"1200 of the 1201 rows of '{pg_table}' expired")
    assert {f["topic"] for f in doc["findings"] if f["level"] == "risk"} == {
        "durability",
        "commit",
    }

    # The settings are the ones the store's own sessions commit with.
    code, out, _ = run(
        capsys, "doctor", "--url", url + "&options=-c%20synchronous_commit%3Don", "--json"
    )
    doc = json.loads(out)
    assert doc["facts"]["synchronous_commit"] == "on"
    assert {f["topic"]: f["level"] for f in doc["findings"]}["commit"] == "ok"


def test_doctor_says_the_memory_store_is_per_process(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "doctor", "--url", "memory://", "--strict")
    assert code == 3
    assert "keeps records inside one Python process" in out


# -- the console entry --------------------------------------------------------------------


def test_the_console_entry_runs_as_a_separate_process(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'idem.db'}"
    Backend(url, store_from_url(url)).completed("k", "refund r_1 issued", thread="t1")
    shown = subprocess.run(
        [sys.executable, "-m", "langchain_idempotent", "show", "k", "--url", url],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env={k: v for k, v in os.environ.items() if k not in ENV},
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    assert "state:       completed" in shown.stdout
    assert "refund r_1 issued" in shown.stdout


# -- every URL scheme, every command ------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("redis://127.0.0.1:6379/0", "redis"),
        ("rediss://127.0.0.1:6380/0", "redis"),
        ("unix:///tmp/redis.sock", "redis"),
        ("redis+cluster://127.0.0.1:7000", "redis"),
        ("REDISS+CLUSTER://127.0.0.1:7000", "redis"),
        ("sqlite:///idem.db", "sqlite"),
        ("postgresql://user@127.0.0.1:5432/db", "postgres"),
        ("postgres://user@127.0.0.1:5432/db?table=idem", "postgres"),
        ("memory://", "memory"),
    ],
)
def test_one_parser_names_the_kind_of_every_accepted_url(url: str, kind: str) -> None:
    assert parse_store_url(url).kind == kind


@pytest.mark.parametrize("url", ["mysql://db/x", "mongodb://h/db", "idem.db", ""])
def test_an_unsupported_url_is_refused_naming_every_accepted_scheme(url: str) -> None:
    with pytest.raises(ValueError, match="unsupported store URL") as raised:
        parse_store_url(url)
    for scheme in SCHEMES:
        assert f"{scheme}:/" in str(raised.value)
    with pytest.raises(ValueError, match="unsupported store URL"):
        store_from_url(url)


def test_the_url_help_names_every_scheme_the_parser_accepts() -> None:
    for scheme in SCHEMES:
        assert f"{scheme}://" in URL_HELP


def seed(store: BaseIdempotencyStore) -> None:
    """One record whose owner crashed (lease passed, no result) under key ``k``, thread t1."""
    Backend("", store).expired("k", thread="t1")


def run_every_command(capsys: pytest.CaptureFixture[str], url: str, store: Any) -> None:
    """Each of the six commands against ``url``, on a record seeded through ``store``."""
    seed(store)
    code, out, err = run(capsys, "ls", "--url", url)
    assert (code, out.splitlines()[-1]) == (0, "1 record(s)"), err
    assert "running (expired)" in out
    code, out, err = run(capsys, "show", "k", "--url", url)
    assert code == 0 and "resolve k --result JSON" in out, err
    code, out, err = run(capsys, "doctor", "--url", url, "--pings", "2", "--json")
    assert code == 0, err
    assert json.loads(out)["kind"] == parse_store_url(url).kind
    code, out, err = run(capsys, "resolve", "k", "--free", "--yes", "--url", url)
    assert code == 0 and "freed k" in out, err
    code, out, err = run(capsys, "delete", "k", "--yes", "--url", url)
    assert code == 0 and "deleted record k" in out, err
    seed(store)
    code, out, err = run(capsys, "purge", "--thread", "t1", "--yes", "--url", url)
    assert code == 0 and "deleted 1 record(s)" in out, err
    assert store.get("k") is None


def test_every_command_works_on_a_sqlite_url(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'idem.db'}"
    store = store_from_url(url)
    run_every_command(capsys, url, store)


@pytest.mark.parametrize("scheme", ["postgresql", "postgres"])
def test_every_command_works_on_a_postgresql_url(
    pg_url: str, pg_table: str, scheme: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"{scheme}://{pg_url.partition('://')[2]}?table={pg_table}"
    store = store_from_url(url)
    run_every_command(capsys, url, store)
    store.close()


@needs_redis
def test_every_command_works_on_a_redis_url(
    redis_server: RedisServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = f"cli-{uuid.uuid4().hex[:8]}:"
    monkeypatch.setenv("IDEMPOTENCY_REDIS_PREFIX", prefix)
    store = store_from_url(redis_server.url, redis_prefix=prefix)
    run_every_command(capsys, redis_server.url, store)
    store.close()


@needs_redis
def test_every_command_works_on_a_unix_socket_url(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = Path(tempfile.mkdtemp(prefix="idem-sock-"))  # short: a socket path <= 107
    sock = directory / "redis.sock"
    try:
        with RedisServer(unixsocket=str(sock), unixsocketperm="700"):
            url = f"unix://{sock}"
            store = store_from_url(url)
            run_every_command(capsys, url, store)
            store.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def tls_server() -> Iterator[tuple[RedisServer, str]]:
    """A standalone Redis with a TLS port (self-signed certificate), and its rediss:// URL."""
    if not redis_server_available() or shutil.which("openssl") is None:
        pytest.skip("redis-server or openssl is not on PATH")
    directory = Path(tempfile.mkdtemp(prefix="idem-tls-"))
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    port = free_port()
    try:
        server = RedisServer(
            tls_port=str(port),
            tls_cert_file=str(cert),
            tls_key_file=str(key),
            tls_ca_cert_file=str(cert),
            tls_auth_clients="no",
        )
    except RuntimeError as exc:  # a redis-server built without TLS
        shutil.rmtree(directory, ignore_errors=True)
        pytest.skip(f"redis-server cannot serve TLS: {exc}")
    url = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={cert}&ssl_check_hostname=false"
    yield server, url
    server.close()
    shutil.rmtree(directory, ignore_errors=True)


def test_every_command_works_on_a_rediss_url(
    tls_server: tuple[RedisServer, str], capsys: pytest.CaptureFixture[str]
) -> None:
    _, url = tls_server
    store = store_from_url(url)
    run_every_command(capsys, url, store)
    assert store.describe()["servers"][0]["address"].endswith(url.split(":")[2].split("/")[0])
    store.close()


@pytest.mark.parametrize(
    "argv",
    [
        ["ls"],
        ["show", "k"],
        ["purge", "--thread", "t", "--yes"],
        ["delete", "k", "--yes"],
        ["resolve", "k", "--free", "--yes"],
        ["doctor"],
    ],
)
def test_every_command_takes_a_rediss_cluster_url_to_a_cluster_client(
    argv: list[str], tls_server: tuple[RedisServer, str], capsys: pytest.CaptureFixture[str]
) -> None:
    # A TLS Cluster is not stood up here: the plain server answers the Cluster client that
    # rediss+cluster:// builds (over TLS) that it is no cluster. The URL was accepted.
    url = tls_server[1].replace("rediss://", "rediss+cluster://")
    code, _, err = run(capsys, *argv, "--url", url)
    assert code == 1, err
    assert "cannot use the store at rediss+cluster://" in err
    assert "cluster" in err.lower().split("rediss+cluster://", 1)[1]


def test_every_command_takes_a_memory_url_and_sees_an_empty_store(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run(capsys, "ls", "--url", "memory://")
    assert (code, out.strip()) == (0, "no records") and "new, empty store" in err
    for argv in (["show", "k"], ["delete", "k", "--yes"], ["resolve", "k", "--free", "--yes"]):
        code, _, err = run(capsys, *argv, "--url", "memory://")
        assert code == 1 and "no record under key 'k'" in err
    code, out, _ = run(capsys, "purge", "--thread", "t1", "--yes", "--url", "memory://")
    assert code == 0 and "no records for thread 't1'" in out
    code, out, _ = run(capsys, "doctor", "--url", "memory://", "--json")
    assert code == 0 and json.loads(out)["facts"] == {"scope": "this process", "records": 0}


@pytest.fixture(scope="module")
def small_cluster() -> Iterator[RedisCluster]:
    """Three primaries, no replicas (enough for one entry per primary)."""
    if not redis_server_available():
        pytest.skip("redis-server is not on PATH")
    with RedisCluster(masters=3, replicas=0) as cluster:
        yield cluster


def test_every_command_works_on_a_redis_cluster_url(
    small_cluster: RedisCluster, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = f"cli-{uuid.uuid4().hex[:8]}:"
    monkeypatch.setenv("IDEMPOTENCY_REDIS_PREFIX", prefix)
    url = small_cluster.url.replace("redis://", "redis+cluster://")
    store = store_from_url(url, redis_prefix=prefix)
    run_every_command(capsys, url, store)

    backend = Backend(url, store, prefix)
    for i in range(12):  # spread over the three primaries
        backend.completed(f"k{i}", i, thread="t1")
    code, out, _ = run(capsys, "ls", "--url", url)
    assert (code, out.splitlines()[-1]) == (0, "12 record(s)")

    code, out, _ = run(capsys, "doctor", "--url", url, "--json")
    assert code == 0, out
    facts = json.loads(out)["facts"]
    primaries = sorted(f"127.0.0.1:{n.port}" for n in small_cluster.nodes)
    assert facts["topology"] == "cluster"
    assert sorted(facts["servers"]) == primaries
    assert all(server["mode"] == "cluster" for server in facts["servers"].values())
    findings = json.loads(out)["findings"]
    for address in primaries:  # each primary is checked: no replica, no AOF
        assert any(
            f["topic"] == "replication" and f["message"].startswith(address) for f in findings
        )
    code, out, _ = run(capsys, "doctor", "--url", url)
    assert code == 0 and "topology:" in out and "servers:" in out
    store.close()


# -- doctor, through the store's describe() -----------------------------------------------

INFO_FIELDS = {
    "redis_version",
    "redis_mode",
    "role",
    "connected_slaves",
    "master_link_status",
    "maxmemory",
    "maxmemory_policy",
    "aof_enabled",
    "rdb_changes_since_last_save",
}
CONFIG_FIELDS = {"appendfsync", "save", "min-replicas-to-write"}


def test_the_memory_store_describes_its_records() -> None:
    store = InMemoryIdempotencyStore()
    assert store.describe() == {"kind": "memory", "records": 0}
    seed(store)
    assert store.describe() == {"kind": "memory", "records": 1}
    report = diagnose(store)
    assert report.kind == "memory" and report.facts["records"] == 1
    assert [f.topic for f in report.risks] == ["scope"]


def test_the_sqlite_store_describes_its_file_without_creating_it(tmp_path: Path) -> None:
    missing = SqliteIdempotencyStore(tmp_path / "missing.db", synchronous="FULL")
    facts = missing.describe()
    assert facts == {
        "kind": "sqlite",
        "path": str(tmp_path / "missing.db"),
        "table": "idempotency_records",
        "synchronous": "FULL",
        "exists": False,
        "journal_mode": None,
        "has_table": False,
        "size_bytes": 0,
        "records": 0,
    }
    assert not (tmp_path / "missing.db").exists()
    assert (missing.path, missing.table, missing.synchronous) == (
        str(tmp_path / "missing.db"),
        "idempotency_records",
        "FULL",
    )

    store = SqliteIdempotencyStore(tmp_path / "idem.db", table="records_v1")
    seed(store)
    facts = store.describe()
    assert (facts["exists"], facts["journal_mode"], facts["has_table"]) == (True, "wal", True)
    assert (facts["records"], facts["table"], facts["synchronous"]) == (1, "records_v1", "NORMAL")
    assert facts["size_bytes"] > 0
    report = diagnose(store)
    assert report.facts["records"] == 1 and report.risks == []


def test_a_sqlite_file_that_is_no_database_is_store_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "not.db"
    path.write_bytes(b"this is not a SQLite database, just some text" * 100)
    with pytest.raises(StoreUnavailableError, match="cannot be read"):
        SqliteIdempotencyStore(path).describe()


@needs_redis
def test_the_redis_store_describes_its_server_with_info_and_config(
    redis_server: RedisServer, redis_prefix: str
) -> None:
    store = store_from_url(redis_server.url, redis_prefix=redis_prefix)
    facts = store.describe()
    assert {k: v for k, v in facts.items() if k != "servers"} == {
        "kind": "redis",
        "topology": "standalone",
        "prefix": redis_prefix,
        "replicas": 0,
    }
    [server] = facts["servers"]
    assert set(server) == {"address", *INFO_FIELDS, *CONFIG_FIELDS}
    assert server["address"] == f"127.0.0.1:{redis_server.port}"
    assert (server["role"], server["redis_mode"], server["save"]) == ("master", "standalone", "")
    assert server["appendfsync"] in ("always", "everysec", "no")
    json.dumps(facts)  # JSON-able as it is
    report = diagnose(store, pings=3)
    assert report.facts["latency_ms"]["pings"] == 3
    assert report.facts["version"] == server["redis_version"]
    store.close()


@needs_redis
def test_doctor_works_where_config_is_refused_and_never_prints_the_password(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with RedisServer() as server:
        server.client().execute_command(
            "ACL", "SETUSER", "app", "on", ">s3cret-pw", "~*", "&*", "+@all", "-config"
        )
        url = f"redis://app:s3cret-pw@127.0.0.1:{server.port}/0"
        store = store_from_url(url)
        [facts] = store.describe()["servers"]
        assert {name: facts[name] for name in CONFIG_FIELDS} == dict.fromkeys(CONFIG_FIELDS)
        assert facts["redis_version"]  # INFO is still allowed
        store.claim(
            ClaimRequest("k", owner="o", fingerprint="fp", lease_ms=60_000, ttl_ms=3_600_000)
        )
        store.close()
        code, out, err = run(capsys, "doctor", "--url", url)
        assert code == 0, err
        assert "appendfsync:" in out and "(unknown)" in out
        assert "s3cret-pw" not in out + err and "redis://app:***@127.0.0.1" in out


@needs_redis
def test_an_unreachable_redis_fails_as_the_stores_unavailable_error() -> None:
    store = store_from_url(f"redis://127.0.0.1:{free_port()}/0")
    with pytest.raises(StoreUnavailableError):
        store.now_ms()
    with pytest.raises(StoreUnavailableError):
        store.describe()
    with pytest.raises(StoreUnavailableError):
        diagnose(store)


# -- the store's clock ----------------------------------------------------------------------


def test_every_store_must_tell_its_clock_and_describe_itself() -> None:
    assert {"now_ms", "anow_ms", "describe"} <= BaseIdempotencyStore.__abstractmethods__


@pytest.mark.parametrize("make", [InMemoryIdempotencyStore, "sqlite"])
async def test_a_stores_now_ms_is_its_injected_clock(make: Any, tmp_path: Path) -> None:
    seconds = [1_000_000.25]

    def clock() -> float:
        return seconds[0]

    if make == "sqlite":
        store: BaseIdempotencyStore = SqliteIdempotencyStore(tmp_path / "c.db", clock=clock)
    else:
        store = make(clock=clock)
    assert store.now_ms() == 1_000_000_250
    seconds[0] += 2.5
    assert store.now_ms() == await store.anow_ms() == 1_000_002_750
    store.close()


@needs_redis
async def test_the_redis_stores_now_ms_is_the_servers_time(
    redis_server: RedisServer, redis_prefix: str
) -> None:
    store = RedisIdempotencyStore.from_url(redis_server.url, prefix=redis_prefix)
    client = redis_server.client()

    def server_ms() -> int:
        seconds, micros = client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    before = server_ms()
    now, anow = store.now_ms(), await store.anow_ms()
    after = server_ms()
    assert before <= now <= anow <= after
    client.close()
    await store.aclose()


# -- a cheap --help -------------------------------------------------------------------------


def test_help_imports_nothing_outside_the_standard_library() -> None:
    probe = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "from langchain_idempotent.cli import main\n"
        "assert main(['--help']) == 0\n"
        "new = {name.split('.')[0] for name in set(sys.modules) - before}\n"
        "print(sorted(new - set(sys.stdlib_module_names) - {'langchain_idempotent'}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.splitlines()[-1] == "[]"


def test_the_cli_package_imports_form_no_circle() -> None:
    """Each command module imports what it shares from ``cli._common``, never the package
    face that imports it back (every import counts, also those inside functions)."""
    import grimp

    graph = grimp.build_graph("langchain_idempotent", cache_dir=None)
    package = "langchain_idempotent.cli"
    modules = {m for m in graph.modules if m == package or m.startswith(package + ".")}
    edges = {
        m: {n for n in graph.find_modules_directly_imported_by(m) if n in modules} for m in modules
    }
    circles = []
    for start in sorted(modules):
        for target in sorted(edges[start]):
            chain = graph.find_shortest_chain(importer=target, imported=start)
            if chain is not None and set(chain) <= modules:
                circles.append((start, *chain))
    assert circles == [], f"import circles inside cli/: {circles}"


@pytest.mark.parametrize("missing", ["psycopg", "psycopg_pool"])
def test_a_postgres_url_without_the_postgres_extra_names_the_extra(missing: str) -> None:
    """As the Python API does (``_lazy``): the CLI names the extra to install, not the
    module. The module is hidden in a fresh interpreter (``None`` in ``sys.modules``)."""
    script = (
        "import sys\n"
        f"sys.modules[{missing!r}] = None\n"
        "from langchain_idempotent.cli import main\n"
        "sys.exit(main(['ls', '--url', 'postgresql://127.0.0.1:1/app']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    assert "pip install 'langchain-idempotent[postgres]'" in done.stderr, done.stderr
    assert f"({missing} is not installed)" in done.stderr
