"""Scenario 3: lost and slow replies between the store and Redis.

A :class:`FaultProxy` sits between the store and a throwaway Redis and faults the claim or
the completion script (matched on its SHA in the request): the request is reset before it
reaches Redis, its reply is dropped (the connection reset after Redis ran it), or stalled
(the client's socket timeout fires). The store runs with a 0.5 s socket timeout and 2
retries, so an error must surface within about (2 + 1) x (0.5 s + 0.5 s).

Every scenario runs on both client paths (the ``[sync]`` and ``[async]`` test ids):
``Engine.run`` with the store's sync methods and redis client, and ``Engine.arun`` with
its ``a``-methods and the ``redis.asyncio`` client that ``RedisIdempotencyStore.from_url``
builds for the running event loop.

What must hold: no duplicate effect; no record blocks callers longer than one lease; a
claim retried by the same owner (redis-py re-sends it after a lost reply) is recognised;
``StoreUnavailableError`` surfaces instead of a hang.
"""

from __future__ import annotations

import asyncio
import functools
import random
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, Literal, NoReturn

import pytest

from langchain_idempotent import (
    IdempotencyError,
    IdempotencyEvent,
    InProgressError,
    Policy,
    StoreUnavailableError,
)
from langchain_idempotent.core.engine import Engine
from langchain_idempotent.core.record import ClaimOutcome, Record, State
from langchain_idempotent.core.store import BaseIdempotencyStore
from langchain_idempotent.stores.redis._scripts import _CLAIM_SCRIPT, _COMPLETE_SCRIPT
from tests.support.faults import FaultProxy, Ledger, StoreSpec, Tally
from tests.support.redis_servers import RedisServer

from .report import Figures
from .workload import StaleFence, call_until_answered, refund

pytestmark = pytest.mark.redis

SOCKET_TIMEOUT = 0.5
RETRIES = 2
#: Longest an operation may take to fail when Redis stops answering on open connections:
#: every attempt times out, plus backoff and slack.
BOUND_S = (RETRIES + 1) * SOCKET_TIMEOUT + 1.5
#: ... and when every call must connect anew to a server that refuses or never answers:
#: the bound the store documents, (retries + 1) x (socket timeout + connect timeout).
UNREACHABLE_BOUND_S = (RETRIES + 1) * (SOCKET_TIMEOUT + SOCKET_TIMEOUT) + 0.5
LEASE = 1.0
CLAIM = _CLAIM_SCRIPT.sha.encode()
COMPLETE = _COMPLETE_SCRIPT.sha.encode()

Mode = Literal["sync", "async"]
MODES: list[Mode] = ["sync", "async"]
#: The store's sync operations, which the async path must never fall back to.
SYNC_OPERATIONS = ("claim", "renew", "complete", "release", "get", "watch")


