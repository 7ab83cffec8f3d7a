"""The benchmark runner's quick mode runs end to end and counts executions right.

Timings are never asserted here (they belong to ``python -m benchmarks``); what is checked
is that the run completes, writes its Markdown and JSON, and that the execution counts it
reports are the ones idempotency promises: a first run executes once per call, a replay
never, and our engine never executes a key twice under threads or processes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import langchain_idempotent

pytestmark = [
    pytest.mark.redis,
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server"),
]

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, Any], str]:
    out = tmp_path_factory.mktemp("bench")
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--out", str(out), "--seed", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
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
    rows = ["ping", "raw_ping", "reference", "graph_plain", "ours_memory"]
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
