"""One seeded run: simulated workers calling the real :class:`Engine` over a few keys, with
every store operation passing through a scheduler that the seed drives.

Each worker is a greenlet running ``Engine.run`` (the sync driver). Its store is a
:class:`Recorder` whose every operation hands a request to the scheduler and waits; the
scheduler (one thread, one ``random.Random(seed)``) decides which request is executed on
the real store next, when its reply is handed back (so operations overlap in the history),
when the store's clock moves, and which fault strikes. Nothing else runs concurrently, so a
pure simulation (memory store, fake clock) replays exactly from its seed; against a server
the same seed gives the same plan of faults and choices (the server's clock and latency
are its own).

The tool's action is an effect at a *fence-checking sink*: a downstream that refuses a
fence lower than one it has already seen for the key (the reconcile hook's look-up counts
as seeing it), like an API given ``get_idempotency_context().fence``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import greenlet  # type: ignore[import-untyped,unused-ignore]

from langchain_idempotent.core import engine as engine_module
from langchain_idempotent.core.context import get_idempotency_context
from langchain_idempotent.core.engine import Engine
from langchain_idempotent.core.policy import Policy
from langchain_idempotent.core.reconcile import ReconcileCall
from langchain_idempotent.core.record import abandon_kwargs
from langchain_idempotent.core.store import (
    BaseIdempotencyStore,
    ClaimRequest,
    CompleteRequest,
    Held,
)
from langchain_idempotent.errors import (
    IdempotencyError,
    OutcomeUnknownError,
    StoreUnavailableError,
)

from .history import CallLog, History, Restart

#: Fault kinds a run's plan draws from (see ``FAULTS`` in the README of this package).
CALL_FAULTS = (
    "crash_before_claim",
    "crash_after_claim",
    "crash_after_effect",
    "crash_during_complete",
    "pause_past_lease",
    "lost_claim_reply",
    "lost_complete_reply",
)
RUN_FAULTS = ("clock_jump", "store_restart")
FAULTS = CALL_FAULTS + RUN_FAULTS
STORE_OPS = ("claim", "renew", "complete", "release", "abandon")
MAX_STEPS = 20_000
#: Whether the library has the side-effect boundary (``Policy(boundary=True)``).
_HAS_BOUNDARY = "boundary" in {f.name for f in dataclasses.fields(Policy)}


class Crashed(BaseException):
    """Thrown into a crashed worker to unwind it; it touches no store on the way out."""


class SinkRejected(Exception):
    """The sink refused a stale fence."""


class Sink:
    """The downstream: accepts an effect unless a higher fence was seen for the key."""

    def __init__(self) -> None:
        self.seen: dict[str, int] = {}
        self.accepted: dict[str, list[tuple[int, tuple[int, int], str]]] = {}

    def effect(self, key: str, fence: int, caller: tuple[int, int]) -> str:
        if fence < self.seen.get(key, 0):
            raise SinkRejected(f"fence {fence} < {self.seen[key]}")
        self.seen[key] = fence
        value = f"{key}|f{fence}|w{caller[0]}c{caller[1]}"
        self.accepted.setdefault(key, []).append((fence, caller, value))
        return value

    def lookup(self, key: str, fence: int) -> str | None:
        self.seen[key] = max(self.seen.get(key, 0), fence)
        done = self.accepted.get(key)
        return done[0][2] if done else None


@dataclass
class Plan:
    """Everything the seed decides before the run starts."""

    seed: int
    workers: int
    keys: int
    calls: list[list[int]]  # per worker: key indices
    faults: dict[tuple[int, int], str]  # (worker, call) -> fault kind
    run_faults: list[str]
    on_expired: str
    reconcile: bool
    split: float  # chance that a reply is held back while others run
    restart: bool = False  # every run restarts the store (measuring durability)
    #: The tool marks its effect (``side_effect()``, ``Policy(boundary=True)``), where the
    #: library has it.
    boundary: bool = False

    @classmethod
    def draw(
        cls, seed: int, *, allow: tuple[str, ...], max_workers: int = 6, restart: bool = False
    ) -> Plan:
        """The plan of run ``seed``; ``restart``: every run restarts the store once."""
        rng = random.Random(seed ^ 0x5EED)
        workers = rng.randint(2, max_workers)
        keys = rng.randint(1, 3)
        calls = [[rng.randrange(keys) for _ in range(rng.randint(1, 4))] for _ in range(workers)]
        call_faults = [f for f in CALL_FAULTS if f in allow]
        faults: dict[tuple[int, int], str] = {}
        for w, mine in enumerate(calls):
            for c in range(len(mine)):
                if call_faults and rng.random() < 0.35:
                    faults[(w, c)] = rng.choice(call_faults)
        run_faults = [f for f in RUN_FAULTS if f in allow and rng.random() < 0.3]
        if restart and "store_restart" not in run_faults:
            run_faults.append("store_restart")
        return cls(
            seed=seed,
            workers=workers,
            keys=keys,
            calls=calls,
            faults=faults,
            run_faults=run_faults,
            on_expired=rng.choice(("takeover", "takeover", "raise")),
            reconcile=rng.random() < 0.5,
            split=rng.choice((0.0, 0.2, 0.5)),
            restart=restart,
            # Drawn apart, so that the other choices of a seed stay what they were before
            # the library had a side-effect boundary.
            boundary=_HAS_BOUNDARY and random.Random(seed ^ 0xB0B).random() < 0.5,
        )

    def kinds(self) -> set[str]:
        return set(self.faults.values()) | set(self.run_faults)


@dataclass
class Request:
    actor: Actor
    kind: str
    key: str
    args: dict[str, Any]
    op: Any = None
    applied: bool = False
    answer: Any = None
    error: BaseException | None = None
    #: For a watch: the clock value at which it times out.
    until: float = 0.0
    woken: bool = False


@dataclass
class Actor:
    worker: int
    glet: greenlet.greenlet
    call: int = 0
    req: Request | None = None
    done: bool = False
    dead: bool = False
    paused_until: int = -1
    lease_deadline: float = 0.0


class Backend:
    """What a run needs from a store kind (see :mod:`tests.torture.stores`)."""

    name = "?"
    #: The store's clock is a FakeClock the scheduler moves (else: real time passes).
    fake_clock: Any = None
    lease_ms = 1_000
    #: Whether a restart keeps every record (else: records may be lost; measured).
    durable = True
    store: BaseIdempotencyStore

    def now_ms(self) -> int:
        return self.store.now_ms()

    def restart(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Remove what the backend made (keys, tables, servers, directories)."""

    def forget(self, keys: list[str]) -> None:
        for key in keys:
            self.store.delete(key)


