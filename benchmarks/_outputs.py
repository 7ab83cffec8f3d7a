"""What :mod:`benchmarks.scale` and :mod:`benchmarks.workers` share: progress lines, the
report's frame (date, command, load average) and writing ``<name>.{md,json,png}``."""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["finish", "progress", "pyplot", "started"]


def progress(since: float) -> Callable[[str], None]:
    """A function printing ``[elapsed] message`` to stderr."""

    def say(msg: str) -> None:
        print(f"[{time.monotonic() - since:6.1f}s] {msg}", file=sys.stderr, flush=True)

    return say


def started(module: str, argv: list[str] | None) -> dict[str, Any]:
    """The report's opening fields, read before the run."""
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": f"python -m {module} " + " ".join(sys.argv[1:] if argv is None else argv),
        "cpus": os.cpu_count(),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        "_t0": time.monotonic(),
    }


def finish(
    report: dict[str, Any],
    out: str | Path,
    name: str,
    markdown: Callable[[dict[str, Any]], str],
    plot: Callable[[dict[str, Any], Path], None],
) -> int:
    """Close the report (load average, elapsed), write its Markdown, JSON and PNG under
    ``out``, print the Markdown; 1 when it lists problems, else 0."""
    report["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    report["elapsed_s"] = round(time.monotonic() - report.pop("_t0"), 1)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    md = markdown(report)
    if report["problems"]:
        md += "\n" + "\n".join(f"PROBLEM: {p}" for p in report["problems"]) + "\n"
    (folder / f"{name}.md").write_text(md)
    (folder / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(report, folder / f"{name}.png")
    print(md)
    return 1 if report["problems"] else 0


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
