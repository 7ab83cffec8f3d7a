"""The shipped contract suite, run as a store author runs it: in their own project.

The module below is the one ``langchain_idempotent.testing``'s docstring shows, on the
in-memory store, run by pytest in a directory of its own (no configuration of this
repository: pytest-asyncio in its default strict mode) with every ``PytestWarning`` an
error: the suite passes and warns about nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

#: The whole in-memory contract again, in a subprocess: left out of the default run.
pytestmark = pytest.mark.slow

USERS_TEST_MODULE = '''
from collections.abc import Iterator

import pytest

from langchain_idempotent.stores.memory import InMemoryIdempotencyStore
from langchain_idempotent.testing import StoreContractTests


class TestMyStore(StoreContractTests):
    @pytest.fixture
    def store(self) -> Iterator[InMemoryIdempotencyStore]:
        s = InMemoryIdempotencyStore()
        yield s
        s.close()
'''


def test_the_contract_suite_passes_in_a_users_project_without_a_pytest_warning(
    tmp_path: Path,
) -> None:
    (tmp_path / "test_my_store.py").write_text(USERS_TEST_MODULE)
    root = Path(__file__).resolve().parents[1]
    # A user's own pytest run: nothing of this session's (xdist worker variables included).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "XDIST_"))}
    env["PYTHONPATH"] = str(root)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-W", "error::pytest.PytestWarning", "test_my_store.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "warning" not in proc.stdout.lower()
