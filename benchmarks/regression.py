"""The regression guard: this run's ratios against the committed baseline.

Absolute times move with the machine and its load; ratios measured within one run (ours
over one ``r.ping()``, a wrapped ToolNode step over an unwrapped one, ours over one
``SELECT 1``, a baseline's time over ours) move much less. :func:`ratios` takes those out
of a report; :func:`compare` sets them beside the ones in ``results/baseline.json`` and
marks each that got worse by more than the tolerance (10 %). ``python -m benchmarks``
prints the comparison after the report; ``--save-baseline`` makes this run the baseline.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["BASELINE", "TOLERANCE", "Ratio", "compare", "load_baseline", "ratios", "render"]

BASELINE = Path(__file__).with_name("results") / "baseline.json"
TOLERANCE = 0.10

#: Latency rows whose ratio to one ``r.ping()`` is worth guarding (ours and the floors).
_PING_ROWS = ("ours_redis", "ours_sqlite", "ours_memory", "floor_client")
#: (wrapped row, plain row): a ToolNode step with the tool wrapped over the same unwrapped.
_GRAPH_ROWS = (
    ("graph_memory", "graph_plain"),
    ("graph_redis", "graph_plain"),
    ("graph_floor", "graph_plain"),
)
#: (slower row, ours): how many times faster ours is (higher is better).
_SPEEDUPS = (("reference", "ours_redis"), ("powertools", "ours_redis"))


@dataclass(frozen=True)
class Ratio:
    name: str
    value: float
    #: True for speed-ups (bigger is better); False for costs (smaller is better).
    higher_is_better: bool = False


def _stats(report: dict[str, Any]) -> dict[tuple[str, str, str], dict[str, float]]:
    out: dict[tuple[str, str, str], dict[str, float]] = {}
    for entry in report.get("latency", []):
        if entry.get("status") != "ok":
            continue
        for placement, stat in entry.get("placements", {}).items():
            out[entry["row"], entry["column"], placement] = stat
    return out


def ratios(report: dict[str, Any]) -> dict[str, Ratio]:
    """Every guarded ratio of a ``python -m benchmarks`` report, by a stable name."""
    stats = _stats(report)
    found: dict[str, Ratio] = {}

    def add(name: str, value: float, higher: bool = False) -> None:
        found[name] = Ratio(name, value, higher)

    for (row, column, placement), stat in stats.items():
        if row in _PING_ROWS and "ratio_to_ping" in stat:
            add(f"{row} {column} [{placement}] / r.ping()", stat["ratio_to_ping"])
    for wrapped, plain in _GRAPH_ROWS:
        for (row, column, placement), stat in stats.items():
            base = stats.get((plain, column, placement))
            if row == wrapped and base:
                ratio = stat["median_us"] / base["median_us"]
                add(f"{wrapped} {column} [{placement}] / unwrapped", ratio)
    for slow, ours in _SPEEDUPS:
        for (row, column, placement), stat in stats.items():
            mine = stats.get((ours, column, placement))
            if row == slow and mine:
                speedup = stat["median_us"] / mine["median_us"]
                add(f"{slow} / {ours} {column} [{placement}]", speedup, True)
    postgres = report.get("postgres") or {}
    if postgres.get("status") == "ok":
        for name, value in postgres["report"]["ratios"].items():
            add(f"postgres {name}", value, name.startswith(("dbos", "langgraph")))
    return found


def load_baseline(path: Path = BASELINE) -> dict[str, Ratio] | None:
    """The committed baseline's ratios, or ``None`` when there is none."""
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    return {n: Ratio(n, r["value"], r["higher_is_better"]) for n, r in data["ratios"].items()}


def save_baseline(report: dict[str, Any], path: Path = BASELINE) -> None:
    data = {
        "command": report.get("command"),
        "date": report.get("date"),
        "commit": report.get("machine", {}).get("git_commit"),
        "loadavg": [report.get("loadavg_start"), report.get("loadavg_end")],
        "ratios": {
            n: {"value": round(r.value, 4), "higher_is_better": r.higher_is_better}
            for n, r in sorted(ratios(report).items())
        },
    }
    path.write_text(json.dumps(data, indent=2) + "\n")


@dataclass(frozen=True)
class Change:
    name: str
    baseline: float
    current: float
    higher_is_better: bool

    @property
    def worse_by(self) -> float:
        """How much worse this run is, as a fraction (negative: better)."""
        if self.higher_is_better:
            return self.baseline / self.current - 1.0
        return self.current / self.baseline - 1.0

    def regressed(self, tolerance: float = TOLERANCE) -> bool:
        return self.worse_by > tolerance


def compare(current: dict[str, Ratio], baseline: dict[str, Ratio]) -> list[Change]:
    """The ratios both runs measured, worst change first."""
    changes = [
        Change(name, baseline[name].value, ratio.value, ratio.higher_is_better)
        for name, ratio in current.items()
        if name in baseline and baseline[name].value > 0 and ratio.value > 0
    ]
    return sorted(changes, key=lambda c: -c.worse_by)


def render(changes: list[Change], tolerance: float = TOLERANCE) -> list[str]:
    """Markdown: which ratios regressed by more than ``tolerance``, then the whole table."""
    regressed = [c for c in changes if c.regressed(tolerance)]
    lines = [
        f"{len(regressed)} of {len(changes)} ratios regressed by more than "
        f"{tolerance:.0%} against `benchmarks/results/baseline.json`"
        + (": " + ", ".join(c.name for c in regressed) if regressed else "."),
        "",
        "| ratio | baseline | this run | worse by | |",
        "|---|---:|---:|---:|---|",
    ]
    for c in changes:
        mark = "**regressed**" if c.regressed(tolerance) else ""
        better = "higher is better" if c.higher_is_better else ""
        lines.append(
            f"| {c.name} {('(' + better + ')') if better else ''} | {c.baseline:.3f} | "
            f"{c.current:.3f} | {c.worse_by:+.1%} | {mark} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.regression [REPORT.json] [--save]``: compare a saved report
    (default ``results/latest.json``) with the baseline, or make it the baseline."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m benchmarks.regression", description=main.__doc__)
    p.add_argument("report", nargs="?", default=str(BASELINE.with_name("latest.json")))
    p.add_argument("--baseline", default=str(BASELINE))
    p.add_argument("--save", action="store_true", help="make the report the new baseline")
    args = p.parse_args(argv)
    report = json.loads(Path(args.report).read_text())
    if args.save:
        save_baseline(report, Path(args.baseline))
        print(f"{len(ratios(report))} ratios of {args.report} written to {args.baseline}")
        return 0
    baseline = load_baseline(Path(args.baseline))
    if baseline is None:
        print(f"no baseline at {args.baseline}: run with --save first")
        return 2
    print("\n".join(render(compare(ratios(report), baseline))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
