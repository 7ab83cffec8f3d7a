"""Scenario 4: Redis restarts, and what replica acknowledgement (``WAIT``) would buy.

- Without persistence (``save ""``, ``appendonly no``) a restart loses every record: the
  tool runs again for every key, and only the downstream's deduplication on the key we
  hand it prevents a duplicate effect. Callers before and after the restart get results of
  different runs (the same downstream answer).
- With ``appendonly yes`` + ``appendfsync always`` every acknowledged record survives a
  crash (SIGKILL): nothing runs again. A crash in the middle of a batch only re-runs the
  calls whose completion never reached Redis, after one lease.
- ``WAIT``: :class:`RedisIdempotencyStore` does not send it. The test measures what it would
  cost (a ``WAIT 1 100`` pipelined after each write, one round trip) and shows what it
  would prevent: records written while the replica lags are lost when it is promoted.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fault_helpers import FaultProxy, Ledger, StoreSpec, Tally, percentile, wait_until
from redis_servers import RedisServer, free_port

from langchain_idempotent import Engine, Policy
from langchain_idempotent.record import FORMAT_VERSION, State
from langchain_idempotent.stores.redis import _CLAIM_SCRIPT, _COMPLETE_SCRIPT

from .report import Figures
from .workload import call_until_answered, refund

pytestmark = pytest.mark.redis
LEASE = 1.0


@pytest.fixture
def volatile() -> Iterator[RedisServer]:
    with RedisServer(port=free_port()) as server:
        yield server


@pytest.fixture
def durable() -> Iterator[RedisServer]:
    with RedisServer(port=free_port(), appendonly="yes", appendfsync="always") as server:
        yield server


def batch(engine: Engine, ledger: Ledger, keys: list[str], tally: Tally) -> None:
    for key in keys:
        call_until_answered(engine, key, refund(ledger, key), tally)


def missing(engine: Engine, keys: list[str]) -> int:
    return sum(1 for k in keys if engine.store.get(k) is None)


def test_a_restart_without_persistence_loses_records_and_the_downstream_key_saves_us(
    volatile: RedisServer,
    ledger: Ledger,
    prefix: str,
    record: Callable[[Figures], None],
    campaign: bool,
) -> None:
    keys = [f"volatile-{i}" for i in range(500 if campaign else 50)]
    engine = Engine(StoreSpec("redis", volatile.url, prefix=prefix).open(), Policy(lease=LEASE))
    tally = Tally()
    batch(engine, ledger, keys, tally)
    volatile.restart()  # SIGTERM and start: nothing was persisted
    lost = missing(engine, keys)
    batch(engine, ledger, keys, tally)
    ledger.calls(tally.rows)
    assert lost == len(keys)
    assert ledger.executions() == dict.fromkeys(keys, 2)  # every tool ran again ...
    assert ledger.effects() == dict.fromkeys(keys, 1)  # ... and the downstream deduplicated
    record(
        Figures.from_ledger(
            "4. Redis restart, no persistence",
            "1 restart (save '', appendonly no)",
            ledger,
            notes=[
                f"records lost: {lost} of {len(keys)}",
                "divergent = callers before/after the restart got different runs' results "
                "(the same downstream answer)",
            ],
        )
    )


def test_with_appendfsync_always_records_survive_a_crash(
    durable: RedisServer,
    ledger: Ledger,
    prefix: str,
    record: Callable[[Figures], None],
    campaign: bool,
) -> None:
    keys = [f"durable-{i}" for i in range(500 if campaign else 50)]
    engine = Engine(StoreSpec("redis", durable.url, prefix=prefix).open(), Policy(lease=LEASE))
    tally = Tally()
    batch(engine, ledger, keys, tally)
    durable.kill()  # SIGKILL: no shutdown save
    durable.start()
    lost = missing(engine, keys)
    batch(engine, ledger, keys, tally)
    ledger.calls(tally.rows)
    assert lost == 0
    assert ledger.executions() == dict.fromkeys(keys, 1)
    record(
        Figures.from_ledger(
            "4. Redis crash, appendfsync always",
            "1 SIGKILL + restart (appendonly yes, appendfsync always)",
            ledger,
            notes=[f"records lost: 0 of {len(keys)}; every second call replayed"],
        )
    )


def test_a_crash_in_the_middle_of_a_batch_with_aof_resumes_without_a_duplicate_effect(
    durable: RedisServer,
    ledger: Ledger,
    prefix: str,
    record: Callable[[Figures], None],
    campaign: bool,
) -> None:
    keys = [f"mid-crash-{i}" for i in range(400 if campaign else 80)]
    spec = StoreSpec(
        "redis", durable.url, prefix=prefix, socket_timeout=0.5, socket_connect_timeout=0.5
    )
    engine = Engine(spec.open(), Policy(lease=LEASE, wait_timeout=10.0))
    tallies = [Tally() for _ in range(4)]

    def worker(tally: Tally, mine: list[str]) -> None:
        for key in mine:
            call_until_answered(engine, key, refund(ledger, key, sleep=0.01), tally)

    threads = [
        threading.Thread(target=worker, args=(tally, keys[i::4])) for i, tally in enumerate(tallies)
    ]
    for t in threads:
        t.start()
    wait_until(lambda: len(ledger.execution_times()) >= len(keys) // 3, 60, "a third of the batch")
    durable.kill()
    time.sleep(0.5)
    durable.start()
    for t in threads:
        t.join(120)
    orphaned = [
        k for k in keys if (r := engine.store.get(k)) is not None and r.state is State.RUNNING
    ]
    # Every layer retries: a second pass over the batch replays, or (for a record whose
    # completion died with Redis) takes over after at most one lease and runs again.
    second = Tally()
    blocked = []
    for key in keys:
        started = time.monotonic()
        call_until_answered(engine, key, refund(ledger, key), second)
        blocked.append(time.monotonic() - started)
    ledger.calls([row for t in [*tallies, second] for row in t.rows])
    still_running = [k for k in keys if (r := engine.store.get(k)) and r.state is State.RUNNING]
    stuck = sum(1 for b in blocked if b > LEASE + 0.5)
    assert still_running == [] and stuck == 0
    assert ledger.effects() == dict.fromkeys(keys, 1)
    record(
        Figures.from_ledger(
            "4. Redis crash mid-batch, appendfsync always",
            "1 SIGKILL, 0.5 s down, restart; then the batch is retried",
            ledger,
            stuck=stuck,
            notes=[
                f"{len(orphaned)} records left RUNNING by completions lost in the crash "
                "(their callers had their results); the retry took them over after <= "
                f"{max(blocked):.2f}s and re-ran the tool",
            ],
        )
    )


# -- WAIT ------------------------------------------------------------------------------------


@pytest.fixture
def primary_and_replica() -> Iterator[tuple[RedisServer, RedisServer, FaultProxy]]:
    """A primary and a replica that replicates through a :class:`FaultProxy`."""
    with (
        RedisServer(repl_diskless_sync_delay="0") as primary,
        FaultProxy(primary.port) as link,
        RedisServer(replicaof=f"127.0.0.1 {link.port}") as replica,
    ):
        client = replica.client()
        wait_until(
            lambda: client.info("replication").get("master_link_status") == "up",
            20,
            "the replica to sync",
        )
        client.close()
        yield primary, replica, link


def _write(client: Any, key: str, n: int, wait: bool) -> tuple[float, int]:
    """One claim and one completion, sent as scripts; with ``WAIT 1 100`` pipelined after
    each. Returns the seconds it took and how many WAITs timed out unacknowledged."""
    started = time.perf_counter()
    unacked = 0
    for script, args in (
        (_CLAIM_SCRIPT, ("owner", "fp", 30_000, 3_600_000, "takeover", str(FORMAT_VERSION))),
        (
            _COMPLETE_SCRIPT,
            ("owner", 1, "fp", b"msgpack\n\xa2ok", 0, 3_600_000, str(FORMAT_VERSION)),
        ),
    ):
        pipe = client.pipeline(transaction=False)
        pipe.execute_command("EVALSHA", script.sha, 1, f"wait:{{{key}-{n}}}", *args)
        if wait:
            pipe.execute_command("WAIT", 1, 100)
        replies = pipe.execute()
        unacked += int(wait and replies[-1] != 1)
    return time.perf_counter() - started, unacked


def test_what_replica_acknowledgement_would_cost(record: Callable[[Figures], None]) -> None:
    with (
        RedisServer(repl_diskless_sync_delay="0") as primary,
        RedisServer(replicaof=f"127.0.0.1 {primary.port}") as replica,
    ):
        with contextlib.closing(replica.client()) as probe:
            wait_until(
                lambda: probe.info("replication").get("master_link_status") == "up",
                20,
                "the replica to sync",
            )
        client: Any = primary.client()
        client.script_load(_CLAIM_SCRIPT.source)
        client.script_load(_COMPLETE_SCRIPT.source)
        plain: list[float] = []
        acked: list[float] = []
        timeouts = 0
        for i in range(300):  # interleaved, so that machine noise hits both alike
            plain.append(_write(client, "plain", i, wait=False)[0])
            took, unacked = _write(client, "acked", i, wait=True)
            acked.append(took)
            timeouts += unacked
        client.close()
    plain_us, acked_us = percentile(plain, 0.5) * 1e6, percentile(acked, 0.5) * 1e6
    p99_plain, p99_acked = percentile(plain, 0.99) * 1e6, percentile(acked, 0.99) * 1e6
    record(
        Figures(
            "4. cost of WAIT 1 100 (measured, not used by the store)",
            "none (300 rounds of each, interleaved)",
            notes=[
                f"claim + completion, each followed by a pipelined WAIT: p50 {plain_us:.0f} -> "
                f"{acked_us:.0f} us, p99 {p99_plain:.0f} -> {p99_acked:.0f} us (loopback, "
                f"one replica); {timeouts} of 600 WAITs timed out at 100 ms"
            ],
        )
    )
    assert acked_us > plain_us  # the acknowledgement is a real extra wait
    assert timeouts < 60  # a healthy replica acknowledges nearly every write in time


def test_replica_acknowledgement_is_not_sent_and_lagging_replicas_lose_records(
    primary_and_replica: tuple[RedisServer, RedisServer, FaultProxy],
    ledger: Ledger,
    prefix: str,
    record: Callable[[Figures], None],
) -> None:
    primary, replica, link = primary_and_replica
    client: Any = primary.client()
    # A replica cut off (a partition) when the primary dies: what was written since is lost.
    engine = Engine(StoreSpec("redis", primary.url, prefix=prefix).open(), Policy(lease=LEASE))
    before = [f"replicated-{i}" for i in range(20)]
    during = [f"lagging-{i}" for i in range(20)]
    tally = Tally()
    batch(engine, ledger, before, tally)
    wait_until(lambda: client.execute_command("WAIT", 1, 100) == 1, 10, "replication")
    link.blackhole = True
    batch(engine, ledger, during, tally)
    # What a store that WAITs after its writes would have been told: WAIT counts replicas
    # that acknowledged this connection's last write (and so everything written before it).
    client.execute_command("SET", f"{prefix}wait-probe", "1")
    unacked = client.execute_command("WAIT", 1, 100)
    primary.kill()
    promoted: Any = replica.client()
    promoted.execute_command("REPLICAOF", "NO", "ONE")
    survivor = Engine(StoreSpec("redis", replica.url, prefix=prefix).open(), Policy(lease=LEASE))
    lost_before, lost_during = missing(survivor, before), missing(survivor, during)
    batch(survivor, ledger, before + during, tally)  # callers retry against the new primary
    ledger.calls(tally.rows)
    client.close()
    promoted.close()

    assert unacked == 0  # WAIT would have told the caller the record was not replicated
    assert (lost_before, lost_during) == (0, len(during))
    assert ledger.effects() == dict.fromkeys(before + during, 1)
    record(
        Figures.from_ledger(
            "4. failover to a lagging replica, no WAIT",
            "replication link partitioned, primary SIGKILLed, replica promoted",
            ledger,
            notes=[
                f"records lost: {lost_during} written while the replica lagged, "
                f"{lost_before} replicated before; WAIT 1 100 answered {unacked} (not "
                "replicated) for them"
            ],
        )
    )