# -- the store every worker talks to ------------------------------------------------------


class _RecorderBase(BaseIdempotencyStore):
    """Hands every record operation to the scheduler (see :class:`Run`)."""

    def __init__(self, run: Run) -> None:
        self._run = run

    def _ask(self, kind: str, key: str, args: dict[str, Any]) -> Any:
        return self._run.request(kind, key, args)

    def claim(self, request: ClaimRequest) -> Any:
        return self._ask("claim", *_flat(request))

    def renew(self, held: Held, lease_ms: int) -> Any:
        return self._ask("renew", *_flat(held, lease_ms=lease_ms))

    def complete(self, request: CompleteRequest) -> Any:
        return self._ask("complete", *_flat(request))

    def release(self, held: Held) -> Any:
        return self._ask("release", *_flat(held))

    def abandon(self, held: Held, reason: Any = "cancelled", error_type: Any = None) -> Any:
        uncertain = abandon_kwargs(reason, error_type)
        return self._ask("abandon", *_flat(held, **uncertain))

    def watch(self, key: str, *, fence: int, timeout: float) -> None:
        self._ask("watch", key, {"fence": fence, "timeout": timeout})

    def get(self, key: str) -> Any:
        return self._run.backend.store.get(key)

    def now_ms(self) -> int:
        return self._run.backend.now_ms()

    async def anow_ms(self) -> int:
        return self.now_ms()

    def describe(self) -> dict[str, Any]:
        return {"kind": "torture-recorder"}

    def delete(self, key: str) -> bool:
        return self._run.backend.store.delete(key)

    def list(self, **kw: Any) -> Any:  # type: ignore[override]
        return self._run.backend.store.list(**kw)


