"""``python -m tests.faults [pytest options]``: the long fault campaign.

Runs ``pytest tests/faults --campaign`` from the repository root, which prints the figures
table and writes it to ``tests/faults/RESULTS.md`` (``--fault-report PATH`` to change).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

if __name__ == "__main__":
    args = [str(ROOT / "tests" / "faults"), "--campaign", "-p", "no:cacheprovider", "-q"]
    raise SystemExit(pytest.main([*args, *sys.argv[1:]]))
