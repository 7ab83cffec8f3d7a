"""The Redis store: the shared contract, plus what only a real Redis shows.

Every test runs against ``redis-server`` processes it starts itself
(``tests/support/redis_servers.py``): the session server from ``conftest.py``, a private
one where a test stops, pauses or reconfigures it, and one 3-master Cluster for the module.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import random
import statistics
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio
from redis.crc import key_slot

from langchain_idempotent.core.record import ClaimOutcome, State
from langchain_idempotent.core.store import ClaimRequest, CompleteRequest, Held
from langchain_idempotent.errors import CorruptRecordError, StoreUnavailableError
from langchain_idempotent.stores import RedisIdempotencyStore
from langchain_idempotent.stores.redis import _scripts as redis_scripts
from langchain_idempotent.testing import StoreContractTests
from tests.support.redis_servers import RedisCluster, RedisSentinel, RedisServer, free_port

pytestmark = pytest.mark.redis

LONG_MS = 60_000
TTL_MS = 3_600_000
FP = "fp-1"


class TestRedisStoreContract(StoreContractTests):
    # The store's clock is the server's (no test can move it): lease expiry is waited out
    # in real time, on leases of tens of ms (a round trip here is well under 1 ms).
    short_lease_ms = 60
    expiry_margin_ms = 25
    # A watch past a lease's deadline: still well under its 5 s timeout (a hang), with room
    # for a loaded CI machine running the other suites beside this one.
    late_return_s = 3.0

    @pytest.fixture
    async def store(
        self, redis_store: RedisIdempotencyStore
    ) -> AsyncIterator[RedisIdempotencyStore]:
        yield redis_store

    @pytest.fixture
    async def second_store(
        self, redis_server: RedisServer, store: RedisIdempotencyStore
    ) -> AsyncIterator[RedisIdempotencyStore]:
        s = RedisIdempotencyStore.from_url(redis_server.url, prefix=store.prefix)
        yield s
        await s.aclose()

    @pytest.fixture
    def corruptions(
        self, store: RedisIdempotencyStore, r: redis.Redis, tmp_path: Path
    ) -> dict[str, Callable[[str], None]]:
        def plant(fields: dict[str, Any]) -> Callable[[str], None]:
            def write(key: str) -> None:
                r.delete(rkey(store, key))
                r.hset(rkey(store, key), mapping=fields)

            return write

        def foreign(key: str) -> None:  # a value of another type, holding a pickle
            r.set(rkey(store, key), pickle.dumps(Boom(tmp_path / "ran")))

        planted = {name: plant(fields) for name, fields in MALFORMED.items()}
        return {**planted, "another type": foreign}


# -- helpers ------------------------------------------------------------------------------


@pytest.fixture
def r(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A raw client on the session server, to inspect and plant records."""
    client = redis_server.client()
    yield client
    client.close()


@pytest.fixture
def server() -> Iterator[RedisServer]:
    """A private server this test may stop, pause or reconfigure."""
    with RedisServer() as s:
        yield s


def rkey(store: RedisIdempotencyStore, key: str) -> str:
    return f"{store.prefix}{{{key}}}"


def claim(
    store: RedisIdempotencyStore,
    key: str,
    owner: str,
    *,
    lease_ms: int = LONG_MS,
    ttl_ms: int = TTL_MS,
    meta: dict[str, str] | None = None,
) -> Any:
    return store.claim(
        ClaimRequest(key, owner=owner, fingerprint=FP, lease_ms=lease_ms, ttl_ms=ttl_ms, meta=meta)
    )


def complete(store: RedisIdempotencyStore, key: str, owner: str, fence: int, payload: bytes) -> Any:
    return store.complete(
        CompleteRequest(
            key,
            owner=owner,
            fence=fence,
            fingerprint=FP,
            payload=payload,
            failed=False,
            ttl_ms=TTL_MS,
        )
    )


def server_now_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def evalsha_calls(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0)) + int(
        stats.get("cmdstat_eval", {}).get("calls", 0)
    )


def wait_for_subscriber(client: redis.Redis, channel: str) -> None:
    deadline = time.monotonic() + 5
    while dict(client.pubsub_numsub(channel)).get(channel.encode(), 0) < 1:
        assert time.monotonic() < deadline, "the waiter never subscribed"
        time.sleep(0.002)


# -- the record in Redis ------------------------------------------------------------------


def test_a_record_is_one_hash_whose_key_and_channel_share_a_cluster_slot(
    redis_store: RedisIdempotencyStore, r: redis.Redis
) -> None:
    claim(redis_store, "k1", "a", meta={"namespace": "shop", "thread_id": "t-1"})
    name = rkey(redis_store, "k1")
    assert r.type(name) == b"hash"
    fields = r.hgetall(name)
    assert fields[b"state"] == b"running"
    assert fields[b"owner"] == b"a"
    assert fields[b"fence"] == b"1"
    assert fields[b"version"] == b"1"
    assert fields[b"m:namespace"] == b"shop"
    assert fields[b"m:thread_id"] == b"t-1"
    assert b"payload" not in fields
    assert key_slot(name.encode()) == key_slot(f"{name}:done".encode())


