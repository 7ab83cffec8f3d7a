"""DBOS recovery around the refund agent: the process is SIGKILLed mid-tool, after the
provider committed the refund, and a new process of the same DBOS application on the same
database recovers the workflow, which runs its unfinished step (the agent) again.

DBOS and the idempotency store share one throwaway PostgreSQL database
(:mod:`tests.support.postgres_server`); the application is
:mod:`tests.support.dbos_refund_app`, one process per phase (DBOS keeps global state).
Protected: the recovered step's ``issue_refund`` finds the dead process's claim, waits out
its 2 s lease, takes the key over and reconciles (the provider knows the key): no second
refund. Plain: the recovered step refunds again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from graphs.provider import PaymentProvider
from tests.support.agent_server import REPO
from tests.support.postgres_fixtures import pg_server, pg_url
from tests.support.refund_server import INVOICE, Figures

pytest.importorskip("dbos")

__all__ = ["pg_server", "pg_url"]  # fixtures used here

SETTLE_SECONDS = 60  # the first process is killed long before its tool returns


@pytest.fixture
def provider(tmp_path: Path) -> Iterator[PaymentProvider]:
    with PaymentProvider(tmp_path / "ledger.db", invoices=[INVOICE]) as p:
        yield p


@pytest.fixture
def database(pg_url: str) -> str:
    """A fresh database on the session's cluster, for DBOS and the store."""
    name = f"dbos_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return pg_url.rsplit("/", 1)[0] + f"/{name}"


def _app(phase: str, workflow_id: str, env: dict[str, str], log: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.dbos_refund_app", phase, workflow_id],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        stdout=subprocess.PIPE,
        stderr=log.open("a"),
        text=True,
    )


@pytest.mark.parametrize("mode", ["protected", "plain"])
def test_a_dbos_workflow_recovered_after_a_kill_mid_tool_refunds_once(
    tmp_path: Path, provider: PaymentProvider, database: str, mode: str
) -> None:
    env = {
        "DBOS_DATABASE_URL": database,
        "REFUND_PROVIDER_URL": provider.url,
        "IDEMPOTENCY_STORE_URL": database,
        "IDEMPOTENCY_LEASE": "2",
        "REFUND_AGENT": mode,
    }
    log = tmp_path / "dbos.log"
    workflow_id = f"ticket-T-9001-{mode}"
    started = time.monotonic()
    first = _app("start", workflow_id, {**env, "SETTLE_SECONDS": str(SETTLE_SECONDS)}, log)
    try:
        deadline = time.monotonic() + 60
        while not provider.ledger.refunds():
            assert first.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "no refund reached the provider"
            time.sleep(0.05)
    finally:
        first.kill()  # SIGKILL: mid-tool, after the provider committed
        first.wait(timeout=30)
    recovery = _app("recover", workflow_id, {**env, "SETTLE_SECONDS": "0"}, log)
    out, _ = recovery.communicate(timeout=120)
    assert recovery.returncode == 0, log.read_text()[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    figures = Figures.of("DBOS recovery after SIGKILL", mode, provider, 2, started)
    print(figures.line(), f"| workflow {result['status']}")
    assert result["status"] == "SUCCESS"
    if mode == "plain":
        assert figures.effects == 2
        return
    assert figures.effects == 1 and figures.posts == 1  # reconciled, not re-sent
    assert provider.ledger.refunds()[0]["refund_id"] in result["answer"]
