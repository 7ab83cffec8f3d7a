"""The README tells the truth: its quickstart runs as printed (the docs site includes the same
block; its tables are checked in ``tests/test_docs.py``)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from .support import forked

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _section(title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", README, re.S | re.M)
    assert match, f"README has no section {title!r}"
    return match.group(1)


WRAP = "tools = idempotent([issue_refund, notify_customer], store=InMemoryIdempotencyStore())"


def _quickstart() -> str:
    code = re.search(r"```python\n(.*?)```", _section("Quickstart"), re.S)
    assert code, "the Quickstart section has no python block"
    assert WRAP in code.group(1)
    return code.group(1)


def _run(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``python quickstart.py``, forked from a warm process (:mod:`tests.support.forked`)."""
    script = tmp_path / "quickstart.py"
    script.write_text(code)
    return forked.run_script(script, timeout=120)


def test_the_quickstart_runs_as_printed_and_its_retry_pays_once(tmp_path: Path) -> None:
    done = _run(_quickstart(), tmp_path)
    assert done.returncode == 0, done.stderr
    # It says what it proved: one refund, and the key the provider was handed.
    said = done.stdout.strip().splitlines()
    assert len(said) == 1 and said[0].startswith("refunds sent: 1 for a node run twice"), said
    assert re.search(r"the provider saw key \S{16,}$", said[0]), said


@pytest.mark.parametrize(
    "unwrapped",
    [
        "tools = [issue_refund, notify_customer]",
        # a scope gives wrapped tools a key outside a graph; it does not protect bare ones
        "from langchain_idempotent import idempotency_scope\n"
        'idempotency_scope("order-123").__enter__()\n'
        "tools = [issue_refund, notify_customer]",
    ],
    ids=["idempotent-left-out", "scope-around-unwrapped-tools"],
)
def test_the_readme_experiment_without_the_wrapper_fails_its_assert_on_a_second_refund(
    unwrapped: str, tmp_path: Path
) -> None:
    """The README's experiment, as it says: leave ``idempotent(...)`` out and the retry pays
    twice, so the ``assert`` fails (not an AttributeError on a missing context)."""
    done = _run(_quickstart().replace(WRAP, unwrapped), tmp_path)
    assert done.returncode != 0
    assert "AssertionError: refunds sent: 2: the retry paid again" in done.stderr, done.stderr
    assert "AttributeError" not in done.stderr


def test_the_quickstart_on_a_durable_store_says_its_second_run_replayed(tmp_path: Path) -> None:
    """Switched to SQLite as the README suggests, the second run sends nothing and says why."""
    code = _quickstart().replace(
        WRAP,
        "from langchain_idempotent import SqliteIdempotencyStore\n"
        'tools = idempotent([issue_refund, notify_customer], store=SqliteIdempotencyStore("i.db"))',
    )
    first, second = _run(code, tmp_path), _run(code, tmp_path)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("refunds sent: 1 for a node run twice"), first.stdout
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == (
        "refunds sent: 0; the store already held thread T-1's refund and replayed it"
    )
