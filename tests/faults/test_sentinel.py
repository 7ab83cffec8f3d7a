"""Scenario 5b: Sentinel — a master, a replica and three sentinels (quorum 2).

The store is built with :meth:`RedisIdempotencyStore.from_sentinel`. The master is
SIGKILLed between two batches; the sentinels promote the replica, and the store follows:
the second batch fails closed until the promotion, then runs on the new master, where the
first batch's (replicated) records are replayed, not re-run.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from langchain_idempotent import Policy
from langchain_idempotent.core.engine import Engine
from tests.support.faults import Ledger, StoreSpec, Tally, wait_until
from tests.support.redis_servers import RedisServer, redis_server_available

from .report import Figures
from .workload import call_until_answered, refund

pytestmark = [
    pytest.mark.redis,
    pytest.mark.skipif(not redis_server_available(), reason="needs redis-server"),
]
SERVICE = "mymaster"
LEASE = 1.0


class Sentinels:
    """A master, one replica and three sentinels watching them, all on loopback."""

    def __init__(self) -> None:
        self.master = RedisServer(repl_diskless_sync_delay="0")
        self.replica = RedisServer(replicaof=f"127.0.0.1 {self.master.port}")
        self.sentinels: list[RedisServer] = []
        self.dirs: list[tempfile.TemporaryDirectory[str]] = []
        for _ in range(3):
            d = tempfile.TemporaryDirectory(prefix="sentinel-test-")
            self.dirs.append(d)
            conf = Path(d.name) / "sentinel.conf"
            conf.write_text(
                f"sentinel monitor {SERVICE} 127.0.0.1 {self.master.port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} 500\n"
                f"sentinel failover-timeout {SERVICE} 3000\n"
            )
            self.sentinels.append(RedisServer(directory=d.name, config_file=conf, sentinel=True))
        wait_until(self._ready, 30, "sentinels to see each other and the replica", every=0.05)

    def _ready(self) -> bool:
        for s in self.sentinels:
            with contextlib.closing(s.client()) as c:
                info: Any = c.sentinel_master(SERVICE)
                if int(info["num-other-sentinels"]) < 2 or int(info["num-slaves"]) < 1:
                    return False
        with contextlib.closing(self.replica.client()) as c:
            return bool(c.info("replication").get("master_link_status") == "up")

    @property
    def target(self) -> str:
        return ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels) + f"/{SERVICE}"

    def master_port(self) -> int | None:
        for s in self.sentinels:
            with contextlib.suppress(redis.RedisError), contextlib.closing(s.client()) as c:
                addr: Any = c.sentinel_get_master_addr_by_name(SERVICE)
                if addr:
                    return int(addr[1])
        return None

    def close(self) -> None:
        for server in [*self.sentinels, self.replica, self.master]:
            server.close()
        for d in self.dirs:
            d.cleanup()


@pytest.fixture
def sentinels() -> Iterator[Sentinels]:
    s = Sentinels()
    try:
        yield s
    finally:
        s.close()


def test_the_store_follows_a_sentinel_failover(
    sentinels: Sentinels,
    ledger: Ledger,
    prefix: str,
    record: Callable[[Figures], None],
    campaign: bool,
) -> None:
    n = 300 if campaign else 40
    first, second = [f"sentinel-a-{i}" for i in range(n)], [f"sentinel-b-{i}" for i in range(n)]
    spec = StoreSpec(
        "sentinel",
        sentinels.target,
        prefix=prefix,
        socket_timeout=0.5,
        socket_connect_timeout=0.5,
        retries=2,
    )
    engine = Engine(spec.open(), Policy(lease=LEASE, wait_timeout=30.0))
    tally = Tally()
    for key in first:
        call_until_answered(engine, key, refund(ledger, key), tally)
    with contextlib.closing(sentinels.master.client()) as c:
        acked: int = c.execute_command("WAIT", 1, 2000)  # type: ignore[no-untyped-call]
        assert acked == 1  # the first batch is replicated

    killed_at = time.monotonic()
    sentinels.master.kill()
    for key in second:
        call_until_answered(engine, key, refund(ledger, key), tally, deadline_s=60.0)
    resumed_after = time.monotonic() - killed_at
    assert sentinels.master_port() == sentinels.replica.port
    for key in first + second:  # retries of both batches, on the new master
        call_until_answered(engine, key, refund(ledger, key), tally)
    ledger.calls(tally.rows)

    assert ledger.executions() == dict.fromkeys(first + second, 1)  # replayed, not re-run
    figures = Figures.from_ledger(
        "5. Sentinel failover (1 master, 1 replica, 3 sentinels)",
        "master SIGKILLed between two batches; down-after 500 ms",
        ledger,
        notes=[
            f"store followed the promoted replica; the batch resumed {resumed_after:.1f}s "
            "after the kill; records lost: 0 (replicated before the kill)"
        ],
    )
    record(figures)
    assert figures.errors["StoreUnavailableError"] > 0  # failed closed during the failover
    assert figures.divergent == 0
