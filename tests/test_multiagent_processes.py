"""A swarm worker SIGKILLed inside the refund, after the provider booked it: the retry
(another worker process, same thread) refunds again unprotected; wrapped with
``reconcile=`` it takes the expired lease over, asks the provider's books and answers
with the refund that happened."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from tests.support import forked

ROOT = Path(__file__).resolve().parents[1]


def worker(folder: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return forked.run(
        ["-m", "tests.support.swarm_worker", *argv],
        folder=folder,
        cwd=ROOT,
        timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )


@pytest.mark.parametrize("mode", ["plain", "ours"])
def test_a_swarm_worker_killed_inside_the_refund_is_reconciled_by_the_next_worker(
    mode: str, tmp_path: Path
) -> None:
    db, ledger = str(tmp_path / "records.db"), str(tmp_path / "ledger.jsonl")
    killed = worker(tmp_path, mode, db, ledger, "swarm-kill", "--die")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    retry = worker(tmp_path, mode, db, ledger, "swarm-kill")
    assert retry.returncode == 0, retry.stderr
    result = json.loads(retry.stdout.strip().splitlines()[-1])
    assert result == {"answer": "bob has refunded you", "valid": True}
    rows = [json.loads(line) for line in Path(ledger).read_text().splitlines()]
    assert len(rows) == {"plain": 2, "ours": 1}[mode]
