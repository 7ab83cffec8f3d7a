"""The refund demo's wall time with and without protection, on the same seeded faults.

Runs ``python -m graphs.batch`` (all three modes, one after the other, same tickets and
seed, SQLite store) in a subprocess and reads the wall time of each mode from the JSON it
writes. The demo itself belongs to ``graphs/``; this only times it for the goal
"with protection ≤ 1.1x the unprotected wall time".
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import tempfile
from typing import Any

__all__ = ["run_demo"]


def run_demo(tickets: int, *, seed: int = 7, timeout: float = 1800) -> dict[str, Any]:
    """``{"status", "tickets", "wall_time_s": {mode: s}, ...}`` or the reason it failed."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory(prefix="bench-demo-") as out:
        argv = [sys.executable, "-m", "graphs.batch", "-n", str(tickets), "--seed", str(seed)]
        argv += ["--no-progress", "--out", out]
        try:
            proc = subprocess.run(
                argv, cwd=root, capture_output=True, text=True, timeout=timeout, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return {"status": "error", "detail": f"{type(exc).__name__}: {exc}"}
        files = sorted(glob.glob(os.path.join(out, "refund-batch-*.json")))
        if proc.returncode != 0 or not files:
            tail = (proc.stderr or proc.stdout)[-500:]
            return {"status": "error", "detail": f"exit {proc.returncode}: {tail}"}
        with open(files[-1]) as f:
            data = json.load(f)
    modes = data.get("modes", {})
    return {
        "status": "ok",
        "tickets": tickets,
        "seed": seed,
        "command": " ".join(["python", *argv[1:-2]]),
        "wall_time_s": {m: r.get("wall_time_s") for m, r in modes.items()},
        "duplicate_refunds": {
            m: r.get("ledger", {}).get("duplicate_refunds") for m, r in modes.items()
        },
    }