@pytest.mark.parametrize("size", [0, 64, 65, 110, 128, 129, 64 * 96, 64 * 96 + 1, 20_000])
async def test_a_result_is_stored_in_pieces_that_keep_a_small_record_compact_and_read_back_exactly(
    redis_store: RedisIdempotencyStore, r: redis.Redis, size: int
) -> None:
    # Redis' default hash-max-listpack-value is 64: one longer value turns the whole hash
    # into a hash table (about 2.5 times the bytes), so a result is kept in pieces of at
    # most 64 bytes, up to 96 of them.
    payload = bytes(random.Random(size).randrange(256) for _ in range(size))
    c = claim(redis_store, "k", "a")
    assert complete(redis_store, "k", "a", c.fence, payload).stored
    name = rkey(redis_store, "k")
    pieces = [f for f in r.hkeys(name) if f.startswith(b"payload")]
    if size <= 64 * 96:
        assert len(pieces) == max(1, -(-size // 64))
        assert r.object("encoding", name) == b"listpack"
    else:
        assert pieces == [b"payload"]
    assert claim(redis_store, "k", "b").payload == payload  # replay
    areplay = await redis_store.aclaim(
        ClaimRequest("k", owner="b", fingerprint=FP, lease_ms=LONG_MS, ttl_ms=TTL_MS)
    )
    assert areplay.payload == payload
    assert redis_store.get("k").payload == payload  # type: ignore[union-attr]
    assert complete(redis_store, "k", "c", 9, b"late").payload == payload  # write-once
    [listed] = redis_store.list()
    assert listed.payload == payload


def test_retention_is_max_of_ttl_and_lease_on_claim_and_ttl_on_completion(
    redis_store: RedisIdempotencyStore, r: redis.Redis
) -> None:
    redis_store.claim(
        ClaimRequest("lease-longer", owner="a", fingerprint=FP, lease_ms=60_000, ttl_ms=10_000)
    )
    assert 55_000 < r.pttl(rkey(redis_store, "lease-longer")) <= 60_000

    c = redis_store.claim(
        ClaimRequest("ttl-longer", owner="a", fingerprint=FP, lease_ms=1_000, ttl_ms=TTL_MS)
    )
    assert TTL_MS - 5_000 < r.pttl(rkey(redis_store, "ttl-longer")) <= TTL_MS
    redis_store.complete(
        CompleteRequest(
            "ttl-longer",
            owner="a",
            fence=c.fence,
            fingerprint=FP,
            payload=b"r",
            failed=False,
            ttl_ms=5_000,
        )
    )
    assert 0 < r.pttl(rkey(redis_store, "ttl-longer")) <= 5_000


def test_renew_raises_the_expiry_to_the_lease_and_release_keeps_it(
    redis_store: RedisIdempotencyStore, r: redis.Redis
) -> None:
    c = redis_store.claim(
        ClaimRequest("k", owner="a", fingerprint=FP, lease_ms=1_000, ttl_ms=2_000)
    )
    assert redis_store.renew(Held("k", owner="a", fence=c.fence), lease_ms=30_000)
    assert 25_000 < r.pttl(rkey(redis_store, "k")) <= 30_000
    assert redis_store.release(Held("k", owner="a", fence=c.fence))
    assert 25_000 < r.pttl(rkey(redis_store, "k")) <= 30_000


def test_fences_keep_increasing_after_release_because_the_free_record_keeps_its_fence(
    redis_store: RedisIdempotencyStore, r: redis.Redis
) -> None:
    fences = []
    for owner in ("a", "b", "c", "d"):
        c = claim(redis_store, "k", owner)
        fences.append(c.fence)
        assert redis_store.release(Held("k", owner=owner, fence=c.fence))
        fields = r.hgetall(rkey(redis_store, "k"))
        assert (fields[b"state"], fields[b"owner"]) == (b"free", b"")
        assert int(fields[b"fence"]) == c.fence
    assert fences == [1, 2, 3, 4]


def test_a_stale_owner_cannot_renew_release_or_overwrite_the_new_owners_result(
    redis_store: RedisIdempotencyStore,
) -> None:
    old = claim(redis_store, "k", "a", lease_ms=100)
    time.sleep(0.15)
    new = claim(redis_store, "k", "b")
    assert (new.outcome, new.fence) == (ClaimOutcome.TAKEOVER, old.fence + 1)
    assert not redis_store.renew(Held("k", owner="a", fence=old.fence), lease_ms=LONG_MS)
    assert not redis_store.release(Held("k", owner="a", fence=old.fence))
    assert complete(redis_store, "k", "b", new.fence, b"new").stored
    late = complete(redis_store, "k", "a", old.fence, b"old")
    assert (late.stored, late.stale, late.payload) == (False, True, b"new")
    rec = redis_store.get("k")
    assert rec is not None
    assert (rec.state, rec.owner, rec.fence, rec.payload) == (State.COMPLETED, "b", 2, b"new")


def test_a_retried_claim_by_the_same_owner_is_owned_not_busy(
    redis_store: RedisIdempotencyStore, r: redis.Redis
) -> None:
    first = claim(redis_store, "k", "a", lease_ms=5_000)
    again = claim(redis_store, "k", "a", lease_ms=50_000)  # the first reply was "lost"
    assert (again.outcome, again.fence, again.attempt) == (ClaimOutcome.OWNED, first.fence, 1)
    rec = redis_store.get("k")
    assert rec is not None
    assert rec.lease_until - server_now_ms(r) > 45_000


def test_busy_reports_the_lease_left_on_the_server_clock_whatever_the_client_clock_says(
    redis_store: RedisIdempotencyStore, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = server_now_ms(r)
    claim(redis_store, "k", "a", lease_ms=20_000)
    after = server_now_ms(r)
    rec = redis_store.get("k")
    assert rec is not None
    assert before + 20_000 <= rec.lease_until <= after + 20_000

    monkeypatch.setattr(time, "time", lambda: 86_400.0)  # a client clock decades behind
    busy = claim(redis_store, "k", "b", lease_ms=20_000)
    now = server_now_ms(r)
    assert busy.outcome is ClaimOutcome.BUSY
    assert rec.lease_until - now <= busy.retry_after_ms <= rec.lease_until - before
    assert 19_000 < busy.retry_after_ms <= 20_000


# -- wake-ups -----------------------------------------------------------------------------


def test_a_waiter_is_woken_by_the_completion_message_within_a_few_ms_without_polling(
    redis_store: RedisIdempotencyStore, r: redis.Redis
) -> None:
    latencies = []
    for i in range(5):
        key = f"k{i}"
        c = claim(redis_store, key, "a")
        woke: list[float] = []

        def wait(key: str = key, fence: int = c.fence, woke: list[float] = woke) -> None:
            redis_store.watch(key, fence=fence, timeout=5.0)
            woke.append(time.monotonic())

        waiter = threading.Thread(target=wait)
        waiter.start()
        wait_for_subscriber(r, rkey(redis_store, key) + ":done")
        time.sleep(0.05)  # the waiter probes the record once, right after subscribing
        calls = evalsha_calls(r)
        time.sleep(0.2)
        assert evalsha_calls(r) == calls, "the waiter polled instead of waiting for a message"
        done = time.monotonic()
        complete(redis_store, key, "a", c.fence, b"r")
        waiter.join(5)
        assert woke, "the waiter was not woken"
        latencies.append(max(0.0, woke[0] - done))
    assert statistics.median(latencies) < 0.02, latencies
    assert max(latencies) < 0.25, latencies
    assert r.pubsub_numsub(rkey(redis_store, "k0") + ":done")[0][1] == 0  # connection closed


async def test_an_async_waiter_is_woken_by_the_completion_message_within_a_few_ms(
    redis_store: RedisIdempotencyStore, r: redis.Redis
) -> None:
    latencies = []
    for i in range(5):
        key = f"k{i}"
        c = await redis_store.aclaim(
            ClaimRequest(key, owner="a", fingerprint=FP, lease_ms=LONG_MS, ttl_ms=TTL_MS)
        )
        waiter = asyncio.create_task(redis_store.awatch(key, fence=c.fence, timeout=5.0))
        channel = rkey(redis_store, key) + ":done"
        deadline = time.monotonic() + 5
        while dict(r.pubsub_numsub(channel)).get(channel.encode(), 0) < 1:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.002)
        await asyncio.sleep(0.05)
        done = time.monotonic()
        await redis_store.acomplete(
            CompleteRequest(
                key,
                owner="a",
                fence=c.fence,
                fingerprint=FP,
                payload=b"r",
                failed=False,
                ttl_ms=TTL_MS,
            )
        )
        await asyncio.wait_for(waiter, 5)
        latencies.append(time.monotonic() - done)
    assert statistics.median(latencies) < 0.02, latencies
    assert max(latencies) < 0.25, latencies


# -- an unreachable server ----------------------------------------------------------------


def _every_operation(store: RedisIdempotencyStore) -> dict[str, Callable[[], object]]:
    return {
        "claim": lambda: claim(store, "k", "a"),
        "renew": lambda: store.renew(Held("k", owner="a", fence=1), lease_ms=1000),
        "complete": lambda: complete(store, "k", "a", 1, b"r"),
        "release": lambda: store.release(Held("k", owner="a", fence=1)),
        "get": lambda: store.get("k"),
        "delete": lambda: store.delete("k"),
        "watch": lambda: store.watch("k", fence=1, timeout=1.0),
        "list": lambda: store.list(),
    }


def test_a_stopped_server_makes_every_operation_raise_store_unavailable_quickly(
    server: RedisServer,
) -> None:
    store = RedisIdempotencyStore.from_url(
        server.url, socket_timeout=0.5, socket_connect_timeout=0.5, retries=1
    )
    assert claim(store, "before", "a").outcome is ClaimOutcome.ACQUIRED
    server.stop()
    for name, operation in _every_operation(store).items():
        started = time.monotonic()
        with pytest.raises(StoreUnavailableError) as info:
            operation()
        assert time.monotonic() - started < 2.0, name
        assert isinstance(info.value.__cause__, redis.RedisError), name
        if name != "list":
            assert info.value.key == "k", name
    server.restart()
    assert claim(store, "after", "a").outcome is ClaimOutcome.ACQUIRED  # it reconnects
    store.close()


def test_a_restarted_server_is_reconnected_by_the_retry_without_an_error(
    server: RedisServer,
) -> None:
    store = RedisIdempotencyStore.from_url(server.url, socket_timeout=1.0, retries=2)
    assert claim(store, "k1", "a").outcome is ClaimOutcome.ACQUIRED
    server.restart()  # the thread's connection is now dead
    assert claim(store, "k2", "a").outcome is ClaimOutcome.ACQUIRED

    no_retries = RedisIdempotencyStore.from_url(server.url, socket_timeout=1.0, retries=0)
    assert claim(no_retries, "k3", "a").outcome is ClaimOutcome.ACQUIRED
    server.restart()
    with pytest.raises(StoreUnavailableError):
        claim(no_retries, "k4", "a")
    assert claim(no_retries, "k4", "a").outcome is ClaimOutcome.ACQUIRED  # a fresh connection
    store.close()
    no_retries.close()


def test_after_the_server_drops_every_connection_one_retry_is_enough(
    server: RedisServer,
) -> None:
    # A restart or a reset kills the idle connections too: the retry must reconnect
    # rather than take the next dead one.
    store = RedisIdempotencyStore.from_url(server.url, retries=1)
    assert claim(store, "warm", "a").outcome is ClaimOutcome.ACQUIRED
    fast = store._clients.fast
    assert fast is not None
    held = [fast._take() for _ in range(4)]
    for h in held:
        h.conn.send_command("PING")
        assert h.conn.read_response() == b"PONG"
    for h in held:
        fast._put_back(h)
    with contextlib.closing(server.client()) as admin:
        assert admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes") >= 4  # type: ignore[no-untyped-call]
    assert claim(store, "k", "a").outcome is ClaimOutcome.ACQUIRED
    store.close()


def test_a_closed_store_returns_its_connections_and_works_again_on_next_use(
    redis_server: RedisServer, redis_prefix: str
) -> None:
    client = redis_server.client()
    store = RedisIdempotencyStore(client, prefix=redis_prefix)
    assert claim(store, "k1", "a").outcome is ClaimOutcome.ACQUIRED
    assert client.connection_pool._in_use_connections  # held by this thread
    store.close()
    assert not client.connection_pool._in_use_connections
    assert claim(store, "k1", "a").outcome is ClaimOutcome.OWNED
    store.close()
    client.close()


def test_a_hung_server_times_out_within_retries_times_socket_timeout_instead_of_hanging(
    server: RedisServer,
) -> None:
    store = RedisIdempotencyStore.from_url(
        server.url, socket_timeout=0.3, socket_connect_timeout=0.3, retries=1
    )
    assert claim(store, "before", "a").outcome is ClaimOutcome.ACQUIRED
    server.pause()
    try:
        started = time.monotonic()
        with pytest.raises(StoreUnavailableError) as info:
            claim(store, "k", "a")
        elapsed = time.monotonic() - started
        assert isinstance(info.value.__cause__, redis.TimeoutError)
        assert 0.3 <= elapsed < 0.3 * 2 + 1.0
    finally:
        server.resume()
    # The timed-out claim may have run once the server woke: retrying it never locks the
    # caller out of its own key.
    retried = claim(store, "k", "a").outcome
    assert retried in (ClaimOutcome.ACQUIRED, ClaimOutcome.OWNED)
    store.close()


async def test_an_async_connection_closed_under_a_write_is_a_store_error_not_a_crash(
    redis_server: RedisServer, redis_prefix: str
) -> None:
    # redis-py's asyncio connection can lose its writer between its "connected?" check and
    # the write. Before redis-py 8.2 that leaked an AttributeError or TypeError from its I/O
    # code (redis/redis-py#3546, #4287); 8.2 raises a ConnectionError itself (#4288). Either
    # way it must surface as the store being unavailable, not as a bug in the caller's code.
    store = RedisIdempotencyStore.from_url(redis_server.url, prefix=redis_prefix, retries=0)
    await store.aget("warm-up")
    client = store._async()
    [conn] = list(client.connection_pool._available_connections)
    normal = type(conn)
    conn.__class__ = type("Racy", (normal,), {"is_connected": property(lambda self: True)})
    conn._writer = None  # closed by another task after the check, on every write
    with pytest.raises(StoreUnavailableError, match="closed") as info:
        await store.aclaim(
            ClaimRequest("k", owner="a", fingerprint=FP, lease_ms=LONG_MS, ttl_ms=TTL_MS)
        )
    assert isinstance(info.value.__cause__, redis.ConnectionError)
    conn.__class__ = normal
    await conn.disconnect()
    claimed = await store.aclaim(
        ClaimRequest("k", owner="a", fingerprint=FP, lease_ms=LONG_MS, ttl_ms=TTL_MS)
    )
    assert claimed.outcome is ClaimOutcome.ACQUIRED
    await store.aclose()


async def test_an_async_connection_closed_under_a_write_once_is_retried_at_once(
    redis_server: RedisServer, redis_prefix: str
) -> None:
    # A stale pooled connection is not the server being down: the store resends at once,
    # even with retries=0, whichever way the installed redis-py reports the closed writer.
    store = RedisIdempotencyStore.from_url(redis_server.url, prefix=redis_prefix, retries=0)
    await store.aget("warm-up")
    [conn] = list(store._async().connection_pool._available_connections)
    normal = type(conn)
    raced = []

    def racy(self: Any) -> bool:
        # redis-py's write (send_packed_command, 5.0 to 8.2) asks "connected?" and then
        # writes: the race happens once, between the two.
        if sys._getframe(1).f_code.co_name == "send_packed_command":
            self.__class__ = normal
            raced.append(True)
        return True

    conn.__class__ = type("Racy", (normal,), {"is_connected": property(racy)})
    conn._writer = None
    claimed = await store.aclaim(
        ClaimRequest("k", owner="a", fingerprint=FP, lease_ms=LONG_MS, ttl_ms=TTL_MS)
    )
    assert raced, "the race was not simulated: redis-py's write path has changed"
    assert claimed.outcome is ClaimOutcome.ACQUIRED  # even with retries=0
    await store.aclose()


async def test_a_hung_server_times_out_on_the_async_path_too(server: RedisServer) -> None:
    store = RedisIdempotencyStore.from_url(
        server.url, socket_timeout=0.3, socket_connect_timeout=0.3, retries=1
    )
    await store.aget("warm-up")
    server.pause()
    try:
        started = time.monotonic()
        with pytest.raises(StoreUnavailableError) as info:
            await store.aclaim(
                ClaimRequest("k", owner="a", fingerprint=FP, lease_ms=LONG_MS, ttl_ms=TTL_MS)
            )
        assert time.monotonic() - started < 0.3 * 2 + 1.0
        assert info.value.key == "k"
        assert isinstance(info.value.__cause__, redis.TimeoutError)
    finally:
        server.resume()
    retried = await store.aclaim(
        ClaimRequest("k", owner="a", fingerprint=FP, lease_ms=LONG_MS, ttl_ms=TTL_MS)
    )
    assert retried.outcome in (ClaimOutcome.ACQUIRED, ClaimOutcome.OWNED)
    await store.aclose()


@pytest.mark.parametrize("protocol", [2, 3])
def test_describe_reads_the_servers_config_over_resp2_and_resp3(
    redis_server: RedisServer, protocol: int
) -> None:
    # CONFIG GET answers a map over RESP3 and a flat list of pairs over RESP2 (a client
    # built with protocol=2, and every client of redis-py before 8).
    client = redis.Redis.from_url(redis_server.url, protocol=protocol)
    try:
        [server] = RedisIdempotencyStore(client).describe()["servers"]
        assert server["appendfsync"] == client.config_get("appendfsync")["appendfsync"]
        assert server["save"] is not None
    finally:
        client.close()


def test_constructing_a_store_never_connects() -> None:
    nowhere = f"redis://127.0.0.1:{free_port()}/0"
    stores = [
        RedisIdempotencyStore.from_url(nowhere, retries=0),
        RedisIdempotencyStore.from_url(nowhere.replace("redis://", "redis+cluster://")),
        RedisIdempotencyStore.from_url(nowhere, cluster=True),
        RedisIdempotencyStore.from_url(f"unix:///nonexistent/{free_port()}.sock"),
        RedisIdempotencyStore.from_url(nowhere.replace("redis://", "rediss://")),
        RedisIdempotencyStore.from_sentinel([("127.0.0.1", free_port())], "mymaster"),
        RedisIdempotencyStore(redis.Redis(port=free_port())),
        RedisIdempotencyStore(async_client=redis.asyncio.Redis(port=free_port())),
    ]
    assert stores[4]._sync().connection_pool.connection_class is redis.SSLConnection
    assert stores[3]._sync().connection_pool.connection_class is redis.UnixDomainSocketConnection
    with pytest.raises(StoreUnavailableError):
        stores[0].get("k")  # the first use is what connects


# -- construction -------------------------------------------------------------------------


def test_from_url_sets_timeouts_whole_operation_retries_and_health_checks(
    redis_server: RedisServer,
) -> None:
    store = RedisIdempotencyStore.from_url(
        redis_server.url,
        socket_timeout=1.5,
        socket_connect_timeout=0.5,
        retries=4,
        health_check_interval=10,
    )
    client = store._sync()
    kwargs = client.connection_pool.connection_kwargs
    assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (1.5, 0.5)
    assert kwargs["health_check_interval"] == 10
    # Each connection makes one attempt (redis-py would otherwise retry the connect inside
    # every command retry); the store retries the whole operation 4 times.
    assert kwargs["retry"].get_retries() == 0
    assert store._clients.attempts is not None and store._clients.attempts.get_retries() == 4
    assert isinstance(client, redis.Redis)
    store.close()


async def test_from_url_builds_one_async_client_per_event_loop(redis_server: RedisServer) -> None:
    store = RedisIdempotencyStore.from_url(redis_server.url, socket_timeout=1.5, retries=2)
    client = store._async()
    assert client is store._async()
    kwargs = client.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] == 1.5
    assert kwargs["retry"].get_retries() == 0
    assert store._clients.aattempts is not None and store._clients.aattempts.get_retries() == 2

    def in_another_loop() -> object:
        async def go() -> object:
            await store.aget("k")
            other = store._async()
            await store.aclose()
            return other

        return asyncio.run(go())

    assert await asyncio.to_thread(in_another_loop) is not client
    assert await store.aget("k") is None
    await store.aclose()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"socket_timeout": -1}, "socket_timeout must be a positive duration"),
        ({"socket_timeout": 0}, "socket_timeout must be a positive duration"),
        ({"socket_timeout": "soon"}, "socket_timeout must be a duration in seconds"),
        ({"socket_connect_timeout": float("inf")}, "socket_connect_timeout must be a finite"),
        ({"health_check_interval": -30}, "health_check_interval must be a non-negative"),
        ({"replica_timeout": -0.1}, "replica_timeout must be a non-negative duration"),
    ],
)
def test_a_nonsense_timeout_is_refused_by_name_when_the_store_is_built(
    options: dict[str, Any], message: str
) -> None:
    # Before, a negative socket timeout was accepted here and failed on the first connect
    # ("Timeout value out of range"), and 0 made the sockets non-blocking.
    with pytest.raises(ValueError, match=message):
        RedisIdempotencyStore.from_url("redis://127.0.0.1:1/0", **options)
    with pytest.raises(ValueError, match=message):
        RedisIdempotencyStore.from_sentinel([("127.0.0.1", 1)], "mymaster", **options)


