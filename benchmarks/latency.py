"""Per-call latency cases, and the sampler that interleaves them in shuffled rounds.

A case is one table cell: a row (what is measured) and a column (``replay`` or ``first
run``). Each case is an operation ``op(arg)`` and a way to make ``n`` arguments for one
batch (fresh keys for a first run, the same warmed-up key for a replay). Every round visits
both placements in random order and, within a placement, every case in random order, so
drift and noise from other processes fall on all cases alike; ratios against ``r.ping()``
are taken within the same rounds and placement.

Cases whose action runs count its executions: a first run must execute once per call and
a replay never, which is what the smoke test checks (never the timings).
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import random
import socket
import statistics
import time
import traceback
import uuid
import warnings
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import redis

from langchain_idempotent.core.context import side_effect

from . import ours
from .floor import LuaFloor
from .reference import ReferenceIdempotency
from .server import Placement, RedisServer, place
from .stats import summary

__all__ = ["Context", "LatencyCase", "build_cases", "run_latency"]

REPLAY = "replay"
FIRST_RUN = "first run"

#: Table rows, in order: (row id, label).
ROWS: list[tuple[str, str]] = [
    ("ping", "one `r.ping()` through `redis.Redis`"),
    ("raw_ping", "raw socket + hiredis PING — the floor"),
    ("reference", "reference approach (GET / SET NX / DEL)"),
    ("powertools", "Powertools' Redis idempotency layer"),
    ("floor_client", "minimal 2-round-trip Lua protocol through `redis.Redis`"),
    ("floor_held", "the same on a connection held from the pool"),
    ("ours_redis", "ours, `RedisIdempotencyStore`"),
    ("ours_redis_execute", "ours, Redis, through redis-py's `execute_command` (fast path off)"),
    ("ours_sqlite", "ours, `SqliteIdempotencyStore`"),
    ("ours_memory", "ours, `InMemoryIdempotencyStore`"),
    ("ours_redis_marked", "ours, Redis, the action inside `side_effect()` (`boundary=True`)"),
    ("ours_sqlite_marked", "ours, SQLite, the action inside `side_effect()` (`boundary=True`)"),
    ("graph_plain", "LangGraph ToolNode step, tool unwrapped"),
    ("graph_memory", "LangGraph ToolNode step, tool wrapped (in-memory store)"),
    ("graph_redis", "LangGraph ToolNode step, tool wrapped (Redis store)"),
    ("graph_floor", "… tool unwrapped, inside the minimal 2-round-trip Lua protocol"),
]


@dataclass
class Context:
    """What case builders share: the server, a scratch directory, and cleanups."""

    server: RedisServer
    workdir: str
    stack: ExitStack
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    def client(self) -> redis.Redis:
        c = self.server.client()
        self.stack.callback(c.close)
        return c


class Counter:
    """Counts how often an action ran; the action returns a small JSON-able result."""

    def __init__(self) -> None:
        self.n = 0

    def action(self) -> dict[str, Any]:
        self.n += 1
        return {"ok": True, "n": 1}

    def count(self) -> int:
        return self.n


@dataclass
class LatencyCase:
    row: str
    column: str
    op: Callable[[Any], object] | None = None
    make_args: Callable[[int], Sequence[Any]] = lambda n: [None] * n
    #: How many times the measured action has run, if the case has one.
    executions: Callable[[], int] | None = None
    #: Whether each call must run the action (first run) or never (replay).
    runs_action: bool = False
    unavailable: str | None = None
    error: str | None = None
    calls: int = 0
    #: Executions seen during this case's own timed batches.
    executed: int = 0
    samples: dict[str, list[int]] = field(default_factory=dict)
    #: Per placement, the median of each round's batch in µs (drift and noise show here).
    batch_medians: dict[str, list[float]] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.row}:{self.column}"

    @property
    def active(self) -> bool:
        return self.op is not None and self.unavailable is None and self.error is None

    def counts(self) -> dict[str, Any]:
        if self.executions is None:
            return {}
        expected = self.calls if self.runs_action else 0
        return {"calls": self.calls, "executions": self.executed, "expected_executions": expected}


def _fresh_keys(prefix: str) -> Callable[[int], list[str]]:
    counter = itertools.count()

    def make(n: int) -> list[str]:
        return [f"{prefix}:{next(counter)}" for _ in range(n)]

    return make


def _const(value: Any) -> Callable[[int], list[Any]]:
    return lambda n: [value] * n


# -- baselines -------------------------------------------------------------------------


def _ping_cases(ctx: Context) -> list[LatencyCase]:
    r = ctx.client()
    r.ping()

    def ping(_: Any) -> object:
        return r.ping()

    return [LatencyCase("ping", REPLAY, ping)]


def _raw_ping_cases(ctx: Context) -> list[LatencyCase]:
    try:
        import hiredis
    except ImportError as exc:
        return [LatencyCase("raw_ping", REPLAY, unavailable=f"not installed: {exc}")]
    sock = socket.create_connection(("127.0.0.1", ctx.server.port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    ctx.stack.callback(sock.close)
    reader = hiredis.Reader()
    request = b"*1\r\n$4\r\nPING\r\n"

    def raw_ping(_: Any) -> object:
        sock.sendall(request)
        while True:
            reader.feed(sock.recv(65536))
            reply = reader.gets()
            if reply is not False:
                return reply

    raw_ping(None)
    return [LatencyCase("raw_ping", REPLAY, raw_ping)]


def _reference_cases(ctx: Context) -> list[LatencyCase]:
    ref = ReferenceIdempotency(ctx.client())
    counter = Counter()
    replay_key = f"bench:{ctx.run_id}:ref:replay"
    ref.run(replay_key, counter.action)
    act = counter.action

    def run(key: str) -> object:
        return ref.run(key, act)

    return [
        LatencyCase("reference", REPLAY, run, _const(replay_key), counter.count, False, None),
        LatencyCase(
            "reference",
            FIRST_RUN,
            run,
            _fresh_keys(f"bench:{ctx.run_id}:ref:first"),
            counter.count,
            True,
        ),
    ]


def _floor_cases(ctx: Context, held: bool) -> list[LatencyCase]:
    row = "floor_held" if held else "floor_client"
    floor = LuaFloor(ctx.client(), held=held)
    ctx.stack.callback(floor.close)
    counter = Counter()
    act = counter.action
    replay_key = f"bench:{ctx.run_id}:{row}:replay"
    floor.run(replay_key, act)

    def run(key: str) -> object:
        return floor.run(key, act)

    first = _fresh_keys(f"bench:{ctx.run_id}:{row}:first")
    return [
        LatencyCase(row, REPLAY, run, _const(replay_key), counter.count, False),
        LatencyCase(row, FIRST_RUN, run, first, counter.count, True),
    ]


class _FakeLambdaContext:
    """What Powertools reads from a Lambda context: the time left (plenty)."""

    function_name = "bench"
    memory_limit_in_mb = 128
    invoked_function_arn = "arn:aws:lambda:local:0:function:bench"
    aws_request_id = "bench"

    def get_remaining_time_in_millis(self) -> int:
        return 300_000


def _powertools_cases(ctx: Context) -> list[LatencyCase]:
    try:
        from aws_lambda_powertools.utilities.idempotency import (
            IdempotencyConfig,
            idempotent_function,
        )
        from aws_lambda_powertools.utilities.idempotency.persistence.redis import (
            CachePersistenceLayer,
        )
    except ImportError as exc:
        reason = f"not installed ({exc.name or exc}); pip install 'langchain-idempotent[bench]'"
        return [
            LatencyCase("powertools", REPLAY, unavailable=reason),
            LatencyCase("powertools", FIRST_RUN, unavailable=reason),
        ]
    warnings.filterwarnings("ignore", module=r"aws_lambda_powertools.*")
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    client: Any = ctx.client()
    layer = CachePersistenceLayer(client=client)
    config = IdempotencyConfig()
    lambda_context: Any = _FakeLambdaContext()
    config.register_lambda_context(lambda_context)  # as a Lambda handler would
    counter = Counter()

    def body(payload: dict[str, Any]) -> dict[str, Any]:
        return counter.action()

    decorate: Any = idempotent_function
    step: Callable[..., Any] = decorate(
        body,
        data_keyword_argument="payload",
        persistence_store=layer,
        config=config,
        key_prefix=f"bench:{ctx.run_id}:pt",
    )

    replay_payload = {"order": "replay"}
    step(payload=replay_payload)
    fresh = _fresh_keys("first")

    def run(payload: dict[str, Any]) -> object:
        return step(payload=payload)

    return [
        LatencyCase("powertools", REPLAY, run, _const(replay_payload), counter.count, False),
        LatencyCase(
            "powertools",
            FIRST_RUN,
            run,
            lambda n: [{"order": k} for k in fresh(n)],
            counter.count,
            True,
        ),
    ]


# -- ours ------------------------------------------------------------------------------


def _ours_cases(ctx: Context, kind: str, *, marked: bool = False) -> list[LatencyCase]:
    """``marked``: the tool declares ``boundary=True`` and runs its action inside
    ``side_effect()`` (one store write more per first run; a replay runs nothing)."""
    row = f"ours_{kind}_marked" if marked else f"ours_{kind}"
    store = ours.make_store(kind, redis_url=ctx.server.url, workdir=ctx.workdir)
    ctx.stack.callback(store.close)
    engine = ours.make_engine(store, boundary=marked)
    counter = Counter()
    act = counter.action
    if marked:

        def act() -> dict[str, Any]:
            with side_effect():
                return counter.action()

    replay_key = f"bench:{ctx.run_id}:{row}:replay"
    engine.run(replay_key, fingerprint="fp", action=act)

    def run(key: str) -> object:
        return engine.run(key, fingerprint="fp", action=act)

    return [
        LatencyCase(row, REPLAY, run, _const(replay_key), counter.count, False),
        LatencyCase(
            row,
            FIRST_RUN,
            run,
            _fresh_keys(f"bench:{ctx.run_id}:{row}:first"),
            counter.count,
            True,
        ),
    ]


# -- LangGraph -------------------------------------------------------------------------


def _graph_cases(ctx: Context) -> list[LatencyCase]:
    from .graph_step import build_floor_step, build_step, step_input

    out: list[LatencyCase] = []
    variants: list[tuple[str, str | None]] = [("graph_plain", None)]
    variants += [("graph_memory", "memory"), ("graph_redis", "redis"), ("graph_floor", "floor")]
    for row, kind in variants:
        store = None
        if kind == "floor":
            floor = LuaFloor(ctx.client(), held=True)  # as our store's sync fast path
            ctx.stack.callback(floor.close)
            graph, counter = build_floor_step(floor)
        else:
            if kind is not None:
                store = ours.make_store(kind, redis_url=ctx.server.url, workdir=ctx.workdir)
                ctx.stack.callback(store.close)
            graph, counter = build_step(store)
        message = step_input()

        def invoke(thread_id: str, graph: Any = graph, message: Any = message) -> object:
            return graph.invoke(message, {"configurable": {"thread_id": thread_id}})

        # Replay column: a thread invoked again (the wrapped tool replays; the plain tool
        # runs again). Each thread is visited once per round, so checkpoint history grows
        # alike for wrapped and unwrapped graphs.
        threads: dict[int, list[str]] = {}

        def same_threads(
            n: int,
            threads: dict[int, list[str]] = threads,
            invoke: Callable[[str], object] = invoke,
            row: str = row,
        ) -> list[str]:
            if n not in threads:
                threads[n] = [f"{ctx.run_id}:{row}:again:{i}" for i in range(n)]
                for t in threads[n]:
                    invoke(t)  # the first run; later visits are the measured ones
            return threads[n]

        fresh = _fresh_keys(f"{ctx.run_id}:{row}:fresh")
        count = counter.count
        unwrapped = kind is None  # its tool runs again on a thread invoked again
        out.append(LatencyCase(row, REPLAY, invoke, same_threads, count, unwrapped))
        out.append(LatencyCase(row, FIRST_RUN, invoke, fresh, count, True))
    return out


def build_cases(ctx: Context) -> list[LatencyCase]:
    """Every latency case; a builder that fails makes its cases report the error."""
    cases: list[LatencyCase] = []
    builders: list[tuple[str, Callable[[], list[LatencyCase]]]] = [
        ("ping", lambda: _ping_cases(ctx)),
        ("raw_ping", lambda: _raw_ping_cases(ctx)),
        ("reference", lambda: _reference_cases(ctx)),
        ("powertools", lambda: _powertools_cases(ctx)),
        ("floor_client", lambda: _floor_cases(ctx, held=False)),
        ("floor_held", lambda: _floor_cases(ctx, held=True)),
        ("ours_redis", lambda: _ours_cases(ctx, "redis")),
        ("ours_redis_execute", lambda: _ours_cases(ctx, "redis_execute")),
        ("ours_sqlite", lambda: _ours_cases(ctx, "sqlite")),
        ("ours_memory", lambda: _ours_cases(ctx, "memory")),
        ("ours_redis_marked", lambda: _ours_cases(ctx, "redis", marked=True)),
        ("ours_sqlite_marked", lambda: _ours_cases(ctx, "sqlite", marked=True)),
        ("graph", lambda: _graph_cases(ctx)),
    ]
    for name, build in builders:
        try:
            cases += build()
        except Exception as exc:
            detail = f"setup failed: {type(exc).__name__}: {exc}"
            traceback.print_exc()
            cases.append(LatencyCase(name, REPLAY, error=detail))
    return cases


# -- the sampler -----------------------------------------------------------------------


def _time_batch(op: Callable[[Any], object], args: Sequence[Any]) -> list[int]:
    clock = time.perf_counter_ns
    out: list[int] = []
    append = out.append
    for a in args:
        t0 = clock()
        op(a)
        append(clock() - t0)
    return out


def _sample(case: LatencyCase, n: int, placement: str | None) -> None:
    assert case.op is not None
    count = case.executions or (lambda: 0)
    args = case.make_args(n)  # may warm up (a replay's first run): not a measured call
    before = count()
    try:
        timings = _time_batch(case.op, args)
    except Exception as exc:
        case.error = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
        return
    finally:
        case.calls += len(args)
        case.executed += count() - before
    if placement is not None and timings:
        case.samples.setdefault(placement, []).extend(timings)
        case.batch_medians.setdefault(placement, []).append(
            round(statistics.median(timings) / 1000, 1)
        )


def run_latency(
    cases: list[LatencyCase],
    server: RedisServer,
    where: list[Placement],
    *,
    rounds: int,
    batch: int,
    graph_batch: int,
    seed: int,
    progress: Callable[[str], None] = lambda s: None,
) -> None:
    """One warm-up round (not recorded), then ``rounds`` shuffled rounds over everything."""
    rng = random.Random(seed)
    for r in range(rounds + 1):
        order = list(where)
        rng.shuffle(order)
        for placement in order:
            place(placement, server)
            todo = [c for c in cases if c.active]
            rng.shuffle(todo)
            gc.collect()
            for case in todo:
                n = graph_batch if case.row.startswith("graph") else batch
                _sample(case, n, placement.name if r > 0 else None)
        progress(f"latency round {r}/{rounds}")


def latency_results(cases: list[LatencyCase], where: list[Placement]) -> list[dict[str, Any]]:
    """Per case: per placement median/p90 and the ratio to ``r.ping()`` in that placement."""
    ping = next((c for c in cases if c.row == "ping" and c.column == REPLAY), None)
    out: list[dict[str, Any]] = []
    for case in cases:
        entry: dict[str, Any] = {
            "row": case.row,
            "column": case.column,
            "status": "ok" if case.active else ("error" if case.error else "unavailable"),
            "detail": case.error or case.unavailable,
            **case.counts(),
            "placements": {},
        }
        for p in where:
            s = case.samples.get(p.name)
            if not s:
                continue
            stats: dict[str, float] = summary(s)
            with contextlib.suppress(Exception):
                if ping is not None and ping.samples.get(p.name):
                    stats["ratio_to_ping"] = (
                        stats["median_us"] / summary(ping.samples[p.name])["median_us"]
                    )
            entry["placements"][p.name] = {**stats, "batch_medians_us": case.batch_medians[p.name]}
        out.append(entry)
    return out
