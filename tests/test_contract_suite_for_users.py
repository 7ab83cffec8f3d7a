"""The shipped contract suite, run as a store author runs it: in their own project.

The module below is the one ``langchain_idempotent.testing``'s docstring shows, on the
in-memory store with the clock hook it describes (leases moved past, not slept out), run
by pytest in a directory of its own (no configuration of this repository, only the loop
scope pytest-asyncio asks every project to set; its default strict mode) with every
``PytestWarning`` an error: the suite passes and
warns about nothing. So does the custom store that docs/stores/index.md writes against
the store protocol ("Write your own store"), as it stands on the page (no clock hook:
its leases are waited out in real time).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .support.docs import runnable_snippets

#: The whole in-memory contract again, in a subprocess: left out of the default run.
pytestmark = pytest.mark.slow

USERS_TEST_MODULE = """
from collections.abc import Iterator

import pytest

from langchain_idempotent.stores.memory import InMemoryIdempotencyStore
from langchain_idempotent.testing import FakeClock, StoreContractTests


class TestMyStore(StoreContractTests):
    @pytest.fixture
    def clock(self) -> FakeClock:
        return FakeClock(ticking=True)

    @pytest.fixture
    def store(self, clock: FakeClock) -> Iterator[InMemoryIdempotencyStore]:
        s = InMemoryIdempotencyStore(clock=clock)
        yield s
        s.close()
"""


#: The same, on the store docs/stores/index.md writes (the page's snippet, as ``my_store``).
DOCS_STORE_TEST_MODULE = """
from collections.abc import Iterator

import pytest

from langchain_idempotent.testing import StoreContractTests
from my_store import DictStore


class TestDictStore(StoreContractTests):
    @pytest.fixture
    def store(self) -> Iterator[DictStore]:
        yield DictStore()
"""


def test_the_contract_suite_passes_in_a_users_project_without_a_pytest_warning(
    tmp_path: Path,
) -> None:
    _passes(tmp_path, USERS_TEST_MODULE)


def test_the_custom_store_the_docs_write_passes_the_whole_contract(tmp_path: Path) -> None:
    (snippet,) = [s for s in runnable_snippets() if "class DictStore" in s.code]
    (tmp_path / "my_store.py").write_text(snippet.code)
    _passes(tmp_path, DOCS_STORE_TEST_MODULE)


#: The user's pytest configuration: the one setting pytest-asyncio 1.x asks every project for
#: (it warns at start-up while it is unset, a ``PytestDeprecationWarning`` of its own that
#: pytest 9.2 raises under ``-W error``); strict mode, pytest-asyncio's default, is kept.
USERS_PYTEST_INI = "[pytest]\nasyncio_default_fixture_loop_scope = function\n"


def _passes(tmp_path: Path, module: str) -> None:
    (tmp_path / "pytest.ini").write_text(USERS_PYTEST_INI)
    (tmp_path / "test_my_store.py").write_text(module)
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
