"""The benchmark runner's quick mode runs end to end and counts executions right.

Timings are never asserted here (they belong to ``python -m benchmarks``); what is checked
is that the run completes, writes its Markdown and JSON, and that the execution counts it
reports are the ones idempotency promises: a first run executes once per call, a replay
never, and our engine never executes a key twice under threads or processes. Where
PostgreSQL is available the run includes ``--postgres`` (its rows come from
``benchmarks/postgres.py``, run by the runner in a subprocess, DBOS included).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import langchain_idempotent
from tests.support.postgres_server import postgres_unavailable_reason

pytestmark = [
    pytest.mark.slow,  # the benchmarks, run for real: left out of the default run (pytest -m slow)
    pytest.mark.redis,
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server"),
]

ROOT = Path(__file__).resolve().parents[1]
POSTGRES = bool(os.environ.get("IDEMPOTENCY_TEST_PG_URL")) or postgres_unavailable_reason() is None


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, Any], str]:
    out = tmp_path_factory.mktemp("bench")
    command = [sys.executable, "-m", "benchmarks", "--quick", "--out", str(out), "--seed", "1"]
    if POSTGRES:
        command.append("--postgres")
        if os.environ.get("IDEMPOTENCY_TEST_PG_URL"):
            command += ["--pg-url", os.environ["IDEMPOTENCY_TEST_PG_URL"]]
    proc = subprocess.run(
        command,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=480,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    if proc.returncode != 0:
        print(proc.stdout[-5000:], proc.stderr[-5000:], sep="\n")
    report = json.loads((out / "quick.json").read_text())
    markdown = (out / "quick.md").read_text()
    return proc.returncode, report, markdown


def _latency(report: dict[str, Any], row: str, column: str) -> dict[str, Any]:
    return next(e for e in report["latency"] if e["row"] == row and e["column"] == column)


def _store_available(row: str) -> bool:
    name = {"ours_redis": "RedisIdempotencyStore", "ours_sqlite": "SqliteIdempotencyStore"}[row]
    return hasattr(langchain_idempotent, name)


def test_the_quick_run_exits_cleanly_and_writes_markdown_and_json(
    quick_run: tuple[int, dict[str, Any], str],
) -> None:
    code, report, markdown = quick_run
    assert code == 0, report["problems"]
    assert report["problems"] == []
    assert report["mode"] == "quick"
    assert report["command"].startswith("python -m benchmarks --quick")
    for field in ("nproc", "cpu_model", "redis_server", "redis_py", "python"):
        assert report["machine"][field]
    assert "## Goals" in markdown
    assert "one `r.ping()` through `redis.Redis`" in markdown
    assert {g["status"] for g in report["goals"]} <= {"met", "not met", "not measured"}


def test_the_baselines_and_every_available_store_were_measured_in_every_placement(
    quick_run: tuple[int, dict[str, Any], str],
) -> None:
    _, report, _ = quick_run
    rows = ["ping", "raw_ping", "reference", "graph_plain", "graph_floor", "ours_memory"]
    rows += [r for r in ("ours_redis", "ours_sqlite") if _store_available(r)]
    for e in report["latency"]:
        if e["row"] in rows:
            assert e["status"] == "ok", e
            assert set(e["placements"]) == set(report["placements"]), e


def test_every_first_run_executes_once_per_call_and_every_replay_never(
    quick_run: tuple[int, dict[str, Any], str],
) -> None:
    _, report, _ = quick_run
    counted = [e for e in report["latency"] if e["status"] == "ok" and "executions" in e]
    assert counted
    for e in counted:
        assert e["calls"] > 0
        assert e["executions"] == e["expected_executions"], e
    for row in ("reference", "ours_memory"):
        assert _latency(report, row, "replay")["executions"] == 0
        first = _latency(report, row, "first run")
        assert first["executions"] == first["calls"]


def test_our_engine_executes_each_key_exactly_once_under_threads_and_processes(
    quick_run: tuple[int, dict[str, Any], str],
) -> None:
    _, report, _ = quick_run
    ran = [t for t in report["throughput"] if t["impl"].startswith("ours") and t["status"] == "ok"]
    assert {t["impl"] for t in ran} >= {"ours_memory"}
    assert {(t["mode"], t["keys"]) for t in ran} >= {("threads", "distinct"), ("threads", "hot")}
    for t in ran:
        assert t["executions"] == t["key_count"], t
        assert t["duplicate_executions"] == 0, t
        assert t["keys_never_run"] == 0, t
        assert t["errors"] == {}, t
        assert t["results"] == t["calls"] > 0


def test_the_reference_approach_is_counted_honestly(
    quick_run: tuple[int, dict[str, Any], str],
) -> None:
    _, report, _ = quick_run
    ref = [t for t in report["throughput"] if t["impl"] == "reference"]
    assert ref and all(t["status"] == "ok" for t in ref)
    for t in ref:
        # Every call is answered (a result or 'Lock contention'), every key runs at least
        # once, and duplicates are exactly the executions beyond one per key.
        assert t["results"] + sum(t["errors"].values()) == t["calls"]
        assert t["keys_never_run"] == 0
        assert t["executions"] == t["key_count"] + t["duplicate_executions"]
        if t["keys"] == "distinct":
            assert t["duplicate_executions"] == 0 and t["errors"] == {}


@pytest.mark.skipif(not POSTGRES, reason="needs PostgreSQL (initdb) or IDEMPOTENCY_TEST_PG_URL")
def test_the_postgres_rows_are_measured_and_judged_in_the_same_report(
    quick_run: tuple[int, dict[str, Any], str],
) -> None:
    code, report, markdown = quick_run
    assert code == 0, report["problems"]
    postgres = report["postgres"]
    assert postgres["status"] == "ok", postgres
    medians = postgres["report"]["medians_us"]
    assert {"select1", "two_writes", "ours_replay", "ours_first", "ours_txn_first"} <= set(medians)
    assert all(m > 0 for m in medians.values())
    if importlib.util.find_spec("dbos") is not None:
        assert {"dbos_first", "dbos_replay"} <= set(medians)
    assert "## PostgreSQL" in markdown
    assert "one `SELECT 1` on the same pool" in markdown
    assert "two committed single-row writes on the same pool" in markdown
    assert postgres["report"]["ratios"]["first_vs_two_writes"] > 0
    goals = [g for g in report["goals"] if g["goal"].startswith("PostgreSQL:")]
    assert len(goals) == 3
    assert {g["status"] for g in goals} <= {"met", "not met", "not measured"}


def test_the_quick_run_is_compared_with_the_committed_baseline(
    quick_run: tuple[int, dict[str, Any], str],
) -> None:
    _, report, markdown = quick_run
    assert "## Against the committed baseline" in markdown
    assert "ratios regressed by more than 10%" in report["regressions"][0]


# -- benchmarks.scale and benchmarks.workers (tiny sizes: they run, they count right) -------


def _run_module(args: list[str], out: Path, **env: str) -> tuple[int, dict[str, Any], str]:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", *args, "--quick", "--out", str(out), "--seed", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=480,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
    )
    if proc.returncode != 0:
        print(proc.stdout[-5000:], proc.stderr[-5000:], sep="\n")
    return proc.returncode, json.loads(next(out.glob("*.json")).read_text()), proc.stderr


@pytest.fixture(scope="module")
def scale_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, Any], Path]:
    out = tmp_path_factory.mktemp("scale")
    code, report, _ = _run_module(["--scale"], out)
    return code, report, out


def test_the_scale_run_grows_every_store_and_weighs_its_records(
    scale_run: tuple[int, dict[str, Any], Path],
) -> None:
    code, report, out = scale_run
    assert code == 0 and report["problems"] == []
    by_store = {s["store"]: s for s in report["stores"]}
    assert set(by_store) == {"sqlite", "redis", "redis-listpack", "postgres"}
    measured = [s for s in report["stores"] if s["status"] == "ok"]
    assert {"sqlite", "redis"} <= {s["store"] for s in measured}
    if POSTGRES:
        assert by_store["postgres"]["status"] == "ok"
    for s in measured:
        assert [st["size"] for st in s["stages"]] == report["config"]["sizes"]
        for st in s["stages"]:
            assert st["records"] >= st["size"]
            assert st["bytes_per_record"] > 0
            for case in ("grown_first_run", "grown_replay", "ref_first_run", "ref_replay"):
                assert 0 < st[case]["p50_us"] <= st[case]["p99_us"]
        expiry = s["expiry"]
        assert expiry["calls"] > 0 and expiry["removed"] > 0
    assert (out / "scale-quick.md").read_text().startswith("# Cost as records grow")
    assert (out / "scale-quick.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_store_whose_server_is_missing_is_skipped_with_the_reason(tmp_path: Path) -> None:
    path = os.path.dirname(sys.executable)  # python, and no redis-server
    code, report, stderr = _run_module(["--scale", "--stores", "sqlite,redis"], tmp_path, PATH=path)
    assert code == 0
    by_store = {s["store"]: s for s in report["stores"]}
    assert by_store["sqlite"]["status"] == "ok"
    assert by_store["redis"] == {
        "store": "redis",
        "status": "skipped",
        "detail": "redis-server is not on PATH",
    }
    assert "redis: skipped: redis-server is not on PATH" in stderr


def test_the_workers_run_executes_each_key_once_at_every_concurrency(
    tmp_path: Path,
) -> None:
    code, report, _ = _run_module(["--workers"], tmp_path)
    assert code == 0 and report["problems"] == []
    measured = [b for b in report["backends"] if b["status"] == "ok"]
    assert {"redis", "cluster"} <= {b["backend"] for b in measured}
    for b in measured:
        assert {(c["mode"], c["keys"], c["workers"]) for c in b["cases"]} == {
            (m, k, n) for m in ("processes", "threads", "asyncio")
            for k in ("distinct", "hot") for n in (1, 4)
        }  # fmt: skip
        for c in b["cases"]:
            assert c["status"] == "ok", c
            assert c["executions"] == c["key_count"], c
            assert c["duplicate_executions"] == 0 and c["keys_never_run"] == 0, c
            assert c["results"] == c["calls"] > 0 and c["errors"] == {}
            assert 0 < c["p50_us"] <= c["p99_us"]
    assert (tmp_path / "workers-quick.png").read_bytes()[:4] == b"\x89PNG"


def test_the_call_path_lists_every_module_a_first_run_enters_from_toolnode_to_the_store() -> None:
    from benchmarks.call_path import trace_first_run
    from langchain_idempotent import InMemoryIdempotencyStore

    rooms, moves = trace_first_run(InMemoryIdempotencyStore())
    assert rooms[0] == "adapters/tool.py"  # ToolNode calls the wrapper first
    for room in ("adapters/_opening.py", "core/engine.py", "core/_flow.py", "stores/memory.py"):
        assert room in rooms
    assert ("LangChain", "adapters/tool.py") in moves
    assert ("core/engine.py", "stores/memory.py") in moves  # the store's claim
