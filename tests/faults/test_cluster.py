"""Scenario 5a: a Redis Cluster on loopback (3 masters + 3 replicas).

- The store contract suite on the Cluster (campaign only: ~30 s; the CI runs the Redis
  engineer's Cluster smoke test in ``tests/test_store_redis.py``).
- A master is SIGKILLed in the middle of a batch and its replica promoted: calls to its
  slots fail closed (``StoreUnavailableError``) until the promotion, then resume. The test
  reports which records were lost (acknowledged to a caller before the kill, missing after
  the promotion: asynchronous replication) and whether any effect ran twice.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
import redis

from langchain_idempotent import Policy
from langchain_idempotent.core.engine import Engine
from langchain_idempotent.stores.redis import RedisIdempotencyStore
from langchain_idempotent.testing import StoreContractTests
from tests.support.faults import Ledger, StoreSpec, Tally, wait_until
from tests.support.redis_servers import REDIS_CLI, RedisCluster, redis_server_available

from .report import Figures
from .workload import call_until_answered, refund

pytestmark = [
    pytest.mark.redis,
    pytest.mark.skipif(
        not redis_server_available() or REDIS_CLI is None, reason="needs redis-server/cli"
    ),
]
LEASE = 1.0
NODE_TIMEOUT_MS = 1000


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    """A 3 + 3 Cluster whose replicas have finished their first sync (a replica that never
    synced refuses to fail over)."""
    with RedisCluster(node_timeout_ms=NODE_TIMEOUT_MS, repl_diskless_sync_delay="0") as c:
        wait_until(lambda: all_replicas_synced(c), 30, "every replica's first sync", every=0.05)
        yield c


def all_replicas_synced(cluster: RedisCluster) -> bool:
    for node in cluster.nodes:
        with contextlib.closing(node.client()) as c:
            info = c.info("replication")
        if info.get("role") == "slave" and info.get("master_link_status") != "up":
            return False
    return True


@pytest.mark.campaign
class TestClusterStoreContract(StoreContractTests):
    short_lease_ms = 300

    @pytest.fixture
    def store(self, cluster: RedisCluster) -> Iterator[RedisIdempotencyStore]:
        s = RedisIdempotencyStore.from_url(
            cluster.url, cluster=True, prefix=f"contract-{uuid.uuid4().hex[:8]}:"
        )
        yield s
        s.close()


def masters(cluster: RedisCluster) -> dict[int, int]:
    """``port of a live master -> number of slots it serves``."""
    out: dict[int, int] = {}
    for node in cluster.nodes:
        if not node.running:
            continue
        with contextlib.suppress(redis.RedisError), contextlib.closing(node.client()) as c:
            nodes: bytes = c.execute_command("CLUSTER", "NODES")  # type: ignore[no-untyped-call]
            for line in nodes.decode().splitlines():
                fields = line.split()
                if "myself" in fields[2] and "master" in fields[2] and len(fields) > 8:
                    out[node.port] = sum(_slots(r) for r in fields[8:])
    return out


def _slots(spec: str) -> int:
    if spec.startswith("["):
        return 0
    low, _, high = spec.partition("-")
    return int(high or low) - int(low) + 1


def test_a_master_killed_mid_batch_fails_closed_until_its_replica_is_promoted(
    cluster: RedisCluster,
    ledger: Ledger,
    prefix: str,
    record: Callable[[Figures], None],
    campaign: bool,
) -> None:
    keys = [f"cluster-{i}" for i in range(1500 if campaign else 150)]
    spec = StoreSpec(
        "cluster",
        cluster.url,
        prefix=prefix,
        socket_timeout=0.5,
        socket_connect_timeout=0.5,
        retries=2,
    )
    engine = Engine(spec.open(), Policy(lease=LEASE, wait_timeout=30.0))
    tallies = [Tally() for _ in range(4)]

    def worker(tally: Tally, mine: list[str]) -> None:
        for key in mine:
            call_until_answered(
                engine, key, refund(ledger, key, sleep=0.005), tally, deadline_s=60.0
            )

    threads = [threading.Thread(target=worker, args=(t, keys[i::4])) for i, t in enumerate(tallies)]
    for t in threads:
        t.start()
    wait_until(lambda: len(ledger.execution_times()) >= len(keys) // 3, 60, "a third done")
    before = masters(cluster)
    victim = next(n for n in cluster.nodes if n.port in before)
    acknowledged = {k for t in tallies for k, r, _ in list(t.rows) if r is not None}
    killed_at = time.monotonic()
    victim.kill()
    wait_until(lambda: len(masters(cluster)) == 3, 30, "a replica to be promoted", every=0.05)
    promoted_after = time.monotonic() - killed_at
    for t in threads:
        t.join(120)
    ledger.calls([row for t in tallies for row in t.rows])
    lost = sorted(k for k in acknowledged if engine.store.get(k) is None)
    # Every layer retries: a second pass replays, or re-runs what the failover lost.
    second = Tally()
    for key in keys:
        call_until_answered(engine, key, refund(ledger, key), second, deadline_s=60.0)
    ledger.calls(second.rows)

    answered = {k for t in [*tallies, second] for k, r, _ in t.rows if r is not None}
    assert answered == set(keys)
    assert ledger.effects() == dict.fromkeys(keys, 1)
    figures = Figures.from_ledger(
        "5. Cluster: master SIGKILLed mid-batch" + (" (campaign)" if campaign else ""),
        f"1 of 3 masters killed ({before[victim.port]} slots), node timeout {NODE_TIMEOUT_MS} ms",
        ledger,
        notes=[
            f"replica promoted {promoted_after:.1f}s after the kill; calls to its slots "
            "failed closed meanwhile",
            f"records lost: {len(lost)} of {len(acknowledged)} acknowledged before the kill"
            + (f" ({', '.join(lost[:5])}{', ...' if len(lost) > 5 else ''})" if lost else ""),
        ],
    )
    record(figures)
    assert figures.duplicates == 0