class Caller:
    """Calls one engine the way a sync or an async application does.

    ``sync``: :meth:`Engine.run` and the store's sync methods. ``async``: :meth:`Engine.arun`
    and the store's ``a``-methods, all on one event loop that lives as long as the test
    (so the store's async client and its pooled connections do too); the store's sync
    operations are replaced by ones that fail the test, so that a scenario that passes on
    this path cannot have been served by the sync client.
    """

    def __init__(self, engine: Engine, mode: Mode) -> None:
        self.engine = engine
        self.mode = mode
        self._runner: asyncio.Runner | None = None
        if mode == "async":
            self._runner = asyncio.Runner()
            self.run("warm-up-async", lambda: "opens the async client's connection")
            for name in SYNC_OPERATIONS:
                setattr(engine.store, name, _sync_forbidden(name))

    @property
    def store(self) -> BaseIdempotencyStore:
        return self.engine.store

    def run(self, key: str, action: Callable[[], str]) -> str:
        """``action`` once for ``key`` through the engine (``fingerprint="fp"``)."""
        if self._runner is None:
            return self.engine.run(key, fingerprint="fp", action=action)

        async def tool() -> str:
            return action()

        return self._runner.run(self.engine.arun(key, fingerprint="fp", action=tool))

    def get(self, key: str) -> Record | None:
        if self._runner is None:
            return self.store.get(key)
        return self._runner.run(self.store.aget(key))

    def drop_connections(self) -> None:
        """Close the store's pooled connections: every later call must connect anew."""
        if self._runner is None:
            self.store.close()
        else:
            self._runner.run(self.store.aclose())

    def on_the_loop(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` on the async path's event loop."""
        assert self._runner is not None, "the sync path has no event loop"
        self._runner.run(work)

    def scenario(self, title: str) -> str:
        """The figures-table title: the sync path keeps the historical one."""
        return title if self.mode == "sync" else f"{title} (async)"

    def close(self) -> None:
        if self._runner is None:
            self.store.close()
            return
        try:
            self._runner.run(self.store.aclose())
        finally:
            self._runner.close()


def _sync_forbidden(name: str) -> Callable[..., NoReturn]:
    def forbidden(*args: object, **kwargs: object) -> NoReturn:
        raise AssertionError(f"the async path called the sync store.{name}()")

    return forbidden


@pytest.fixture
def proxy(redis_server: RedisServer) -> Iterator[FaultProxy]:
    with FaultProxy(redis_server.port) as p:
        yield p


@pytest.fixture(params=MODES)
def caller(request: pytest.FixtureRequest, proxy: FaultProxy, prefix: str) -> Iterator[Caller]:
    store = StoreSpec(
        "redis",
        proxy.url,
        prefix=prefix,
        socket_timeout=SOCKET_TIMEOUT,
        socket_connect_timeout=SOCKET_TIMEOUT,
        retries=RETRIES,
    ).open()
    engine = Engine(store, Policy(lease=LEASE, wait_timeout=10.0))
    engine.run("warm-up", fingerprint="fp", action=lambda: "loads the scripts into Redis")
    c = Caller(engine, request.param)
    yield c
    c.close()


def claims_seen(store: BaseIdempotencyStore) -> list[ClaimOutcome]:
    """Record the outcome of every claim (sync or async) made from now on."""
    outcomes: list[ClaimOutcome] = []
    claim, aclaim = store.claim, store.aclaim

    def observed(*args: Any, **kwargs: Any) -> Any:
        answer = claim(*args, **kwargs)
        outcomes.append(answer.outcome)
        return answer

    async def aobserved(*args: Any, **kwargs: Any) -> Any:
        answer = await aclaim(*args, **kwargs)
        outcomes.append(answer.outcome)
        return answer

    store.claim = observed  # type: ignore[method-assign]
    store.aclaim = aobserved  # type: ignore[method-assign]
    return outcomes


def batch(n: int, label: str) -> list[str]:
    return [f"{label}-{i}-{time.monotonic_ns()}" for i in range(n)]


def timed(fn: Callable[[], object]) -> tuple[object, float]:
    started = time.monotonic()
    try:
        value = fn()
    except Exception as exc:
        value = exc
    return value, time.monotonic() - started


@pytest.mark.parametrize(
    ("action", "outcome"),
    [("drop_reply", ClaimOutcome.OWNED), ("stall_reply", ClaimOutcome.OWNED)],
)
def test_a_claim_whose_reply_is_lost_is_resent_by_the_same_owner_and_recognised(
    caller: Caller,
    proxy: FaultProxy,
    ledger: Ledger,
    record: Callable[[Figures], None],
    campaign: bool,
    action: str,
    outcome: ClaimOutcome,
) -> None:
    keys = batch(50 if campaign else 5, "claim-lost")
    outcomes = claims_seen(caller.store)
    rules = [proxy.add_rule((CLAIM, k.encode()), action) for k in keys]  # type: ignore[arg-type]
    tally = Tally()
    for key in keys:
        tally.ok(key, caller.run(key, refund(ledger, key)))
    ledger.calls(tally.rows)
    assert [r.hits for r in rules] == [1] * len(keys)
    assert outcomes == [outcome] * len(keys)  # Redis ran the lost claim; the re-send is OWNED
    assert ledger.executions() == dict.fromkeys(keys, 1)
    assert ledger.effects() == dict.fromkeys(keys, 1)
    record(
        Figures.from_ledger(
            caller.scenario(
                f"3. claim reply {'lost' if action == 'drop_reply' else 'stalled'} once per key"
            ),
            f"{len(rules)} claim replies {'lost' if action == 'drop_reply' else 'stalled'}",
            ledger,
            notes=[f"every re-sent claim answered {outcome.value.upper()}"],
        )
    )


def test_a_claim_reset_before_it_reaches_redis_is_simply_retried(
    caller: Caller, proxy: FaultProxy, ledger: Ledger, record: Callable[[Figures], None]
) -> None:
    keys = batch(5, "claim-reset")
    outcomes = claims_seen(caller.store)
    rules = [proxy.add_rule((CLAIM, k.encode()), "reset_request") for k in keys]
    tally = Tally()
    for key in keys:
        tally.ok(key, caller.run(key, refund(ledger, key)))
    ledger.calls(tally.rows)
    assert [r.hits for r in rules] == [1] * len(keys)
    assert outcomes == [ClaimOutcome.ACQUIRED] * len(keys)
    assert ledger.effects() == dict.fromkeys(keys, 1)
    record(
        Figures.from_ledger(
            caller.scenario("3. claim reset before Redis"),
            f"{len(rules)} connections reset",
            ledger,
        )
    )


def test_a_claim_that_never_gets_a_reply_fails_closed_in_bounded_time_and_blocks_one_lease(
    caller: Caller, proxy: FaultProxy, ledger: Ledger, record: Callable[[Figures], None]
) -> None:
    key = batch(1, "claim-stalled")[0]
    rule = proxy.add_rule(CLAIM, "stall_reply", times=None)
    tally = Tally()
    error, took = timed(lambda: caller.run(key, refund(ledger, key)))
    assert isinstance(error, StoreUnavailableError) and error.key == key
    tally.error(key, error)
    assert took < BOUND_S, f"the store took {took:.2f}s to give up"
    assert ledger.executions() == {}  # fail closed: the tool never ran
    hits = rule.hits
    proxy.clear_rules()

    # Redis did run the claim (only its replies were lost): the record is held by the first
    # caller's owner token until its lease runs out; then the next caller takes over.
    held = caller.get(key)
    assert held is not None and held.state is State.RUNNING
    outcomes = claims_seen(caller.store)
    started = time.monotonic()
    tally.ok(key, caller.run(key, refund(ledger, key)))
    blocked = time.monotonic() - started
    ledger.calls(tally.rows)
    assert outcomes[-1] is ClaimOutcome.TAKEOVER
    assert blocked < LEASE + 0.5
    assert ledger.effects() == {key: 1}
    record(
        Figures.from_ledger(
            caller.scenario("3. claim reply never arrives"),
            f"{hits} claim replies stalled (every retry)",
            ledger,
            stuck=int(blocked > LEASE + 0.5),
            notes=[
                f"StoreUnavailableError after {took:.2f}s (bound {BOUND_S:.1f}s)",
                f"next caller blocked {blocked:.2f}s (lease {LEASE:g}s), then TAKEOVER "
                "(told takeover although the tool never ran)",
            ],
        )
    )


def test_a_completion_whose_reply_is_lost_is_resent_and_the_caller_gets_its_result(
    caller: Caller, proxy: FaultProxy, ledger: Ledger, record: Callable[[Figures], None]
) -> None:
    keys = batch(5, "complete-lost")
    rules = [proxy.add_rule((COMPLETE, k.encode()), "drop_reply") for k in keys]
    tally = Tally()
    for key in keys:
        result = caller.run(key, refund(ledger, key))
        tally.ok(key, result)
        assert caller.run(key, refund(ledger, key)) == result
        tally.ok(key, result)
    ledger.calls(tally.rows)
    assert [r.hits for r in rules] == [1] * len(keys)
    # Every lost reply was re-sent and answered, not given up on as a store error.
    assert "store_error" not in caller.engine.stats()
    assert ledger.executions() == dict.fromkeys(keys, 1)
    for key in keys:
        rec = caller.get(key)
        assert rec is not None and rec.state is State.COMPLETED
    record(
        Figures.from_ledger(
            caller.scenario("3. completion reply dropped"),
            f"{len(rules)} completion replies lost",
            ledger,
            notes=["re-sent completion answered with the stored (own) result"],
        )
    )


def test_a_completion_that_never_reaches_redis_expires_and_the_rerun_is_deduplicated(
    caller: Caller, proxy: FaultProxy, ledger: Ledger, record: Callable[[Figures], None]
) -> None:
    key = batch(1, "complete-stalled")[0]
    rule = proxy.add_rule(COMPLETE, "stall_request", times=None)
    tally = Tally()
    first, took = timed(lambda: caller.run(key, refund(ledger, key)))
    # The effect happened: the caller gets its result; the store error is an event.
    assert isinstance(first, str)
    tally.ok(key, first)
    assert took < BOUND_S
    hits = rule.hits
    proxy.clear_rules()
    started = time.monotonic()
    second = caller.run(key, refund(ledger, key))
    blocked = time.monotonic() - started
    tally.ok(key, second)
    ledger.calls(tally.rows)
    assert ledger.executions() == {key: 2}  # the lease expired with no result: a re-run
    assert ledger.effects() == {key: 1}  # ... which the downstream deduplicated by key
    assert ledger.requests() == {"applied": 1, "duplicate": 1}
    assert first.split("|")[0] == second.split("|")[0]  # the same downstream answer
    assert blocked < LEASE + 0.5
    record(
        Figures.from_ledger(
            caller.scenario("3. completion never reaches Redis"),
            f"{hits} completion requests blackholed",
            ledger,
            stuck=int(blocked > LEASE + 0.5),
            notes=[
                "DUPLICATE RUN: without a downstream that dedupes on the key the effect "
                "would have applied twice",
                f"next caller blocked {blocked:.2f}s (one lease)",
            ],
        )
    )


async def acall_until_answered(
    engine: Engine,
    key: str,
    action: Callable[[], str],
    tally: Tally,
    *,
    pause: float,
    deadline_s: float = 30.0,
) -> None:
    """The async twin of :func:`workload.call_until_answered` (same retries and backoff);
    the tool sleeps ``pause`` on the loop before it acts, so racing tasks interleave."""

    async def tool() -> str:
        await asyncio.sleep(pause)
        return action()

    rng = random.Random()
    delay = 0.01
    give_up = time.monotonic() + deadline_s
    while True:
        try:
            result = await engine.arun(key, fingerprint="fp", action=tool)
        except (StoreUnavailableError, InProgressError) as exc:
            tally.error(key, exc)
            if time.monotonic() > give_up:
                return
            await asyncio.sleep(delay * (0.5 + rng.random()))
            delay = min(delay * 2, 0.2)
            continue
        except (IdempotencyError, StaleFence) as exc:
            tally.error(key, exc)
            return
        tally.ok(key, result)
        return


def test_connections_reset_throughout_a_batch_cause_no_duplicate_effect(
    caller: Caller,
    proxy: FaultProxy,
    ledger: Ledger,
    record: Callable[[Figures], None],
    campaign: bool,
) -> None:
    keys = batch(200 if campaign else 40, "reset-batch")
    stop = threading.Event()
    resets = 0

    def resetter() -> None:
        nonlocal resets
        while not stop.wait(0.03):
            proxy.reset_all()
            resets += 1

    tallies = [Tally() for _ in range(4)]
    # Keys whose completion the store never acknowledged (after its retries): the only
    # legitimate reason for the tool to run again once the lease has expired.
    unacknowledged: list[str] = []

    def completion_lost(event: IdempotencyEvent) -> None:
        if event.kind == "store_error" and event.detail.get("op") == "complete":
            unacknowledged.append(event.key)

    caller.engine.on_event = completion_lost

    # Every caller calls every key: duplicates race through resets. The sync path races
    # four threads; the async path four tasks on one event loop (one shared async client).
    def thread(tally: Tally) -> None:
        for key in keys:
            call_until_answered(caller.engine, key, refund(ledger, key, sleep=0.005), tally)

    async def task(tally: Tally) -> None:
        for key in keys:
            await acall_until_answered(caller.engine, key, refund(ledger, key), tally, pause=0.005)

    async def tasks() -> None:
        await asyncio.gather(*(task(t) for t in tallies))

    chaos = threading.Thread(target=resetter)
    chaos.start()
    try:
        if caller.mode == "sync":
            threads = [threading.Thread(target=thread, args=(t,)) for t in tallies]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
        else:
            caller.on_the_loop(tasks())
    finally:
        stop.set()
        chaos.join()
    ledger.calls([row for t in tallies for row in t.rows])
    effects = ledger.effects()
    assert set(effects) == set(keys) and set(effects.values()) == {1}
    # The downstream deduplicates on the key, so the effects alone would hide a protocol
    # that lets racing callers run the tool: every re-run must follow a lost completion.
    reruns = {k: n - 1 for k, n in ledger.executions().items() if n > 1}
    unexplained = {k: n for k, n in reruns.items() if n > unacknowledged.count(k)}
    assert unexplained == {}, f"the tool re-ran with its completion acknowledged: {unexplained}"
    answered = {k for k, r, _ in (row for t in tallies for row in t.rows) if r is not None}
    assert answered == set(keys)
    racers = "threads" if caller.mode == "sync" else "tasks on one event loop"
    record(
        Figures.from_ledger(
            caller.scenario("3. connections reset mid-batch"),
            f"{resets} resets of every open connection (every 30 ms)",
            ledger,
            notes=[f"{len(keys)} keys x 4 racing {racers}; callers retry on errors"],
        )
    )


@pytest.mark.parametrize("mode", ["refused", "blackholed"])
def test_an_unreachable_redis_fails_closed_in_bounded_time(
    caller: Caller,
    proxy: FaultProxy,
    ledger: Ledger,
    record: Callable[[Figures], None],
    mode: str,
) -> None:
    caller.drop_connections()  # every call must connect anew
    if mode == "refused":
        proxy.set_down(True)
    else:
        proxy.blackhole = True
        proxy.reset_all()
    keys = batch(3 if mode == "refused" else 1, f"unreachable-{mode}")
    tally = Tally()
    times = []

    def run(key: str) -> object:
        return caller.run(key, refund(ledger, key))

    for key in keys:
        error, took = timed(functools.partial(run, key))
        assert isinstance(error, StoreUnavailableError), error
        tally.error(key, error)
        times.append(took)
    ledger.calls(tally.rows)
    assert ledger.executions() == {}
    assert max(times) < UNREACHABLE_BOUND_S, f"slowest call failed after {max(times):.2f}s"
    record(
        Figures.from_ledger(
            caller.scenario(f"3. Redis unreachable ({mode})"),
            "every connection " + ("reset on accept" if mode == "refused" else "silent"),
            ledger,
            notes=[
                f"each call failed closed in <= {max(times):.2f}s (socket timeout "
                f"{SOCKET_TIMEOUT:g}s, {RETRIES} retries)"
            ],
        )
    )


@pytest.mark.parametrize("path", MODES)
@pytest.mark.timeout(30)  # a socket timeout not honoured would hang here
def test_a_hung_redis_fails_after_retries_plus_one_attempts_each_cut_by_the_socket_timeout(
    proxy: FaultProxy, path: Mode
) -> None:
    timeout, retries = 0.2, 2
    store = StoreSpec(
        "redis", proxy.url, socket_timeout=timeout, socket_connect_timeout=timeout, retries=retries
    ).open()
    proxy.blackhole = True

    async def aget() -> object:
        try:
            return await store.aget("hung")
        finally:
            await store.aclose()

    def get() -> object:
        try:
            return store.get("hung")
        finally:
            store.close()

    error, _ = timed(get if path == "sync" else lambda: asyncio.run(aget()))
    assert isinstance(error, StoreUnavailableError)
    # Every attempt connected (the partition accepts connections) and hung until the socket
    # timeout cut it; then a fresh connection was tried: the first attempt and its retries.
    assert proxy.connections == retries + 1