def test_timeouts_accept_a_timedelta_and_a_health_check_interval_of_zero_turns_checks_off() -> None:
    store = RedisIdempotencyStore.from_url(
        "redis://127.0.0.1:1/0",
        socket_timeout=timedelta(milliseconds=1500),
        socket_connect_timeout=0.5,
        health_check_interval=0,
    )
    kwargs = store._sync().connection_pool.connection_kwargs  # built, never connected
    assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (1.5, 0.5)
    assert kwargs["health_check_interval"] == 0
    store.close()


def test_a_store_with_only_one_client_names_what_to_pass_for_the_other_path(
    redis_server: RedisServer,
) -> None:
    sync_only = RedisIdempotencyStore(redis_server.client())
    with pytest.raises(TypeError, match=r"async_client=redis\.asyncio\.Redis"):
        asyncio.run(sync_only.aget("k"))
    async_only = RedisIdempotencyStore(async_client=redis.asyncio.Redis(port=redis_server.port))
    with pytest.raises(TypeError, match=r"client=redis.Redis\(...\)"):
        async_only.get("k")
    with pytest.raises(TypeError, match="from_url"):
        RedisIdempotencyStore()
    with pytest.raises(ValueError, match="braces"):
        RedisIdempotencyStore(redis_server.client(), prefix="idem:{x}:")


