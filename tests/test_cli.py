"""The operator CLI, end to end against a throwaway Redis and a SQLite file.

Each test seeds records through the library (``Engine``, or a raw ``claim`` by a "crashed"
owner), runs ``main([...])`` in-process and checks its output, its exit status and the
store afterwards. One test runs the console entry as a real subprocess.
"""

from __future__ import annotations

import json
import os
import pickle
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from langchain_core.messages import ToolMessage

from langchain_idempotent import Engine, Policy, get_idempotency_context, store_from_url
from langchain_idempotent.cli import main
from langchain_idempotent.record import State
from langchain_idempotent.stores.base import BaseIdempotencyStore
from tests.support.redis_servers import RedisServer, free_port, redis_server_available

needs_redis = pytest.mark.skipif(not redis_server_available(), reason="redis-server not on PATH")
BACKENDS = [pytest.param("redis", marks=[needs_redis, pytest.mark.redis]), "sqlite"]
ENV = ("IDEMPOTENCY_STORE_URL", "IDEMPOTENCY_REDIS_URL", "REDIS_URL", "IDEMPOTENCY_SQLITE_PATH")


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
            key,
            owner="crashed-worker",
            fingerprint=f"fp-{key}",
            lease_ms=lease_ms,
            ttl_ms=3_600_000,
            meta=_meta(thread, namespace),
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
        claim = store.claim(key, owner="o", fingerprint="f", lease_ms=5000, ttl_ms=60_000)
        store.complete(
            key,
            owner="o",
            fence=claim.fence,
            fingerprint="f",
            payload=payload,
            failed=False,
            ttl_ms=60_000,
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
    code, _, err = run(capsys, "delete", "nope", "--yes", "--url", backend.url)
    assert code == 1
    assert "no record under key 'nope'" in err


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
    code, _, err = run(capsys, "ls", "--url", "postgres://db/x")
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
        code, out, _ = run(capsys, "doctor", "--url", server.url, "--pings", "3")
        assert code == 0
        facts = dict(line.split(":", 1) for line in out.split("\n\n")[0].splitlines())
        assert facts["maxmemory policy"].strip() == "allkeys-lru"
        assert facts["version"].strip()
        assert "[RISK] eviction: maxmemory-policy allkeys-lru evicts any key" in out
        assert "[RISK] persistence: no AOF and no RDB snapshots" in out
        assert "[RISK] replication: no connected replica" in out
        assert "3 risk(s) to records" in out

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
    code, out, _ = run(capsys, "doctor", "--url", f"sqlite:///{missing}")
    assert code == 0 and "does not exist yet" in out
    assert not missing.exists()


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
