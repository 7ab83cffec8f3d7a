"""``python -m benchmarks.instructions`` counts what it says and refuses what it cannot do.

No count is asserted against a number (that is the benchmark's report): a real callgrind
run gives a positive count per call for a case, and the report names what was missing.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from benchmarks import instructions


def test_an_unknown_case_is_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        instructions.main(["--cases", "tool_plain,nope"])
    assert exited.value.code == 2
    assert "unknown case(s) nope" in capsys.readouterr().err


def test_without_valgrind_nothing_is_measured_and_the_report_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert instructions.main(["--out", str(tmp_path)]) == 1
    report = json.loads((tmp_path / "instructions.json").read_text())
    assert report["instructions"] == {}
    assert report["problems"] == [
        "valgrind and callgrind_control not found (Debian package valgrind): nothing measured"
    ]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("valgrind") is None, reason="needs valgrind")
def test_a_case_is_counted_under_callgrind_after_its_warm_up(tmp_path: Path) -> None:
    code = instructions.main(["--calls", "2", "--cases", "tool_plain", "--out", str(tmp_path)])
    assert code == 0
    report = json.loads((tmp_path / "instructions.json").read_text())
    assert report["problems"] == []
    assert report["instructions"]["tool_plain"] > 100_000  # a LangChain tool run, not nothing
    markdown = (tmp_path / "instructions.md").read_text()
    assert "| `tool.invoke(call, config)`, unwrapped |" in markdown


def test_each_redis_case_is_compared_with_the_floor_step() -> None:
    for case in instructions.REDIS_CASES:
        base = instructions.CASES[case][1]
        assert base is None or base in instructions.REDIS_CASES
        assert base is None or base.startswith("graph_floor")


def test_without_redis_server_the_redis_cases_say_why_and_nothing_is_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from benchmarks import server

    def no_server(*args: object, **kwargs: object) -> None:
        raise RuntimeError("redis-server is not on PATH; the benchmarks need one")

    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(server, "RedisServer", no_server)
    monkeypatch.setattr(instructions, "measure", lambda *a: pytest.fail("measured"))
    code = instructions.main(["--cases", "graph_redis", "--out", str(tmp_path)])
    assert code == 1
    report = json.loads((tmp_path / "instructions.json").read_text())
    assert report["instructions"] == {}
    assert report["problems"] == [
        "no redis-server for the Redis cases: redis-server is not on PATH; the benchmarks need one",
        "graph_redis: no redis-server to run it against",
    ]
