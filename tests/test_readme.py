"""The README tells the truth: its quickstart runs as printed (the docs site includes the same
block; its tables are checked in ``tests/test_docs.py``)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _section(title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", README, re.S | re.M)
    assert match, f"README has no section {title!r}"
    return match.group(1)


def test_the_quickstart_runs_as_printed_and_its_retry_pays_once(tmp_path: Path) -> None:
    code = re.search(r"```python\n(.*?)```", _section("Quickstart"), re.S)
    assert code, "the Quickstart section has no python block"
    script = tmp_path / "quickstart.py"
    script.write_text(code.group(1))
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    # It says what it proved: one refund, and the key the provider was handed.
    said = done.stdout.strip().splitlines()
    assert len(said) == 1 and said[0].startswith("refunds sent: 1 for a node run twice"), said
    assert re.search(r"the provider saw key \S{16,}$", said[0]), said
    # ...and the same script with the tools left unwrapped pays twice: the assert fails.
    plain = code.group(1).replace(
        "tools = idempotent([issue_refund, notify_customer], store=InMemoryIdempotencyStore())",
        "tools = [issue_refund, notify_customer]",
    )
    plain = plain.replace("key = get_idempotency_context().key", "key = None")
    assert plain != code.group(1)
    script.write_text(plain)
    unprotected = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert unprotected.returncode != 0
    assert "AssertionError" in unprotected.stderr