def _flat(value: Any, **more: Any) -> tuple[str, dict[str, Any]]:
    """A request or a held lease as the history records an operation: its key, and every
    other field (with the operation's further arguments) by name."""
    fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    return fields.pop("key"), {**fields, **more}


#: The value each operation takes (the others take a :class:`Held` lease first).
_VALUES: dict[str, type[Any]] = {"claim": ClaimRequest, "complete": CompleteRequest}


def _call_args(kind: str, key: str, args: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The store call of a recorded operation: :func:`_flat` undone."""
    kw = dict(args)
    positional = kw.pop("_args", ())
    if kind in _VALUES:
        return (_VALUES[kind](key, **kw), *positional), {}
    return (Held(key, kw.pop("owner"), kw.pop("fence")), *positional), kw


def _forwarder(name: str) -> Callable[..., Any]:
    def op(self: _RecorderBase, value: Any, *args: Any, **kw: Any) -> Any:
        key, flat = _flat(value, **kw)
        if args:
            flat["_args"] = args
        return self._ask(name, key, flat)

    op.__name__ = name
    return op


def _record_operations() -> list[str]:
    """The store's record operations: public sync methods that take a request or a held
    lease (operator helpers aside)."""
    out = []
    for name, fn in vars(BaseIdempotencyStore).items():
        twin = name.startswith("a") and name[1:] in vars(BaseIdempotencyStore)
        if twin or name.startswith("_") or name in ("get", "delete", "watch", "purge"):
            continue
        first = list(inspect.signature(fn).parameters)[1:2] if callable(fn) else []
        if first in (["request"], ["held"]):
            out.append(name)
    return out


# Operations added to the protocol after this harness was written are recorded and passed
# through like the others (the checker treats them as changing nothing it checks).
Recorder = type(
    "Recorder",
    (_RecorderBase,),
    {
        name: _forwarder(name)
        for name in _record_operations()
        if getattr(_RecorderBase, name) is getattr(BaseIdempotencyStore, name)
    },
)


class _NoRenewal:
    def cancel(self) -> None:
        pass


@contextlib.contextmanager
def scheduled_renewals() -> Iterator[None]:
    """Renewals come from the scheduler (as ``renew`` requests), not the heartbeat thread:
    a paused worker must not renew, and nothing may call the store behind the scheduler."""
    saved = engine_module.__dict__.get("schedule_renewal")
    if saved is None:  # else the heartbeat thread would renew behind the scheduler's back
        raise RuntimeError(
            "langchain_idempotent.core.engine no longer imports schedule_renewal: point "
            "tests.torture.sim.scheduled_renewals at where the engine schedules renewals"
        )
    engine_module.schedule_renewal = _scheduled  # type: ignore[attr-defined,assignment]
    try:
        yield
    finally:
        engine_module.schedule_renewal = saved  # type: ignore[attr-defined]


def _scheduled(every: float, renew: Callable[[], bool]) -> _NoRenewal:
    _RENEWALS.add(renew)
    return _NoRenewal()


class _Renewals:
    """The renewal callbacks of the actions now running (the scheduler may fire one)."""

    def __init__(self) -> None:
        self.by_glet: dict[greenlet.greenlet, Callable[[], bool]] = {}

    def add(self, renew: Callable[[], bool]) -> None:
        self.by_glet[greenlet.getcurrent()] = renew

    def drop(self, glet: greenlet.greenlet) -> None:
        self.by_glet.pop(glet, None)


_RENEWALS = _Renewals()


# -- one run --------------------------------------------------------------------------------


@dataclass
class Outcome:
    plan: Plan
    history: History
    sink: Sink
    keys: list[str]
    finals: dict[str, Any] = field(default_factory=dict)
    stuck: bool = False


class Run:
    def __init__(
        self,
        plan: Plan,
        backend: Backend,
        tag: str,
        plant: Callable[[BaseIdempotencyStore], Any] | None = None,
    ) -> None:
        self.plan = plan
        self.plant = plant
        self.backend = backend
        self.rng = random.Random(plan.seed)
        self.h = History()
        self.sink = Sink()
        self.keys = [f"{tag}-s{plan.seed}-k{i}" for i in range(plan.keys)]
        self.actors: list[Actor] = []
        self.spent: set[tuple[int, int]] = set()
        self.step_no = 0
        self.main = greenlet.getcurrent()
        options: dict[str, Any] = {"boundary": True} if plan.boundary else {}
        policy = Policy(
            lease=backend.lease_ms / 1000,
            ttl=3600,
            wait_timeout=None,
            on_expired=plan.on_expired,  # type: ignore[arg-type]
            reconcile=self._reconcile if plan.reconcile else None,
            **options,
        )
        self.engine = Engine(Recorder(self), policy)  # type: ignore[abstract]

    # -- the clock -----------------------------------------------------------------------

    def now(self) -> float:
        """The store's clock in ms (the fake clock, or the wall clock for a server)."""
        fc = self.backend.fake_clock
        return fc.now * 1000 if fc is not None else time.time() * 1000

    def _slack(self) -> int:
        return 0 if self.backend.fake_clock is not None else 5

    def advance(self, ms: float) -> None:
        fc = self.backend.fake_clock
        if fc is not None:
            fc.now += ms / 1000
        elif ms > 0:
            time.sleep(ms / 1000)
        now = self.now()
        for a in self.actors:
            if a.req is not None and a.req.kind == "watch" and now >= a.req.until:
                a.req.woken = True

    def jump_past(self, deadline: float) -> None:
        self.advance(max(0.0, deadline - self.now()) + 2)

    # -- what a worker's store call does ------------------------------------------------

    def actor(self) -> Actor:
        me = greenlet.getcurrent()
        for a in self.actors:
            if a.glet is me:
                return a
        raise RuntimeError("a store call outside the workers")

    def request(self, kind: str, key: str, args: dict[str, Any]) -> Any:
        a = self.actor()
        if a.dead:
            raise StoreUnavailableError("crashed worker", key=key)
        req = Request(a, kind, key, args)
        if kind == "watch":
            req.until = self.now() + args["timeout"] * 1000
        elif kind in STORE_OPS or kind not in ("watch", "point"):
            req.op = self.h.invoke(
                key, (a.worker, a.call), kind, args, int(self.now()) - self._slack()
            )
        a.req = req
        self.main.switch()
        if req.error is not None:
            raise req.error
        return req.answer

    def point(self, name: str) -> None:
        """A place in the action where a planned fault may strike."""
        a = self.actor()
        fault = self.fault(a)
        if fault == f"crash_{name}":
            a.dead = True
            self.h.calls[(a.worker, a.call)].end = "crashed"
            self.main.switch()  # never resumed: the scheduler throws Crashed at the end
        if fault == "pause_past_lease" and name == (
            "after_effect" if a.worker % 2 else "after_claim"
        ):
            self.spent.add((a.worker, a.call))
            a.paused_until = self.step_no + self.rng.randint(3, 40)
            self.jump_past(a.lease_deadline)
            self.request("point", "", {})
        elif name == "after_claim":
            # The tool works for a while: the scheduler may renew its lease meanwhile.
            while self.rng.random() < 0.3:
                if self.request("point", "", {"work": True}) == "renew":
                    renew = _RENEWALS.by_glet.get(a.glet)
                    if renew is not None:
                        renew()

    def fault(self, a: Actor) -> str | None:
        where = (a.worker, a.call)
        return None if where in self.spent else self.plan.faults.get(where)

    def _reconcile(self, call: ReconcileCall) -> str | None:
        a = self.actor()
        found = self.sink.lookup(call.key, call.fence)
        self.h.calls[(a.worker, a.call)].asked.append((call.fence, found is not None))
        return found

    def _action(self) -> str:
        a = self.actor()
        ctx = get_idempotency_context()
        assert ctx is not None
        log = self.h.calls[(a.worker, a.call)]
        log.runs.append((ctx.fence, ctx.takeover))
        self.point("after_claim")
        if self.plan.boundary:
            with ctx.side_effect():  # type: ignore[attr-defined]
                value = self.sink.effect(ctx.key, ctx.fence, (a.worker, a.call))
        else:
            value = self.sink.effect(ctx.key, ctx.fence, (a.worker, a.call))
        self.point("after_effect")
        return value

    def _worker(self, w: int) -> None:
        a = self.actors[w]
        for c, k in enumerate(self.plan.calls[w]):
            a.call = c
            key = self.keys[k]
            log = self.h.calls[(w, c)] = CallLog((w, c), key)
            if self.plan.faults.get((w, c)) == "crash_before_claim":
                log.end = "crashed"
                a.dead = True
                self.main.switch()
            for _ in range(4):
                try:
                    log.value = self.engine.run(
                        key,
                        fingerprint=f"fp-{k}",
                        action=self._action,
                        tool="effect",
                        thread_id=key,
                    )
                    log.end = "value"
                    break
                except Crashed:
                    log.end = "crashed"
                    raise
                except OutcomeUnknownError:
                    log.end = "unknown"
                    break
                except (IdempotencyError, SinkRejected) as exc:
                    log.errors.append(type(exc).__name__)
                    log.end = "error"
        a.done = True

    # -- the scheduler ------------------------------------------------------------------

    def _apply(self, req: Request) -> None:
        """Execute ``req`` on the real store, now (its reply may be held back)."""
        req.applied = True
        a = req.actor
        fault = self.fault(a)
        store: Any = self.backend.store
        if self.plant is not None:
            store = self.plant(store)
        if req.kind == "point":
            return
        positional, kw = _call_args(req.kind, req.key, req.args)
        try:
            answer = getattr(store, req.kind)(*positional, **kw)
        except IdempotencyError as exc:
            req.error = exc
            answer = None
        req.answer = answer
        if req.kind in ("complete", "release", "abandon"):
            self._wake(req.key)
        if req.kind == "claim" and answer is not None and answer.outcome.runs:
            a.lease_deadline = self.now() + req.args["lease_ms"]
        lost = (fault == "lost_claim_reply" and req.kind == "claim") or (
            fault == "lost_complete_reply" and req.kind == "complete"
        )
        if lost and self.rng.random() < 0.7:
            req.error = StoreUnavailableError("torture: reply lost", key=req.key)
            req.op = None  # never given: pending forever in the history
            self.spent.add((a.worker, a.call))
            self.h.calls[(a.worker, a.call)].unconfirmed = req.kind == "complete"

    def _wake(self, key: str) -> None:
        for a in self.actors:
            if a.req is not None and a.req.kind == "watch" and a.req.key == key:
                a.req.woken = True

    def _give(self, a: Actor) -> None:
        req = a.req
        assert req is not None
        if req.op is not None and req.error is None:  # a store error: no reply, as if lost
            self.h.give(req.op, req.answer, int(self.now()) + self._slack())
        a.req = None
        a.glet.switch()

    def _runnable(self) -> list[Actor]:
        out = []
        for a in self.actors:
            if a.done or a.dead or a.req is None:
                continue
            if a.paused_until > self.step_no:
                continue
            if a.req.kind == "watch" and not a.req.woken:
                continue
            out.append(a)
        return out

    def _complete_fault(self, a: Actor) -> bool:
        """``crash_during_complete``: the completion reaches the store or not; the worker
        dies before the reply."""
        req = a.req
        if req is None or req.kind != "complete" or req.applied:
            return False
        if self.fault(a) != "crash_during_complete":
            return False
        if self.rng.random() < 0.5:
            self._apply(req)
        req.op = None
        a.dead = True
        self.h.calls[(a.worker, a.call)].end = "crashed"
        return True

    def execute(self) -> Outcome:
        rng = self.rng
        random.seed(self.plan.seed)  # the engine's owner tokens
        self.actors = [
            Actor(w, greenlet.greenlet(lambda w=w: self._worker(w)))
            for w in range(self.plan.workers)
        ]
        for a in self.actors:
            a.glet.switch()
        restart_at = -1
        if "store_restart" in self.plan.run_faults:
            # Measuring durability (every run restarts): early, while work is in flight.
            restart_at = rng.randint(2, 15) if self.plan.restart else rng.randint(5, 60)
        jump_at = rng.randint(3, 40) if "clock_jump" in self.plan.run_faults else -1
        stuck = False
        while True:
            self.step_no += 1
            if self.step_no > MAX_STEPS:
                stuck = True
                break
            if self.step_no == jump_at:
                self.jump_past(self.now() + self.backend.lease_ms)
            if self.step_no == restart_at:
                self._restart()
            live = [a for a in self.actors if not a.done and not a.dead]
            if not live:
                break
            ready = self._runnable()
            if not ready:
                paused = [a for a in live if a.paused_until > self.step_no]
                watching = [a for a in live if a.req is not None and a.req.kind == "watch"]
                if watching:
                    self.jump_past(min(a.req.until for a in watching if a.req is not None))
                elif paused:
                    for a in paused:
                        a.paused_until = -1
                continue
            if self.backend.fake_clock is not None and rng.random() < 0.15:
                self.advance(rng.randint(1, 40))
            a = rng.choice(ready)
            req = a.req
            assert req is not None
            if self._complete_fault(a):
                continue
            if req.kind in ("watch", "point") or req.applied:
                if req.args.get("work") and rng.random() < 0.5:
                    req.answer = "renew"
                    if self.backend.fake_clock is not None:
                        self.advance(rng.randint(1, self.backend.lease_ms // 2))
                self._give(a)
                continue
            self._apply(req)
            if rng.random() >= self.plan.split:
                self._give(a)
        # Unwind the crashed workers (their store calls now fail without touching it).
        for a in self.actors:
            if a.dead and not a.glet.dead:
                with contextlib.suppress(Crashed):
                    a.glet.throw(Crashed())
        for a in self.actors:  # or each run's greenlets, and the run with them, stay alive
            _RENEWALS.drop(a.glet)
        out = Outcome(self.plan, self.h, self.sink, self.keys, stuck=stuck)
        for key in self.keys:
            out.finals[key] = self.backend.store.get(key)
        return out

    def _read_after_restart(self, key: str) -> Any:
        for _ in range(50):  # the first reads may meet connections the restart broke
            try:
                return self.backend.store.get(key)
            except IdempotencyError:
                time.sleep(0.1)
        return self.backend.store.get(key)

    def _restart(self) -> None:
        # Between operations: every store operation already invoked reaches the store first
        # (its reply comes after the restart), so each operation belongs to one side of it.
        for a in self.actors:
            req = a.req
            if req is not None and req.op is not None and not req.applied and not a.dead:
                self._apply(req)
        self.backend.restart()
        after = {key: self._read_after_restart(key) for key in self.keys}
        self.h.restarts.append(Restart(self.h.tick(), after))
        for key in self.keys:
            self._wake(key)
