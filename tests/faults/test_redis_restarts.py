"""Scenario 4: Redis restarts, and what replica acknowledgement (``replicas=``) buys.

- Without persistence (``save ""``, ``appendonly no``) a restart loses every record: the
  tool runs again for every key, and only the downstream's deduplication on the key we
  hand it prevents a duplicate effect. Callers before and after the restart get results of
  different runs (the same downstream answer).
- With ``appendonly yes`` + ``appendfsync always`` every acknowledged record survives a
  crash (SIGKILL): nothing runs again. A crash in the middle of a batch only re-runs the
  calls whose completion never reached Redis, after one lease.
- ``WAIT``: without ``replicas=``, records written while the replica lags are lost when it
  is promoted (the downstream key still prevents a duplicate effect). With
  ``RedisIdempotencyStore.from_url(url, replicas=1)`` every claim and completion is followed
  by ``WAIT 1 <replica_timeout>`` on the same connection: while the replica is cut off no
  tool runs (claims fail closed and are released), a completion the replica missed is
  reported, and after the failover no acknowledged record is missing. Its cost is measured
  against the same store without it.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from langchain_idempotent import Policy, StoreUnavailableError
from langchain_idempotent.core.engine import Engine
from langchain_idempotent.core.record import State
from langchain_idempotent.core.store import ClaimRequest, CompleteRequest
from langchain_idempotent.stores import RedisIdempotencyStore
from tests.support.faults import FaultProxy, Ledger, StoreSpec, Tally, percentile, wait_until
from tests.support.redis_servers import RedisServer, free_port, wait_replicating

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
        wait_replicating(primary, replica)
        yield primary, replica, link


def _claim_and_complete(store: Any, key: str) -> float:
    """One claim and one completion through the store; the seconds they took."""
    started = time.perf_counter()
    granted = store.claim(
        ClaimRequest(key, owner="o", fingerprint="fp", lease_ms=30_000, ttl_ms=600_000)
    )
    store.complete(
        CompleteRequest(
            key,
            owner="o",
            fence=granted.fence,
            fingerprint="fp",
            payload=b"ok",
            failed=False,
            ttl_ms=600_000,
        )
    )
    return time.perf_counter() - started


def test_what_replica_acknowledgement_costs(prefix: str, record: Callable[[Figures], None]) -> None:
    with (
        RedisServer(repl_diskless_sync_delay="0") as primary,
        RedisServer(replicaof=f"127.0.0.1 {primary.port}") as replica,
    ):
        wait_replicating(primary, replica)
        without = StoreSpec("redis", primary.url, prefix=prefix).open()
        acked: Any = RedisIdempotencyStore.from_url(
            primary.url, prefix=prefix, replicas=1, replica_timeout=0.1
        )
        _claim_and_complete(without, "warm-up")  # load the scripts
        plain: list[float] = []
        waited: list[float] = []
        refused = 0
        for i in range(300):  # interleaved, so that machine noise hits both alike
            plain.append(_claim_and_complete(without, f"plain-{i}"))
            try:
                waited.append(_claim_and_complete(acked, f"acked-{i}"))
            except StoreUnavailableError:
                refused += 1
        without.close()
        acked.close()
    plain_us, acked_us = percentile(plain, 0.5) * 1e6, percentile(waited, 0.5) * 1e6
    p99_plain, p99_acked = percentile(plain, 0.99) * 1e6, percentile(waited, 0.99) * 1e6
    record(
        Figures(
            "4. cost of replicas=1 (WAIT 1 100 after each claim and completion)",
            "none (300 rounds of each, interleaved)",
            calls=600,
            errors=Counter({"StoreUnavailableError": refused}) if refused else Counter(),
            notes=[
                f"store claim + completion: p50 {plain_us:.0f} -> {acked_us:.0f} us "
                f"({acked_us / plain_us:.2f}x), p99 {p99_plain:.0f} -> {p99_acked:.0f} us "
                f"(loopback, one replica); {refused} of 300 refused for want of an "
                "acknowledgement within 100 ms"
            ],
        )
    )
    assert acked_us > plain_us  # the acknowledgement is a real extra wait
    assert refused < 3  # a healthy replica acknowledges every write in time


def test_without_replica_acknowledgement_lagging_replicas_lose_records(
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
            "4. failover to a lagging replica, no replicas=",
            "replication link partitioned, primary SIGKILLed, replica promoted",
            ledger,
            notes=[
                f"records lost: {lost_during} written while the replica lagged, "
                f"{lost_before} replicated before; WAIT 1 100 answered {unacked} (not "
                "replicated) for them"
            ],
        )
    )


def test_with_replicas_1_a_cut_off_replica_stops_every_tool_and_failover_loses_nothing_acked(
    primary_and_replica: tuple[RedisServer, RedisServer, FaultProxy],
    ledger: Ledger,
    prefix: str,
    record: Callable[[Figures], None],
) -> None:
    primary, replica, link = primary_and_replica
    store: Any = RedisIdempotencyStore.from_url(
        primary.url, prefix=prefix, replicas=1, replica_timeout=0.1
    )
    engine = Engine(store, Policy(lease=LEASE))
    before = [f"acked-{i}" for i in range(20)]
    during = [f"cut-off-{i}" for i in range(20)]
    tally = Tally()
    batch(engine, ledger, before, tally)

    # The link goes down while the tool runs: the claim was acknowledged, the completion
    # is not. The caller still gets its result; the promoted replica holds the claim.
    def cut() -> None:
        link.blackhole = True

    mid_run = engine.run("mid-run", fingerprint="fp", action=refund(ledger, "mid-run", after=cut))
    tally.ok("mid-run", mid_run)
    # Cut off: every claim is refused (and released) and no tool runs.
    refused = 0
    for key in during:
        try:
            engine.run(key, fingerprint="fp", action=refund(ledger, key))
        except StoreUnavailableError as exc:
            assert "was not run" in str(exc)
            tally.error(key, exc)
            refused += 1
    ran_while_cut_off = sum(ledger.executions().get(k, 0) for k in during)

    primary.kill()
    promoted: Any = replica.client()
    promoted.execute_command("REPLICAOF", "NO", "ONE")
    survivor = Engine(StoreSpec("redis", replica.url, prefix=prefix).open(), Policy(lease=LEASE))
    lost = missing(survivor, before)
    held = survivor.store.get("mid-run")
    batch(survivor, ledger, [*before, "mid-run", *during], tally)  # callers retry
    ledger.calls(tally.rows)
    store.close()
    promoted.close()

    assert refused == len(during) and ran_while_cut_off == 0
    assert lost == 0  # every acknowledged record survived the failover
    assert held is not None and held.state is State.RUNNING  # the claim was replicated
    assert ledger.executions()["mid-run"] == 2  # taken over after its lease, deduplicated
    assert ledger.effects() == dict.fromkeys([*before, "mid-run", *during], 1)
    record(
        Figures.from_ledger(
            "4. failover with replicas=1 (WAIT after each claim and completion)",
            "replica cut off mid-run; primary SIGKILLed, replica promoted",
            ledger,
            notes=[
                f"while cut off: {refused} of {len(during)} claims refused, 0 tools ran; "
                f"acknowledged records lost in the failover: {lost}; the claim of the call "
                "whose completion was not acknowledged survived (RUNNING), so the next "
                "caller took it over after its lease and the downstream deduplicated the "
                "re-run on the key"
            ],
        )
    )
