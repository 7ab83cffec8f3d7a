"""The benchmarks' regression guard flags a ratio that got more than 10 % worse, in either
direction of "worse", and nothing else (synthetic reports: no timing is measured here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks import regression


def _report(
    ping: float, ours_first: float, graph_plain: float, graph_memory: float
) -> dict[str, Any]:
    def row(name: str, column: str, median: float) -> dict[str, Any]:
        stat = {"median_us": median, "ratio_to_ping": median / ping}
        return {"row": name, "column": column, "status": "ok", "placements": {"same": stat}}

    return {
        "command": "python -m benchmarks",
        "latency": [
            row("ping", "replay", ping),
            row("ours_redis", "first run", ours_first),
            row("reference", "first run", 160.0),
            row("graph_plain", "first run", graph_plain),
            row("graph_memory", "first run", graph_memory),
        ],
    }


def test_a_cost_ratio_worse_by_more_than_ten_percent_is_flagged(tmp_path: Path) -> None:
    path = tmp_path / "baseline.json"
    regression.save_baseline(_report(40, 100, 1000, 1050), path)
    baseline = regression.load_baseline(path)
    assert baseline is not None
    changes = regression.compare(regression.ratios(_report(40, 100, 1000, 1200)), baseline)
    flagged = {c.name for c in changes if c.regressed()}
    assert flagged == {"graph_memory first run [same] / unwrapped"}
    assert "1 of" in regression.render(changes)[0]


def test_a_speedup_that_shrinks_by_more_than_ten_percent_is_flagged(tmp_path: Path) -> None:
    path = tmp_path / "baseline.json"
    regression.save_baseline(_report(40, 80, 1000, 1000), path)
    baseline = regression.load_baseline(path)
    assert baseline is not None
    # ours got slower: its ratio to r.ping() and the reference's speed-up over it both worsen
    changes = regression.compare(regression.ratios(_report(40, 100, 1000, 1000)), baseline)
    flagged = {c.name for c in changes if c.regressed()}
    assert flagged == {
        "ours_redis first run [same] / r.ping()",
        "reference / ours_redis first run [same]",
    }


def test_improvements_and_changes_within_the_tolerance_are_not_flagged(tmp_path: Path) -> None:
    path = tmp_path / "baseline.json"
    regression.save_baseline(_report(40, 100, 1000, 1100), path)
    baseline = regression.load_baseline(path)
    assert baseline is not None
    changes = regression.compare(regression.ratios(_report(40, 105, 1000, 1000)), baseline)
    assert changes and not any(c.regressed() for c in changes)


def test_the_committed_baseline_loads_and_guards_the_goals_ratios() -> None:
    baseline = regression.load_baseline()
    assert baseline is not None, "benchmarks/results/baseline.json is committed"
    assert "ours_redis first run [split] / r.ping()" in baseline
    assert "graph_memory first run [same] / unwrapped" in baseline