def test_a_client_passed_in_is_used_as_is_and_left_open(
    redis_server: RedisServer, redis_prefix: str
) -> None:
    client = redis_server.client(single_connection_client=True, decode_responses=True)
    store = RedisIdempotencyStore(client, prefix=redis_prefix)
    c = claim(store, "k", "a")
    complete(store, "k", "a", c.fence, b"\xff\x00 not utf-8")
    replay = claim(store, "k", "b")
    assert replay.payload == b"\xff\x00 not utf-8"  # bytes, whatever decode_responses says
    rec = store.get("k")
    assert rec is not None and rec.payload == b"\xff\x00 not utf-8"
    assert [rec.key for rec in store.list()] == ["k"]
    store.close()
    assert client.ping()  # not closed by the store
    client.close()


# -- scripts ------------------------------------------------------------------------------


def test_every_script_documents_its_keys_argv_and_reply() -> None:
    for name in ("_CLAIM", "_RENEW", "_COMPLETE", "_RELEASE", "_PROBE", "_DELETE"):
        body = getattr(redis_scripts, name)
        assert "KEYS[1]" in body and "Returns" in body, name
        if name != "_DELETE":  # the operator's delete is the one plain DEL
            assert "'DEL'" not in body and "'SET'" not in body, name


@pytest.mark.parametrize("path", ["fast", "client", "async"])
async def test_noscript_after_script_flush_is_handled(
    redis_server: RedisServer, r: redis.Redis, redis_prefix: str, path: str
) -> None:
    if path == "client":  # a single-connection client goes through execute_command
        store = RedisIdempotencyStore(
            redis_server.client(single_connection_client=True), prefix=redis_prefix
        )
    else:
        store = RedisIdempotencyStore.from_url(redis_server.url, prefix=redis_prefix)
    if path != "async":
        claim(store, "warm", "a")
    for i in range(2):
        r.script_flush()
        key = f"k{i}"
        if path == "async":
            c = await store.aclaim(
                ClaimRequest(key, owner="a", fingerprint=FP, lease_ms=LONG_MS, ttl_ms=TTL_MS)
            )
        else:
            c = claim(store, key, "a")
        assert c.outcome is ClaimOutcome.ACQUIRED
    assert r.script_exists(redis_scripts._CLAIM_SCRIPT.sha) == [True]
    await store.aclose()


