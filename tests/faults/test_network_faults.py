"""Scenario 3: lost and slow replies between the store and Redis.

A :class:`FaultProxy` sits between the store and a throwaway Redis and faults the claim or
the completion script (matched on its SHA in the request): the request is reset before it
reaches Redis, its reply is dropped (the connection reset after Redis ran it), or stalled
(the client's socket timeout fires). The store runs with a 0.5 s socket timeout and 2
retries, so an error must surface within about (2 + 1) x (0.5 s + 0.5 s).

What must hold: no duplicate effect; no record blocks callers longer than one lease; a
claim retried by the same owner (redis-py re-sends it after a lost reply) is recognised;
``StoreUnavailableError`` surfaces instead of a hang.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from fault_helpers import FaultProxy, Ledger, StoreSpec, Tally
from redis_servers import RedisServer

from langchain_idempotent import Engine, Policy, StoreUnavailableError
from langchain_idempotent.record import ClaimOutcome, State
from langchain_idempotent.stores.redis import _CLAIM_SCRIPT, _COMPLETE_SCRIPT

from .report import Figures
from .workload import call_until_answered, refund

pytestmark = pytest.mark.redis

SOCKET_TIMEOUT = 0.5
RETRIES = 2
#: Longest an operation may take to fail when Redis stops answering on open connections:
#: every attempt times out, plus backoff and slack.
BOUND_S = (RETRIES + 1) * SOCKET_TIMEOUT + 1.5
#: ... and when it accepts connections but never answers (a hung or SIGSTOPped server):
#: redis-py retries the connect + handshake inside each command attempt, so the timeouts
#: multiply — (retries + 1)^2 of them, not the (retries + 1) the store documents.
HUNG_BOUND_S = (RETRIES + 1) ** 2 * SOCKET_TIMEOUT + 1.5
LEASE = 1.0
CLAIM = _CLAIM_SCRIPT.sha.encode()
COMPLETE = _COMPLETE_SCRIPT.sha.encode()


@pytest.fixture
def proxy(redis_server: RedisServer) -> Iterator[FaultProxy]:
    with FaultProxy(redis_server.port) as p:
        yield p


@pytest.fixture
def engine(proxy: FaultProxy, prefix: str) -> Iterator[Engine]:
    spec = StoreSpec(
        "redis",
        proxy.url,
        prefix=prefix,
        socket_timeout=SOCKET_TIMEOUT,
        socket_connect_timeout=SOCKET_TIMEOUT,
        retries=RETRIES,
    )
    store = spec.open()
    e = Engine(store, Policy(lease=LEASE, wait_timeout=10.0))
    e.run("warm-up", fingerprint="fp", action=lambda: "loads the scripts into Redis")
    yield e
    store.close()


def claims_seen(engine: Engine) -> list[ClaimOutcome]:
    """Record the outcome of every claim the engine makes from now on."""
    outcomes: list[ClaimOutcome] = []
    claim = engine.store.claim

    def observed(*args: object, **kwargs: object) -> object:
        answer = claim(*args, **kwargs)  # type: ignore[arg-type]
        outcomes.append(answer.outcome)
        return answer

    engine.store.claim = observed  # type: ignore[method-assign, assignment]
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
    engine: Engine,
    proxy: FaultProxy,
    ledger: Ledger,
    record: Callable[[Figures], None],
    campaign: bool,
    action: str,
    outcome: ClaimOutcome,
) -> None:
    keys = batch(50 if campaign else 5, "claim-lost")
    outcomes = claims_seen(engine)
    rules = [proxy.add_rule((CLAIM, k.encode()), action) for k in keys]  # type: ignore[arg-type]
    tally = Tally()
    for key in keys:
        tally.ok(key, engine.run(key, fingerprint="fp", action=refund(ledger, key)))
    ledger.calls(tally.rows)
    assert [r.hits for r in rules] == [1] * len(keys)
    assert outcomes == [outcome] * len(keys)  # Redis ran the lost claim; the re-send is OWNED
    assert ledger.executions() == dict.fromkeys(keys, 1)
    assert ledger.effects() == dict.fromkeys(keys, 1)
    record(
        Figures.from_ledger(
            f"3. claim reply {'lost' if action == 'drop_reply' else 'stalled'} once per key",
            f"{len(rules)} claim replies {'lost' if action == 'drop_reply' else 'stalled'}",
            ledger,
            notes=[f"every re-sent claim answered {outcome.value.upper()}"],
        )
    )


def test_a_claim_reset_before_it_reaches_redis_is_simply_retried(
    engine: Engine, proxy: FaultProxy, ledger: Ledger, record: Callable[[Figures], None]
) -> None:
    keys = batch(5, "claim-reset")
    outcomes = claims_seen(engine)
    rules = [proxy.add_rule((CLAIM, k.encode()), "reset_request") for k in keys]
    tally = Tally()
    for key in keys:
        tally.ok(key, engine.run(key, fingerprint="fp", action=refund(ledger, key)))
    ledger.calls(tally.rows)
    assert [r.hits for r in rules] == [1] * len(keys)
    assert outcomes == [ClaimOutcome.ACQUIRED] * len(keys)
    assert ledger.effects() == dict.fromkeys(keys, 1)
    record(
        Figures.from_ledger(
            "3. claim reset before Redis", f"{len(rules)} connections reset", ledger
        )
    )


def test_a_claim_that_never_gets_a_reply_fails_closed_in_bounded_time_and_blocks_one_lease(
    engine: Engine, proxy: FaultProxy, ledger: Ledger, record: Callable[[Figures], None]
) -> None:
    key = batch(1, "claim-stalled")[0]
    rule = proxy.add_rule(CLAIM, "stall_reply", times=None)
    tally = Tally()
    error, took = timed(lambda: engine.run(key, fingerprint="fp", action=refund(ledger, key)))
    assert isinstance(error, StoreUnavailableError) and error.key == key
    tally.error(key, error)
    assert took < BOUND_S, f"the store took {took:.2f}s to give up"
    assert ledger.executions() == {}  # fail closed: the tool never ran
    hits = rule.hits
    proxy.clear_rules()

    # Redis did run the claim (only its replies were lost): the record is held by the first
    # caller's owner token until its lease runs out; then the next caller takes over.
    held = engine.store.get(key)
    assert held is not None and held.state is State.RUNNING
    outcomes = claims_seen(engine)
    started = time.monotonic()
    tally.ok(key, engine.run(key, fingerprint="fp", action=refund(ledger, key)))
    blocked = time.monotonic() - started
    ledger.calls(tally.rows)
    assert outcomes[-1] is ClaimOutcome.TAKEOVER
    assert blocked < LEASE + 0.5
    assert ledger.effects() == {key: 1}
    record(
        Figures.from_ledger(
            "3. claim reply never arrives",
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
    engine: Engine, proxy: FaultProxy, ledger: Ledger, record: Callable[[Figures], None]
) -> None:
    keys = batch(5, "complete-lost")
    rules = [proxy.add_rule((COMPLETE, k.encode()), "drop_reply") for k in keys]
    tally = Tally()
    for key in keys:
        result = engine.run(key, fingerprint="fp", action=refund(ledger, key))
        tally.ok(key, result)
        assert engine.run(key, fingerprint="fp", action=refund(ledger, key)) == result
        tally.ok(key, result)
    ledger.calls(tally.rows)
    assert [r.hits for r in rules] == [1] * len(keys)
    assert ledger.executions() == dict.fromkeys(keys, 1)
    for key in keys:
        rec = engine.store.get(key)
        assert rec is not None and rec.state is State.COMPLETED
    record(
        Figures.from_ledger(
            "3. completion reply dropped",
            f"{len(rules)} completion replies lost",
            ledger,
            notes=["re-sent completion answered with the stored (own) result"],
        )
    )


def test_a_completion_that_never_reaches_redis_expires_and_the_rerun_is_deduplicated(
    engine: Engine, proxy: FaultProxy, ledger: Ledger, record: Callable[[Figures], None]
) -> None:
    key = batch(1, "complete-stalled")[0]
    rule = proxy.add_rule(COMPLETE, "stall_request", times=None)
    tally = Tally()
    first, took = timed(lambda: engine.run(key, fingerprint="fp", action=refund(ledger, key)))
    # The effect happened: the caller gets its result; the store error is an event.
    assert isinstance(first, str)
    tally.ok(key, first)
    assert took < BOUND_S
    hits = rule.hits
    proxy.clear_rules()
    started = time.monotonic()
    second = engine.run(key, fingerprint="fp", action=refund(ledger, key))
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
            "3. completion never reaches Redis",
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


def test_connections_reset_throughout_a_batch_cause_no_duplicate_effect(
    engine: Engine,
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

    def caller(tally: Tally) -> None:
        for key in keys:  # every thread calls every key: duplicates race through resets
            call_until_answered(engine, key, refund(ledger, key, sleep=0.005), tally)

    chaos = threading.Thread(target=resetter)
    chaos.start()
    threads = [threading.Thread(target=caller, args=(t,)) for t in tallies]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    stop.set()
    chaos.join()
    ledger.calls([row for t in tallies for row in t.rows])
    effects = ledger.effects()
    assert set(effects) == set(keys) and set(effects.values()) == {1}
    answered = {k for k, r, _ in (row for t in tallies for row in t.rows) if r is not None}
    assert answered == set(keys)
    record(
        Figures.from_ledger(
            "3. connections reset mid-batch",
            f"{resets} resets of every open connection (every 30 ms)",
            ledger,
            notes=[f"{len(keys)} keys x 4 racing threads; callers retry on errors"],
        )
    )


@pytest.mark.parametrize("mode", ["refused", "blackholed"])
def test_an_unreachable_redis_fails_closed_in_bounded_time(
    engine: Engine,
    proxy: FaultProxy,
    ledger: Ledger,
    record: Callable[[Figures], None],
    mode: str,
) -> None:
    engine.store.close()  # drop pooled connections: every call must connect anew
    if mode == "refused":
        proxy.set_down(True)
    else:
        proxy.blackhole = True
        proxy.reset_all()
    keys = batch(3 if mode == "refused" else 1, f"unreachable-{mode}")
    tally = Tally()
    times = []

    def run(key: str) -> object:
        return engine.run(key, fingerprint="fp", action=refund(ledger, key))

    for key in keys:
        error, took = timed(functools.partial(run, key))
        assert isinstance(error, StoreUnavailableError), error
        tally.error(key, error)
        times.append(took)
    ledger.calls(tally.rows)
    assert ledger.executions() == {}
    bound = BOUND_S if mode == "refused" else HUNG_BOUND_S
    assert max(times) < bound
    record(
        Figures.from_ledger(
            f"3. Redis unreachable ({mode})",
            "every connection " + ("reset on accept" if mode == "refused" else "silent"),
            ledger,
            notes=[
                f"each call failed closed in <= {max(times):.2f}s (socket timeout "
                f"{SOCKET_TIMEOUT:g}s, {RETRIES} retries)"
            ],
        )
    )


def test_a_hung_redis_fails_within_retries_plus_one_socket_timeouts(proxy: FaultProxy) -> None:
    timeout, retries = 0.2, 2
    store = StoreSpec(
        "redis", proxy.url, socket_timeout=timeout, socket_connect_timeout=timeout, retries=retries
    ).open()
    proxy.blackhole = True
    error, took = timed(lambda: store.get("hung"))
    assert isinstance(error, StoreUnavailableError)
    assert took < (retries + 1) * timeout + 0.5
