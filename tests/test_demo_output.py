"""What the demo (``python -m graphs.batch``) shows a newcomer: how long it will take,
progress without a terminal (a CI log, ``| tee``), 80 columns, and what every column and
the less obvious rows of its table mean."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from graphs.batch import LineProgress, _progress, start_line
from graphs.options import BatchOptions
from graphs.report import LEGEND, REPRODUCIBILITY, LedgerFigures, ModeResult, render_table
from graphs.shared import MODES

ROOT = Path(__file__).resolve().parent.parent
NOTE = "paid twice 88 · killed 16 · retries 194"  # as wide as the default run's notes get


def _console(*, terminal: bool) -> Console:
    return Console(file=io.StringIO(), width=80, force_terminal=terminal, record=True)


def test_the_demo_says_how_long_it_takes_before_it_starts() -> None:
    said = start_line(BatchOptions())
    assert "1,400 tickets" in said and "about 2-6 min on 2 cores" in said
    assert all(len(line) <= 80 for line in said.splitlines())
    assert "about 14-50 s" in start_line(BatchOptions(tickets=280, modes=("none", "idempotent")))
    assert "a few seconds" in start_line(BatchOptions(tickets=20, modes=("none",)))


def test_without_a_terminal_progress_prints_a_line_per_tenth_of_a_mode() -> None:
    console = _console(terminal=False)
    progress = _progress(BatchOptions(), console)
    assert isinstance(progress, LineProgress)
    task = progress.add_task("reference", total=1400, note="")
    for done in range(0, 1401, 7):
        progress.update(task, completed=done, note=NOTE)
    lines = console.export_text().splitlines()
    assert len(lines) == 11, lines  # 0 %, 10 %, ... 100 %
    assert lines[-1].split()[:3] == ["reference", "1400/1400", "100%"]
    assert all(len(line) <= 80 for line in lines) and NOTE in lines[-1]


def test_on_a_terminal_the_progress_bar_fits_80_columns_uncut() -> None:
    progress = _progress(BatchOptions(), _console(terminal=True))
    task = progress.add_task("idempotent", total=1400, note="")
    progress.update(task, completed=1400, note=NOTE)
    screen = _console(terminal=False)  # what the terminal shows, without the redraws
    screen.print(progress.get_renderable())
    (line,) = [line for line in screen.export_text().splitlines() if line.strip()]
    assert len(line) <= 80, line
    assert "1400/1400" in line and NOTE in line and "…" not in line, line


def _result(mode: str) -> ModeResult:
    ledger = LedgerFigures(1400, 1488, 88, 60, 28, 0, 2_133_731, 76, 78, "C-1 was credited")
    counters = {"free_retries": 15, "reconciled_found": 127, "reconciled_not_found": 79}
    return ModeResult(mode, 1400, 1400, 0, ledger, counters, {}, {}, 63.4, 40.0)


def test_the_table_fits_80_columns_and_the_legend_explains_every_column() -> None:
    console = _console(terminal=False)
    console.print(render_table([_result(m) for m in MODES], "Refund batch: 1400 tickets"))
    console.print(LEGEND, markup=False, highlight=False)
    console.print(REPRODUCIBILITY, highlight=False)
    text = console.export_text()
    assert all(len(line) <= 80 for line in text.splitlines())
    assert "$21,337.31" in text  # no figure cut
    columns = LEGEND.split("Rows:")[0]
    for mode in MODES:
        assert re.search(rf"^  {mode} ", columns, re.M), f"the legend does not explain {mode}"
    rows = LEGEND.split("Rows:")[1]
    for term in ("takeovers", "free retries", "kept uncertain", "reconciled", "re-sent"):
        assert f"  {term}" in rows
    assert all(len(line) <= 80 for line in LEGEND.splitlines())
    assert " ".join(REPRODUCIBILITY.split()) in " ".join(text.split())  # wrapped, not cut


def test_the_demo_piped_to_a_file_shows_progress_then_the_explained_table(
    tmp_path: Path,
) -> None:
    """A real (small) run with its output piped, as in CI: progress lines while it runs,
    every line within 80 columns, the legend under the table."""
    small = ["-n", "20", "-w", "2", "--protection", "none", "--out", str(tmp_path)]
    done = subprocess.run(
        [sys.executable, "-m", "graphs.batch", *small],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "80"},
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    progress = [line for line in lines if re.match(r"\s+none\s+\d+/20\s+\d+%", line)]
    assert progress and progress[-1].split()[1:3] == ["20/20", "100%"], done.stdout
    assert lines[0].startswith("Refund batch of 20 tickets")  # what it will do, first
    table = next(i for i, line in enumerate(lines) if line.startswith("Refund batch: 20"))
    assert lines.index(progress[-1]) < table  # the progress came first
    assert "Columns: the protection modes" in done.stdout
    too_wide = [line for line in lines if len(line) > 80]
    assert not too_wide, too_wide
