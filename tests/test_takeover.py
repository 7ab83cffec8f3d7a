"""Under the default policy a dead worker's call is taken over by the next caller (one
effect, ``takeover=True``), while a live worker that cannot renew for a while (a blocked
event loop) shorter than its lease keeps its call: the duplicate waits and replays.

How soon the takeover comes is measured, not asserted: ``python -m benchmarks.takeover``
(p50 / p95 per store, in docs/effects.md).
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from langchain_idempotent import InMemoryIdempotencyStore, Policy
from langchain_idempotent.core.context import get_idempotency_context
from langchain_idempotent.core.engine import Engine
from langchain_idempotent.core.events import IdempotencyEvent
from langchain_idempotent.core.store import BaseIdempotencyStore
from langchain_idempotent.stores.postgres import PostgresIdempotencyStore
from langchain_idempotent.stores.redis import RedisIdempotencyStore
from langchain_idempotent.stores.sqlite import SqliteIdempotencyStore
from tests.support import forked
from tests.support.postgres_fixtures import pg_server, pg_table, pg_url
from tests.support.redis_servers import RedisServer

__all__ = ["pg_server", "pg_table", "pg_url"]  # the fixtures this module uses

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(params=["sqlite", "redis", "postgres"])
def shared(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """A store two processes share, and how the benchmark's child opens it."""
    if request.param == "sqlite":
        path = str(tmp_path / "records.db")
        store: BaseIdempotencyStore = SqliteIdempotencyStore(path)
        spec = f"sqlite|{path}|"
    elif request.param == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        prefix = f"takeover-{uuid.uuid4().hex[:8]}:"
        store = RedisIdempotencyStore.from_url(server.url, prefix=prefix)
        spec = f"redis|{server.url}|{prefix}"
    else:
        url, table = request.getfixturevalue("pg_url"), request.getfixturevalue("pg_table")
        store = PostgresIdempotencyStore.from_url(url, table=table)
        spec = f"postgres|{url}|{table}"
    yield store, spec
    store.close()  # type: ignore[attr-defined]


def test_a_dead_workers_call_is_taken_over_under_the_default_lease_with_one_effect(
    shared: Any, tmp_path: Path
) -> None:
    store, spec = shared
    key = f"dead-{uuid.uuid4().hex}"
    out = tmp_path / "worker-stdout.txt"
    worker = forked.start(
        ["-m", "benchmarks.takeover", "--child", "dies", spec, key, ""],
        stdout=out,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        forked.wait_for_line(worker, out, "started")
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait()
    effects: list[bool] = []

    def resumed() -> str:
        ctx = get_idempotency_context()
        assert ctx is not None
        effects.append(ctx.takeover)
        return "refunded"

    assert Engine(store, Policy()).run(key, fingerprint="fp", action=resumed) == "refunded"
    assert effects == [True]  # one effect, told it is a takeover (the key passed on)


def test_a_live_worker_whose_event_loop_is_blocked_within_its_lease_keeps_its_call() -> None:
    store = InMemoryIdempotencyStore()
    events: list[IdempotencyEvent] = []
    engine = Engine(store, Policy(), on_event=events.append)
    policy = engine.policy
    stall = policy.lease_s * (1 - policy.renew_fraction) * 0.8  # no renewal can run meanwhile
    effects: list[str] = []
    started = threading.Event()

    async def stalls() -> str:
        started.set()
        time.sleep(stall)  # a blocking call in an async tool: the loop (and its renewal) stops
        effects.append("refund")
        return "refunded"

    owner = threading.Thread(
        target=lambda: asyncio.run(engine.arun("k", fingerprint="fp", action=stalls))
    )
    owner.start()
    started.wait()
    duplicate = engine.run("k", fingerprint="fp", action=lambda: effects.append("again"))
    owner.join()

    assert duplicate == "refunded" and effects == ["refund"]
    kinds = [e.kind for e in events]
    assert "takeover" not in kinds and "lease_lost" not in kinds and "wait" in kinds
