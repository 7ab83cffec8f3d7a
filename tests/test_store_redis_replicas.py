"""``replicas=``: the Redis store waits (``WAIT``) for replicas to acknowledge each claim
and each completion, and fails closed when they do not.

Each test starts its own primary (and, where it needs one, a replica of it) on loopback.
The failover scenarios (a partitioned replica promoted) are in
``tests/faults/test_redis_restarts.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis

from langchain_idempotent import Policy
from langchain_idempotent.core.engine import Engine
from langchain_idempotent.core.events import IdempotencyEvent
from langchain_idempotent.core.record import ClaimOutcome, State
from langchain_idempotent.core.store import ClaimRequest, CompleteRequest, Held
from langchain_idempotent.errors import StoreUnavailableError
from langchain_idempotent.stores import RedisIdempotencyStore
from tests.support.redis_servers import RedisServer, wait_replicating

pytestmark = pytest.mark.redis

LEASE_MS = 60_000
TTL_MS = 3_600_000


def replica_of(primary: RedisServer) -> RedisServer:
    replica = RedisServer(replicaof=f"127.0.0.1 {primary.port}")
    wait_replicating(primary, replica)
    return replica


@pytest.fixture(scope="module")
def replicated() -> Iterator[tuple[RedisServer, RedisServer]]:
    """A primary with one synced replica."""
    with RedisServer(repl_diskless_sync_delay="0") as primary, replica_of(primary) as replica:
        yield primary, replica


@pytest.fixture(scope="module")
def alone() -> Iterator[RedisServer]:
    """A primary with no replica: every WAIT answers 0."""
    with RedisServer() as primary:
        yield primary


def waits(server: RedisServer) -> int:
    with contextlib.closing(server.client()) as c:
        return int(c.info("commandstats").get("cmdstat_wait", {}).get("calls", 0))


@pytest.fixture
def prefix() -> str:
    return f"test-replicas:{time.monotonic_ns()}:"


def store_on(server: RedisServer, prefix: str, **options: Any) -> RedisIdempotencyStore:
    return RedisIdempotencyStore.from_url(server.url, prefix=prefix, **options)


@contextlib.contextmanager
def paused(server: RedisServer) -> Iterator[None]:
    server.pause()
    try:
        yield
    finally:
        server.resume()


def claim(store: RedisIdempotencyStore, key: str, owner: str = "a") -> Any:
    return store.claim(
        ClaimRequest(key, owner=owner, fingerprint="fp", lease_ms=LEASE_MS, ttl_ms=TTL_MS)
    )


def complete(store: RedisIdempotencyStore, key: str, fence: int, owner: str = "a") -> Any:
    return store.complete(
        CompleteRequest(
            key,
            owner=owner,
            fence=fence,
            fingerprint="fp",
            payload=b"result",
            failed=False,
            ttl_ms=TTL_MS,
        )
    )


# -- acknowledged ----------------------------------------------------------------------------


def test_with_replicas_each_claim_and_completion_is_followed_by_one_wait(
    replicated: tuple[RedisServer, RedisServer], prefix: str
) -> None:
    primary, replica = replicated
    store = store_on(primary, prefix, replicas=1, replica_timeout=2.0)
    complete(store, "warm-up", claim(store, "warm-up").fence)  # scripts loaded (EVAL)
    before = waits(primary)
    granted = claim(store, "k")
    assert granted.outcome is ClaimOutcome.ACQUIRED
    assert complete(store, "k", granted.fence).stored
    assert claim(store, "k").outcome is ClaimOutcome.REPLAY
    assert waits(primary) - before == 3  # claim, completion, and the replaying claim
    # The replica has the completed record as soon as the completion returned.
    replica_store = store_on(replica, prefix)
    copy = replica_store.get("k")
    assert copy is not None and copy.state is State.COMPLETED
    store.close()
    replica_store.close()


async def test_with_replicas_the_async_path_waits_too(
    replicated: tuple[RedisServer, RedisServer], prefix: str
) -> None:
    primary, _replica = replicated
    store = store_on(primary, prefix, replicas=1, replica_timeout=timedelta(seconds=2))
    warm = await store.aclaim(
        ClaimRequest("warm", owner="a", fingerprint="fp", lease_ms=LEASE_MS, ttl_ms=TTL_MS)
    )
    await store.acomplete(
        CompleteRequest(
            "warm",
            owner="a",
            fence=warm.fence,
            fingerprint="fp",
            payload=b"",
            failed=False,
            ttl_ms=1,
        )
    )  # both scripts loaded
    before = waits(primary)
    granted = await store.aclaim(
        ClaimRequest("k", owner="a", fingerprint="fp", lease_ms=LEASE_MS, ttl_ms=TTL_MS)
    )
    assert granted.outcome is ClaimOutcome.ACQUIRED
    done = await store.acomplete(
        CompleteRequest(
            "k",
            owner="a",
            fence=granted.fence,
            fingerprint="fp",
            payload=b"result",
            failed=False,
            ttl_ms=TTL_MS,
        )
    )
    assert done.stored
    assert waits(primary) - before == 2
    await store.aclose()


def test_without_replicas_no_wait_is_sent(
    replicated: tuple[RedisServer, RedisServer], prefix: str
) -> None:
    primary, _replica = replicated
    store = store_on(primary, prefix)
    before = waits(primary)
    granted = claim(store, "k")
    complete(store, "k", granted.fence)
    assert waits(primary) == before
    store.close()


def test_a_reloaded_script_is_still_followed_by_its_wait(
    replicated: tuple[RedisServer, RedisServer], prefix: str
) -> None:
    primary, _replica = replicated
    store = store_on(primary, prefix, replicas=1, replica_timeout=2.0)
    claim(store, "warm")
    with contextlib.closing(primary.client()) as c:
        c.script_flush()
    granted = claim(store, "k")  # NOSCRIPT, then EVAL: both followed by WAIT, in step
    assert granted.outcome is ClaimOutcome.ACQUIRED
    assert complete(store, "k", granted.fence).stored
    assert claim(store, "k").outcome is ClaimOutcome.REPLAY
    store.close()


# -- not acknowledged: fail closed -------------------------------------------------------------


def test_an_unacknowledged_claim_is_released_and_refused(alone: RedisServer, prefix: str) -> None:
    store = store_on(alone, prefix, replicas=1, replica_timeout=0.05)
    with pytest.raises(StoreUnavailableError, match=r"claim .* on 0 of the 1 replica") as info:
        claim(store, "k")
    assert info.value.key == "k"
    record = store.get("k")
    assert record is not None and record.state is State.FREE  # nobody holds a lease
    store.close()


async def test_an_unacknowledged_async_claim_is_released_and_refused(
    alone: RedisServer, prefix: str
) -> None:
    store = store_on(alone, prefix, replicas=1, replica_timeout=0.05)
    with pytest.raises(StoreUnavailableError, match="was not run"):
        await store.aclaim(
            ClaimRequest("k", owner="a", fingerprint="fp", lease_ms=LEASE_MS, ttl_ms=TTL_MS)
        )
    record = await store.aget("k")
    assert record is not None and record.state is State.FREE
    await store.aclose()


@pytest.mark.parametrize("face", ["one", "batch"])
def test_an_unacknowledged_takeover_is_given_back_uncertain_not_as_a_clean_key(
    alone: RedisServer, prefix: str, face: str
) -> None:
    # a's attempt entered its effect and died; b's takeover is not acknowledged. Released,
    # the key would be FREE and c would start cleanly, never asking reconcile=; abandoned,
    # c takes over, told the effect may have happened.
    writer = store_on(alone, prefix)
    first = writer.claim(
        ClaimRequest("k", owner="a", fingerprint="fp", lease_ms=1, ttl_ms=TTL_MS, boundary=True)
    )
    assert writer.mark_effect(Held("k", owner="a", fence=first.fence))
    time.sleep(0.01)
    store = store_on(alone, prefix, replicas=1, replica_timeout=0.05)
    take = ClaimRequest("k", "b", "fp", LEASE_MS, TTL_MS, boundary=True)
    with pytest.raises(StoreUnavailableError, match="replica") as refused:
        if face == "one":
            store.claim(take)
        else:
            store.claim_many([take, ClaimRequest("other", "b", "fp", LEASE_MS, TTL_MS)])
    # The message says what happened: the takeover was not released.
    assert "the claim was released" not in str(refused.value)
    assert "outcome still unknown" in str(refused.value)
    record = writer.get("k")
    assert record is not None and record.state is State.RUNNING and record.effect == "entered"
    if face == "batch":  # the fresh claim beside it is released as before
        assert writer.get("other").state is State.FREE  # type: ignore[union-attr]
    nxt = writer.claim(
        ClaimRequest("k", owner="c", fingerprint="fp", lease_ms=LEASE_MS, ttl_ms=TTL_MS)
    )
    assert (nxt.outcome, nxt.entered) == (ClaimOutcome.TAKEOVER, True)
    writer.close()
    store.close()


def test_a_replay_needs_no_acknowledgement(alone: RedisServer, prefix: str) -> None:
    writer = store_on(alone, prefix)
    granted = claim(writer, "k")
    complete(writer, "k", granted.fence)
    reader = store_on(alone, prefix, replicas=1, replica_timeout=0.05)
    assert claim(reader, "k").outcome is ClaimOutcome.REPLAY  # wrote nothing: no error
    writer.close()
    reader.close()


def test_an_unacknowledged_completion_is_stored_and_reported(
    replicated: tuple[RedisServer, RedisServer], prefix: str
) -> None:
    primary, replica = replicated
    store = store_on(primary, prefix, replicas=1, replica_timeout=0.05)
    granted = claim(store, "k")  # acknowledged
    with paused(replica), pytest.raises(StoreUnavailableError, match="stored on the master"):
        complete(store, "k", granted.fence)
    record = store.get("k")
    assert record is not None and record.state is State.COMPLETED
    store.close()


def test_the_engine_runs_nothing_when_the_claim_is_not_acknowledged(
    alone: RedisServer, prefix: str
) -> None:
    engine = Engine(store_on(alone, prefix, replicas=1, replica_timeout=0.05), Policy(lease=5))
    ran: list[int] = []
    with pytest.raises(StoreUnavailableError):
        engine.run("k", fingerprint="fp", action=lambda: ran.append(1))
    assert ran == []


def test_the_engine_returns_the_result_when_only_the_completion_is_not_acknowledged(
    replicated: tuple[RedisServer, RedisServer], prefix: str
) -> None:
    primary, replica = replicated
    events: list[IdempotencyEvent] = []
    store = store_on(primary, prefix, replicas=1, replica_timeout=0.05)
    engine = Engine(store, Policy(lease=5), on_event=events.append)

    def refund() -> str:
        replica.pause()  # the replica stops acknowledging while the tool runs
        return "refunded"

    try:
        assert engine.run("k", fingerprint="fp", action=refund) == "refunded"
    finally:
        replica.resume()
    errors = [e for e in events if e.kind == "store_error"]
    assert [e.detail["op"] for e in errors] == ["complete"]
    assert "replica" in errors[0].detail["error"]
    store.close()


# -- configuration ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"replicas": -1}, "replicas must be an int >= 0"),
        ({"replicas": True}, "replicas must be an int >= 0"),
        ({"replicas": 1, "replica_timeout": 0}, "WAIT 0 would block forever"),
        ({"retries": -1}, "retries must be an int >= 0"),
    ],
)
def test_bad_settings_are_refused_by_name(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RedisIdempotencyStore.from_url("redis://127.0.0.1:1/0", **options)
    with pytest.raises(ValueError, match=message):
        RedisIdempotencyStore.from_sentinel([("127.0.0.1", 1)], "mymaster", **options)
    if "retries" not in options:  # a client passed in brings its own retries
        with pytest.raises(ValueError, match=message):
            RedisIdempotencyStore(redis.Redis(port=1), **options)


def test_replicas_on_a_cluster_are_refused_at_construction() -> None:
    with pytest.raises(ValueError, match="not supported on a Redis Cluster"):
        RedisIdempotencyStore.from_url("redis+cluster://127.0.0.1:1", replicas=1)
    cluster_client: Any = redis.RedisCluster.__new__(redis.RedisCluster)
    with pytest.raises(ValueError, match="not supported on a Redis Cluster"):
        RedisIdempotencyStore(cluster_client, replicas=1)


# -- batched claims --------------------------------------------------------------------------


def _batch(*keys: str) -> list[ClaimRequest]:
    return [ClaimRequest(k, f"owner-{k}", "fp", LEASE_MS, TTL_MS) for k in keys]


def test_a_batched_claim_waits_for_the_replicas_once(
    replicated: tuple[RedisServer, RedisServer], prefix: str
) -> None:
    primary, _ = replicated
    store = store_on(primary, prefix, replicas=1, replica_timeout=2.0)
    # The first batch on a server that has not cached the script yet is sent again after
    # NOSCRIPT, WAIT with it; count a batch once the script is loaded.
    store.claim_many(_batch("warm-1", "warm-2"))
    before = waits(primary)
    claims = store.claim_many(_batch("a", "b", "c"))
    assert [c.outcome for c in claims] == [ClaimOutcome.ACQUIRED] * 3
    assert waits(primary) == before + 1  # one WAIT behind the three scripts
    store.close()


@pytest.mark.parametrize("face", ["sync", "async"])
def test_an_unacknowledged_batched_claim_releases_every_lease_it_took_and_is_refused(
    alone: RedisServer, prefix: str, face: str
) -> None:
    writer = store_on(alone, prefix)
    done = claim(writer, "done")
    complete(writer, "done", done.fence)
    store = store_on(alone, prefix, replicas=1, replica_timeout=0.05)
    requests = _batch("x", "y", "done")
    with pytest.raises(StoreUnavailableError, match="replica"):
        if face == "sync":
            store.claim_many(requests)
        else:
            asyncio.run(store.aclaim_many(requests))
    for key in ("x", "y"):
        record = store.get(key)
        assert record is not None and record.state is State.FREE  # nobody holds a lease
    assert store.get("done").state is State.COMPLETED  # type: ignore[union-attr]
    writer.close()
    store.close()
