"""Options, markers and fixtures of the fault campaign.

- ``--campaign``: run the long versions (more keys, more calls) and the scenarios marked
  ``@pytest.mark.campaign`` (deselected otherwise), and write the figures table to
  ``--fault-report`` (default ``tests/faults/RESULTS.md``). Only recognised when pytest is
  pointed at this directory (``pytest tests/faults --campaign``) or run as
  ``python -m tests.faults``; ``IDEMPOTENCY_FAULT_CAMPAIGN=1`` does the same from anywhere.
- ``record`` (fixture): each scenario hands its :class:`~report.Figures` to it; the table of
  all figures is printed at the end of the run.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.faults import Ledger, StoreSpec
from tests.support.redis_servers import RedisServer, redis_server_available

from .report import Figures, markdown_table

DEFAULT_REPORT = Path(__file__).with_name("RESULTS.md")
_FIGURES = pytest.StashKey[list[Figures]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("fault campaign")
    group.addoption(
        "--campaign",
        action="store_true",
        default=False,
        help="run the long fault campaign (tests/faults) and write its figures table",
    )
    group.addoption(
        "--fault-report",
        default=None,
        help=f"where to write the figures table (default with --campaign: {DEFAULT_REPORT})",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "campaign: a long fault scenario, run only with --campaign")
    config.stash[_FIGURES] = []


def campaign_enabled(config: pytest.Config) -> bool:
    return bool(config.getoption("campaign", default=False)) or (
        os.environ.get("IDEMPOTENCY_FAULT_CAMPAIGN") == "1"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the campaign-only scenarios unless the campaign runs."""
    if campaign_enabled(config):
        return
    campaign_only = [i for i in items if i.get_closest_marker("campaign") is not None]
    if campaign_only:
        config.hook.pytest_deselected(items=campaign_only)
        items[:] = [i for i in items if i.get_closest_marker("campaign") is None]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    config = terminalreporter.config
    figures = config.stash.get(_FIGURES, [])
    if not figures:
        return
    table = markdown_table(figures)
    terminalreporter.write_sep("=", "fault campaign figures")
    terminalreporter.write_line(table)
    target = config.getoption("fault_report", default=None)
    if target is None and campaign_enabled(config):
        target = str(DEFAULT_REPORT)
    if target:
        Path(target).write_text(_document(table, config))
        terminalreporter.write_line(f"figures written to {target}")


def _document(table: str, config: pytest.Config) -> str:
    mode = "campaign" if campaign_enabled(config) else "CI subset"
    return (
        f"# Fault campaign figures ({mode})\n\n"
        "Produced by `python -m tests.faults` (the long campaign) or "
        "`python -m pytest tests/faults --fault-report PATH` (the CI subset). "
        "Column meanings are in `tests/faults/report.py`.\n\n"
        f"{table}\n"
    )


# -- fixtures ------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def campaign(pytestconfig: pytest.Config) -> bool:
    """True for the long campaign: scenarios scale their figures up."""
    return campaign_enabled(pytestconfig)


@pytest.fixture
def record(pytestconfig: pytest.Config) -> Callable[[Figures], None]:
    """Hand a scenario's figures to the campaign table."""
    return pytestconfig.stash[_FIGURES].append


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "ledger.sqlite")


@pytest.fixture
def prefix() -> str:
    return f"fault-{uuid.uuid4().hex[:8]}:"


#: The stores a scenario runs on: ``[redis]`` (a throwaway server) and ``[sqlite]`` (a file).
STORES = [
    pytest.param(
        "redis",
        marks=[
            pytest.mark.redis,
            pytest.mark.skipif(not redis_server_available(), reason="no redis-server"),
        ],
    ),
    "sqlite",
]


@pytest.fixture(params=STORES)
def spec(request: pytest.FixtureRequest, tmp_path: Path, prefix: str) -> StoreSpec:
    """How to open the store under test, once per store kind (picklable for workers)."""
    if request.param == "redis":
        server = request.getfixturevalue("redis_server")
        return StoreSpec("redis", server.url, prefix=prefix)
    return StoreSpec("sqlite", str(tmp_path / "idem.sqlite"))


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    if not redis_server_available():
        pytest.skip("redis-server is not on PATH")
    with RedisServer() as server:
        yield server