def test_an_interrupted_round_trip_never_hands_its_reply_to_the_next_call(
    redis_store: RedisIdempotencyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = claim(redis_store, "done", "a")
    complete(redis_store, "done", "a", c.fence, b"r")
    fast = redis_store._clients.fast
    assert fast is not None and len(fast._idle) == 1
    conn = fast._idle[0].conn  # the one the next operation takes
    real = conn.read_response
    interrupts = [KeyboardInterrupt()]

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        if interrupts:
            raise interrupts.pop()
        return real(*args, **kwargs)

    monkeypatch.setattr(conn, "read_response", interrupted)
    with pytest.raises(KeyboardInterrupt):
        claim(redis_store, "done", "b")  # its REPLAY reply is left unread on the socket
    assert claim(redis_store, "fresh", "b").outcome is ClaimOutcome.ACQUIRED


# -- corrupt and planted records ----------------------------------------------------------

GOOD = {
    "version": "1",
    "state": "running",
    "owner": "a",
    "fence": "1",
    "lease_until": "99999999999999",
    "fingerprint": FP,
    "attempt": "1",
    "created_at": "1",
    "updated_at": "1",
    "effect": "unmarked",
}


class Boom:
    """Unpickling this creates ``marker``: proof that something unpickled it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, ...]:
        return (open, (str(self.marker), "w"))


#: Hashes the store must refuse, planted by the contract's corrupt-record test
#: (``TestRedisStoreContract.corruptions``).
MALFORMED: dict[str, dict[str, Any]] = {
    "unknown state": {**GOOD, "state": "exploded"},
    "unknown version": {**GOOD, "version": "99"},
    "garbled fence": {**GOOD, "fence": "one"},
    "missing field": {k: v for k, v in GOOD.items() if k != "fingerprint"},
    "no payload": {**GOOD, "state": "completed"},  # a result without a payload
    "foreign": {"data": "pickle"},
}


def test_a_record_an_earlier_development_build_wrote_is_refused_naming_it_and_left_untouched(
    redis_store: RedisIdempotencyStore, r: redis.Redis
) -> None:
    # One layout: development builds before the first release wrote records without the
    # side-effect mark. Such a record is never read as if it were this layout's.
    name = rkey(redis_store, "k")
    r.hset(name, mapping={k: v for k, v in GOOD.items() if k != "effect"})
    before = r.hgetall(name)
    for op in ("claim", "renew", "complete", "get"):
        with pytest.raises(CorruptRecordError) as info:
            _every_operation(redis_store)[op]()
        assert "a development build before 0.1.0 wrote it" in str(info.value), op
        assert "delete" in str(info.value), op
    assert r.hgetall(name) == before
    assert redis_store.delete("k")  # the way out: delete it, and the key starts afresh
    assert claim(redis_store, "k", "b").outcome is ClaimOutcome.ACQUIRED


def test_a_key_of_another_type_holding_a_pickle_is_corrupt_and_never_unpickled(
    redis_store: RedisIdempotencyStore, r: redis.Redis, tmp_path: Path
) -> None:
    r.set(rkey(redis_store, "k"), pickle.dumps(Boom(tmp_path / "ran")))
    for op in ("claim", "complete", "get"):
        with pytest.raises(CorruptRecordError):
            _every_operation(redis_store)[op]()
    assert not (tmp_path / "ran").exists()


async def test_a_planted_pickle_payload_is_handed_back_as_bytes_and_never_unpickled(
    redis_store: RedisIdempotencyStore, r: redis.Redis, tmp_path: Path
) -> None:
    planted = pickle.dumps(Boom(tmp_path / "ran"))
    r.hset(rkey(redis_store, "k"), mapping={**GOOD, "state": "completed", "payload": planted})
    replay = claim(redis_store, "k", "b")
    assert (replay.outcome, replay.payload) == (ClaimOutcome.REPLAY, planted)
    areplay = await redis_store.aclaim(
        ClaimRequest("k", owner="b", fingerprint=FP, lease_ms=LONG_MS, ttl_ms=TTL_MS)
    )
    assert areplay.payload == planted
    rec = redis_store.get("k")
    assert rec is not None and rec.payload == planted
    assert not (tmp_path / "ran").exists()


async def test_list_skips_corrupt_records_with_a_warning(
    redis_store: RedisIdempotencyStore, r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    claim(redis_store, "good", "a")
    r.hset(rkey(redis_store, "bad"), mapping={**GOOD, "version": "99"})
    with caplog.at_level(logging.WARNING, "langchain_idempotent.stores.redis"):
        assert [rec.key for rec in redis_store.list()] == ["good"]
        assert [rec.key for rec in await redis_store.alist()] == ["good"]
    assert "bad" in caplog.text


# -- listing ------------------------------------------------------------------------------


def test_list_sees_only_this_prefix_even_when_it_holds_glob_characters(
    redis_server: RedisServer, redis_prefix: str
) -> None:
    odd = RedisIdempotencyStore.from_url(redis_server.url, prefix=redis_prefix + "*?[x]\\:")
    plain = RedisIdempotencyStore.from_url(redis_server.url, prefix=redis_prefix)
    claim(odd, "k-odd", "a", meta={"thread_id": "t"})
    claim(plain, "k-plain", "a", meta={"thread_id": "t"})
    assert [rec.key for rec in odd.list()] == ["k-odd"]
    assert [rec.key for rec in plain.list(thread_id="t")] == ["k-plain"]
    assert odd.purge(thread_id="t") == 1
    assert [rec.key for rec in plain.list()] == ["k-plain"]
    odd.close()
    plain.close()


# -- eviction policy ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "warned"), [("allkeys-lru", True), ("volatile-lru", True), ("noeviction", False)]
)
def test_an_eviction_policy_that_can_evict_records_is_warned_about_once(
    server: RedisServer, caplog: pytest.LogCaptureFixture, policy: str, warned: bool
) -> None:
    server.client().config_set("maxmemory-policy", policy)
    store = RedisIdempotencyStore.from_url(server.url)
    with caplog.at_level(logging.WARNING, "langchain_idempotent.stores.redis"):
        claim(store, "k1", "a")
        claim(store, "k2", "a")
    warnings = [rec for rec in caplog.records if "maxmemory-policy" in rec.getMessage()]
    assert len(warnings) == (1 if warned else 0)
    store.close()


def test_a_server_that_refuses_config_is_used_without_a_warning(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    admin = server.client()
    admin.config_set("maxmemory-policy", "allkeys-lru")
    admin.acl_setuser(
        "app",
        enabled=True,
        passwords=["+secret"],
        keys=["*"],
        channels=["*"],
        commands=["+@all", "-config"],
    )
    store = RedisIdempotencyStore.from_url(f"redis://app:secret@127.0.0.1:{server.port}/0")
    with caplog.at_level(logging.DEBUG, "langchain_idempotent.stores.redis"):
        assert claim(store, "k", "a").outcome is ClaimOutcome.ACQUIRED
    assert not [rec for rec in caplog.records if rec.levelno >= logging.WARNING]
    store.close()


# -- connections --------------------------------------------------------------------------


def test_threads_share_the_stores_connections_one_operation_at_a_time(
    redis_store: RedisIdempotencyStore,
) -> None:
    outcomes: list[ClaimOutcome] = []
    lock = threading.Lock()

    def work(n: int) -> None:
        for i in range(30):
            got = claim(redis_store, f"shared-{i}", f"owner-{n}").outcome
            with lock:
                outcomes.append(got)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes.count(ClaimOutcome.ACQUIRED) == 30
    assert outcomes.count(ClaimOutcome.BUSY) == 8 * 30 - 30
    pool = redis_store._sync().connection_pool
    held = len(pool._in_use_connections)
    assert 1 <= held <= 8  # at most one per operation in flight, kept after the threads end
    # Threads that come and go one at a time (LangGraph's per-step executors) reuse one.
    for i in range(20):
        t = threading.Thread(target=claim, args=(redis_store, f"seq-{i}", "a"))
        t.start()
        t.join()
    assert len(pool._in_use_connections) == held
    redis_store.close()
    assert not pool._in_use_connections


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_forked_child_uses_its_own_connection_and_the_parent_keeps_working(
    redis_store: RedisIdempotencyStore,
) -> None:
    assert claim(redis_store, "parent-1", "p").outcome is ClaimOutcome.ACQUIRED
    pid = os.fork()
    if pid == 0:  # the child: must not read or write the parent's socket
        code = 1
        try:
            for i in range(20):
                if claim(redis_store, f"child-{i}", "c").outcome is not ClaimOutcome.ACQUIRED:
                    break
            else:
                code = 0
        finally:
            os._exit(code)
    for i in range(20):
        assert claim(redis_store, f"parent-{i + 2}", "p").outcome is ClaimOutcome.ACQUIRED
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert claim(redis_store, "child-0", "p").outcome is ClaimOutcome.BUSY


# -- deployments: unix socket, Sentinel, Cluster ------------------------------------------


async def test_a_unix_socket_url_works(tmp_path: Path) -> None:
    sock = tmp_path / "redis.sock"
    with RedisServer(unixsocket=str(sock), unixsocketperm="700") as s:
        assert s.running
        store = RedisIdempotencyStore.from_url(f"unix://{sock}")
        assert claim(store, "k", "a").outcome is ClaimOutcome.ACQUIRED
        c = await store.aclaim(
            ClaimRequest("k", owner="b", fingerprint=FP, lease_ms=LONG_MS, ttl_ms=TTL_MS)
        )
        assert c.outcome is ClaimOutcome.BUSY
        await store.aclose()


async def test_from_sentinel_follows_the_master_sentinel_names(server: RedisServer) -> None:
    with RedisSentinel(server) as sentinel:
        store = RedisIdempotencyStore.from_sentinel(
            sentinel.addresses, sentinel.service_name, socket_timeout=1.0
        )
        c = claim(store, "k", "a")
        complete(store, "k", "a", c.fence, b"r")
        replay = await store.aclaim(
            ClaimRequest("k", owner="b", fingerprint=FP, lease_ms=LONG_MS, ttl_ms=TTL_MS)
        )
        assert (replay.outcome, replay.payload) == (ClaimOutcome.REPLAY, b"r")
        assert server.client().exists(rkey(store, "k"))
        await store.aclose()


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    from tests.support.redis_servers import redis_server_available

    if not redis_server_available():
        pytest.skip("redis-server is not on PATH")
    with RedisCluster() as c:
        yield c


async def test_the_protocol_runs_on_a_three_master_cluster(
    cluster: RedisCluster, redis_prefix: str
) -> None:
    store = RedisIdempotencyStore.from_url(
        cluster.url.replace("redis://", "redis+cluster://"), prefix=redis_prefix
    )
    keys = [f"k{i}" for i in range(12)]
    slots = {key_slot(rkey(store, k).encode()) for k in keys}
    assert len(slots) > 3  # spread over the masters
    for k in keys:
        assert claim(store, k, "a", meta={"thread_id": "t"}).outcome is ClaimOutcome.ACQUIRED
    assert claim(store, "k0", "b").outcome is ClaimOutcome.BUSY
    for node in cluster.nodes:
        with contextlib.closing(node.client()) as c:
            c.script_flush()  # NOSCRIPT on every node

    waiter = asyncio.create_task(store.awatch("k0", fence=1, timeout=5.0))
    await asyncio.sleep(0.2)
    started = time.monotonic()
    assert complete(store, "k0", "a", 1, b"r").stored
    await asyncio.wait_for(waiter, 5)
    assert time.monotonic() - started < 0.25

    replay = await store.aclaim(
        ClaimRequest("k0", owner="b", fingerprint=FP, lease_ms=LONG_MS, ttl_ms=TTL_MS)
    )
    assert (replay.outcome, replay.payload) == (ClaimOutcome.REPLAY, b"r")
    assert await store.arelease(Held("k1", owner="a", fence=1))
    assert (
        await store.aclaim(
            ClaimRequest("k1", owner="b", fingerprint=FP, lease_ms=LONG_MS, ttl_ms=TTL_MS)
        )
    ).fence == 2
    assert sorted(rec.key for rec in store.list(thread_id="t")) == sorted(keys)
    assert len(await store.alist(thread_id="t")) == len(keys)
    assert store.purge(thread_id="t") == len(keys)
    assert store.list() == []
    store.close()
    await store.aclose()


@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get("IDEMPOTENCY_TEST_SLOW"),
    reason="the full contract on a Cluster takes ~30 s: set IDEMPOTENCY_TEST_SLOW=1 to run it",
)
class TestRedisClusterStoreContract(StoreContractTests):
    @pytest.fixture
    async def store(
        self, cluster: RedisCluster, redis_prefix: str
    ) -> AsyncIterator[RedisIdempotencyStore]:
        s = RedisIdempotencyStore.from_url(cluster.url, cluster=True, prefix=redis_prefix)
        yield s
        await s.aclose()
