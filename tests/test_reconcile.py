"""Uncertain outcomes: the reconcile hook, and a cancelled call is an uncertain one.

A worker that dies after its side effect, or a task cancelled after it, leaves the key
uncertain: the next call takes over and asks ``reconcile=`` whether the effect happened
before running the tool again. Every scenario also runs without the hook and shows the
duplicate it prevents. On the memory, SQLite, Redis and PostgreSQL stores; sync and async
tools and hooks; the wrapper and the middleware. Real SIGKILLed and cancelled processes:
``tests/faults/test_reconcile_kill.py``.

"Died after the effect" is played in-process by the tool itself: it marks its record as
its owner would leave it on dying (:meth:`abandon` with ``reason="lease_expired"``: running,
lease ended, not finished) and unwinds with a ``BaseException``.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage
from langchain_core.tools import StructuredTool
from langgraph.checkpoint.memory import InMemorySaver

from langchain_idempotent import (
    IdempotencyMiddleware,
    InMemoryIdempotencyStore,
    OutcomeUnknownError,
    ReconcileCall,
    SqliteIdempotencyStore,
    get_idempotency_context,
    idempotent,
)
from langchain_idempotent.core.events import EventCounter
from langchain_idempotent.core.record import State
from langchain_idempotent.core.store import (
    BaseIdempotencyStore,
    ClaimRequest,
    CompleteRequest,
    Held,
)
from langchain_idempotent.stores.postgres import PostgresIdempotencyStore
from langchain_idempotent.stores.redis import RedisIdempotencyStore
from tests.support.graphs import ScriptedChatModel, on_each_turn, thread
from tests.support.postgres_fixtures import pg_server, pg_table, pg_url

__all__ = ["pg_server", "pg_table", "pg_url"]  # fixtures used by this module

REFUND = {"invoice_id": "INV-7", "amount": 140}


class Died(BaseException):
    """The worker is gone (played in-process)."""


class Provider:
    """A payments provider that does NOT deduplicate: every POST is an effect."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.refunds: list[str] = []  # idempotency keys, one per POST

    def post(self, key: str) -> None:
        with self._lock:
            self.refunds.append(key)

    def find(self, key: str) -> str | None:
        with self._lock:
            return key if key in self.refunds else None


@pytest.fixture(params=["memory", "sqlite", "redis", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BaseIdempotencyStore]:
    s: BaseIdempotencyStore
    if request.param == "memory":
        s = InMemoryIdempotencyStore()
    elif request.param == "sqlite":
        s = SqliteIdempotencyStore(tmp_path / "records.db")
    elif request.param == "redis":
        server = request.getfixturevalue("redis_server")
        s = RedisIdempotencyStore.from_url(server.url, prefix=f"rc-{uuid.uuid4().hex[:8]}:")
    else:
        s = PostgresIdempotencyStore.from_url(
            request.getfixturevalue("pg_url"), table=request.getfixturevalue("pg_table")
        )
    yield s
    s.close()


class Refunds:
    """The refund tool, its provider, and what the next run of the tool should do."""

    def __init__(self, store: BaseIdempotencyStore) -> None:
        self.store = store
        self.provider = Provider()
        self.runs = 0
        self.then: Callable[[], None] | None = None  # after the POST, once
        self.gate: asyncio.Event | None = None  # async: wait here after the POST

    def _after_post(self) -> None:
        self.runs += 1
        then, self.then = self.then, None
        if then is not None:
            then()

    def issue_refund(self, invoice_id: str, amount: float) -> str:
        ctx = get_idempotency_context()
        assert ctx is not None
        self.provider.post(ctx.key)
        self._after_post()
        return f"refunded {amount:g} on {invoice_id}"

    async def aissue_refund(self, invoice_id: str, amount: float) -> str:
        ctx = get_idempotency_context()
        assert ctx is not None
        self.provider.post(ctx.key)
        self._after_post()
        if self.gate is not None:
            await self.gate.wait()  # cancelled here
        return f"refunded {amount:g} on {invoice_id}"

    def tool(self) -> StructuredTool:
        return StructuredTool.from_function(
            self.issue_refund, coroutine=self.aissue_refund, name="issue_refund", description="r"
        )

    def die(self) -> None:
        """Leave the record as a dead owner does (lease over, no result) and unwind."""
        ctx = get_idempotency_context()
        assert ctx is not None
        assert self.store.abandon(
            Held(ctx.key, owner=ctx.owner, fence=ctx.fence), reason="lease_expired"
        )
        raise Died

    # -- hooks ------------------------------------------------------------------------

    def hook(self, asked: list[ReconcileCall]) -> Callable[[ReconcileCall], str | None]:
        def refund_status(call: ReconcileCall) -> str | None:
            asked.append(call)
            found = self.provider.find(call.key)
            return f"refunded {call.args['amount']:g} (reconciled)" if found else None

        return refund_status

    def ahook(self, asked: list[ReconcileCall]) -> Callable[[ReconcileCall], Any]:
        sync = self.hook(asked)

        async def refund_status(call: ReconcileCall) -> str | None:
            await asyncio.sleep(0)
            return sync(call)

        return refund_status


def _invoke(tool: Any, mode: str, config: Any) -> Any:
    if mode == "async":
        return asyncio.run(tool.ainvoke(REFUND, config))
    return tool.invoke(REFUND, config)


# -- the wrapper: died after / before the effect -------------------------------------------


@pytest.mark.parametrize("hook_kind", ["sync hook", "async hook", "no hook"])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_call_whose_owner_died_after_the_effect_is_reconciled_not_rerun(
    store: BaseIdempotencyStore, mode: str, hook_kind: str
) -> None:
    r = Refunds(store)
    asked: list[ReconcileCall] = []
    hook = {"sync hook": r.hook, "async hook": r.ahook}.get(hook_kind)
    counter = EventCounter()
    options: dict[str, Any] = {} if hook is None else {"reconcile": hook(asked)}
    refund = idempotent(r.tool(), store, on_event=counter, **options)
    config = thread(f"t-{uuid.uuid4().hex}")
    r.then = r.die
    with pytest.raises(Died):
        _invoke(refund, mode, config)
    assert r.provider.refunds and r.runs == 1

    answer = _invoke(refund, mode, config)
    again = _invoke(refund, mode, config)  # a later retry replays
    (key,) = set(r.provider.refunds)
    if hook is None:  # the duplicate the hook prevents
        assert r.runs == 2 and len(r.provider.refunds) == 2
        assert answer == again == "refunded 140 on INV-7"
        return
    assert r.runs == 1 and r.provider.refunds == [key]  # 0 re-runs, 1 effect
    assert answer == again == "refunded 140 (reconciled)"
    (call,) = asked
    assert (call.key, call.tool, call.reason) == (key, "issue_refund", "lease_expired")
    assert (call.fence, call.attempt, call.previous_attempt) == (2, 2, 1)
    assert dict(call.args) == REFUND and call.thread_id == config["configurable"]["thread_id"]
    assert counter["reconcile"] == 1 and counter["replay"] == 1
    rec = store.get(key)
    assert rec is not None and rec.state is State.COMPLETED and rec.fence == 2


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_call_whose_owner_died_before_the_effect_runs_once_after_reconcile_finds_nothing(
    store: BaseIdempotencyStore, mode: str
) -> None:
    r = Refunds(store)
    asked: list[ReconcileCall] = []
    refund = idempotent(r.tool(), store, reconcile=r.hook(asked))
    config = thread(f"t-{uuid.uuid4().hex}")

    def die_before() -> None:  # undo the POST: the worker died before it
        r.provider.refunds.clear()
        r.die()

    r.then = die_before
    with pytest.raises(Died):
        _invoke(refund, mode, config)
    assert _invoke(refund, mode, config) == "refunded 140 on INV-7"
    assert len(asked) == 1 and len(r.provider.refunds) == 1 and r.runs == 2
    ctx_seen = asked[0]
    assert ctx_seen.reason == "lease_expired"


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_hook_that_raises_stores_nothing_surfaces_its_error_and_is_asked_again(
    store: BaseIdempotencyStore, mode: str
) -> None:
    r = Refunds(store)
    broken = [True]
    asked: list[ReconcileCall] = []
    working = r.hook(asked)

    def flaky(call: ReconcileCall) -> str | None:
        if broken[0]:
            raise ConnectionError("provider lookup is down")
        return working(call)

    counter = EventCounter()
    refund = idempotent(r.tool(), store, reconcile=flaky, on_event=counter)
    config = thread(f"t-{uuid.uuid4().hex}")
    r.then = r.die
    with pytest.raises(Died):
        _invoke(refund, mode, config)
    with pytest.raises(ConnectionError, match="lookup is down"):
        _invoke(refund, mode, config)
    (key,) = set(r.provider.refunds)
    rec = store.get(key)
    assert rec is not None and rec.state is State.RUNNING and rec.payload is None
    assert rec.uncertain(store.now_ms())  # still unknown: the next call asks again
    assert r.runs == 1
    broken[0] = False
    assert _invoke(refund, mode, config) == "refunded 140 (reconciled)"
    assert r.runs == 1 and len(r.provider.refunds) == 1
    assert asked[0].reason == "lease_expired" and asked[0].attempt == 3
    assert counter["reconcile"] == 2


# -- a cancelled async call ----------------------------------------------------------------


async def _cancel_after_post(r: Refunds, call: Callable[[], Any]) -> None:
    r.gate = asyncio.Event()
    task = asyncio.ensure_future(call())
    while not r.provider.refunds:
        await asyncio.sleep(0.001)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    r.gate = None


@pytest.mark.parametrize("hook_kind", ["async hook", "sync hook", "no hook"])
async def test_an_async_call_cancelled_after_the_effect_is_reconciled_by_the_next_call(
    store: BaseIdempotencyStore, hook_kind: str
) -> None:
    r = Refunds(store)
    asked: list[ReconcileCall] = []
    hook = {"sync hook": r.hook, "async hook": r.ahook}.get(hook_kind)
    options: dict[str, Any] = {} if hook is None else {"reconcile": hook(asked)}
    refund = idempotent(r.tool(), store, **options)
    config = thread(f"t-{uuid.uuid4().hex}")
    await _cancel_after_post(r, lambda: refund.ainvoke(REFUND, config))
    (key,) = set(r.provider.refunds)
    rec = await store.aget(key)
    assert rec is not None and rec.state is State.RUNNING and rec.uncertain(await store.anow_ms())

    answer = await refund.ainvoke(REFUND, config)
    if hook is None:  # the key handed downstream is all that is left
        assert len(r.provider.refunds) == 2 and answer == "refunded 140 on INV-7"
        return
    assert answer == "refunded 140 (reconciled)"
    assert r.provider.refunds == [key] and r.runs == 1  # 1 effect
    assert [c.reason for c in asked] == ["cancelled"]


async def test_an_interrupt_like_tool_error_still_releases_and_is_never_reconciled(
    store: BaseIdempotencyStore,
) -> None:
    r = Refunds(store)
    asked: list[ReconcileCall] = []
    refund = idempotent(r.tool(), store, reconcile=r.hook(asked))
    config = thread(f"t-{uuid.uuid4().hex}")

    def fail() -> None:
        raise RuntimeError("the tool knows it failed")

    r.then = fail
    with pytest.raises(RuntimeError):
        await refund.ainvoke(REFUND, config)
    assert await refund.ainvoke(REFUND, config) == "refunded 140 on INV-7"  # plain re-run
    assert await refund.ainvoke(REFUND, config) == "refunded 140 on INV-7"  # replay
    assert asked == []


# -- a paused owner resumes after a reconciled takeover --------------------------------------


def test_a_paused_owner_that_resumes_after_a_reconciled_takeover_cannot_overwrite_it(
    store: BaseIdempotencyStore,
) -> None:
    r = Refunds(store)
    asked: list[ReconcileCall] = []
    refund = idempotent(r.tool(), store, reconcile=r.hook(asked))
    config = thread(f"t-{uuid.uuid4().hex}")
    paused, resume = threading.Event(), threading.Event()
    results: list[Any] = []

    def pause() -> None:  # its lease passes while it is paused (no renewal reaches it)
        ctx = get_idempotency_context()
        assert ctx is not None
        assert store.abandon(
            Held(ctx.key, owner=ctx.owner, fence=ctx.fence), reason="lease_expired"
        )
        paused.set()
        resume.wait(10)

    r.then = pause
    owner = threading.Thread(target=lambda: results.append(refund.invoke(REFUND, config)))
    owner.start()
    assert paused.wait(10)
    assert refund.invoke(REFUND, config) == "refunded 140 (reconciled)"
    resume.set()
    owner.join(10)
    assert results == ["refunded 140 (reconciled)"]  # its late result was not stored
    (key,) = set(r.provider.refunds)
    rec = store.get(key)
    assert rec is not None and rec.fence == 2
    assert refund.invoke(REFUND, config) == "refunded 140 (reconciled)"


# -- on_expired="raise" --------------------------------------------------------------------


def test_on_expired_raise_asks_the_hook_first_and_raises_only_when_it_finds_nothing(
    store: BaseIdempotencyStore,
) -> None:
    r = Refunds(store)
    asked: list[ReconcileCall] = []
    lookup = r.hook(asked)
    refund = idempotent(r.tool(), store, on_expired="raise", reconcile=lookup)
    config = thread(f"t-{uuid.uuid4().hex}")
    r.then = r.die
    with pytest.raises(Died):
        refund.invoke(REFUND, config)
    (key,) = set(r.provider.refunds)
    r.provider.refunds.clear()  # the provider has no record of it
    with pytest.raises(OutcomeUnknownError):
        refund.invoke(REFUND, config)
    rec = store.get(key)
    assert rec is not None and rec.uncertain(store.now_ms())  # left for an operator
    r.provider.post(key)  # now it finds it
    assert refund.invoke(REFUND, config) == "refunded 140 (reconciled)"
    assert refund.invoke(REFUND, config) == "refunded 140 (reconciled)"
    assert r.runs == 1 and [c.reason for c in asked] == ["lease_expired"] * 2


# -- the middleware --------------------------------------------------------------------------


@pytest.mark.parametrize("with_hook", [True, False], ids=["reconcile", "no hook"])
@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_the_middleware_reconciles_a_call_whose_owner_died_after_the_effect(
    store: BaseIdempotencyStore, mode: str, with_hook: bool
) -> None:
    r = Refunds(store)
    asked: list[ReconcileCall] = []
    hooks: dict[str, Any] = {"reconcile": {"issue_refund": r.hook(asked)}} if with_hook else {}
    agent = create_agent(
        ScriptedChatModel(then=on_each_turn(("issue_refund", REFUND))),
        tools=[r.tool()],
        middleware=[IdempotencyMiddleware(store, tools=["issue_refund"], **hooks)],
        checkpointer=InMemorySaver(),
    )
    config = thread(f"mw-{uuid.uuid4().hex}")
    r.then = r.die

    async def go(payload: Any) -> Any:
        if mode == "async":
            return await agent.ainvoke(payload, config)
        return await asyncio.to_thread(agent.invoke, payload, config)

    with pytest.raises(Died):
        await go({"messages": [HumanMessage("refund INV-7")]})
    out = await go(None)  # the retry of the failed step
    tool_messages = [m for m in out["messages"] if m.type == "tool"]
    if not with_hook:
        assert len(r.provider.refunds) == 2
        return
    assert len(r.provider.refunds) == 1 and r.runs == 1
    assert tool_messages[-1].content == "refunded 140 (reconciled)"
    assert tool_messages[-1].tool_call_id == out["messages"][-3].tool_calls[0]["id"]
    assert asked[0].tool == "issue_refund" and asked[0].reason == "lease_expired"


def test_the_middleware_refuses_a_hook_for_a_tool_it_does_not_wrap() -> None:
    with pytest.raises(ValueError, match="lookup_invoice"):
        IdempotencyMiddleware(
            InMemoryIdempotencyStore(),
            tools=["issue_refund"],
            reconcile={"lookup_invoice": lambda call: None},
        )


def test_reconcile_must_be_a_function_or_a_dict_of_them() -> None:
    with pytest.raises(TypeError, match="reconcile="):
        idempotent(lambda x: x, InMemoryIdempotencyStore(), reconcile="lookup")  # type: ignore[arg-type]


def test_ls_uncertain_lists_only_records_whose_last_attempt_did_not_finish(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from langchain_idempotent.cli import main

    store = SqliteIdempotencyStore(tmp_path / "r.db")
    for key in ("done", "cancelled", "running", "free"):
        c = store.claim(
            ClaimRequest(key, owner="a", fingerprint="f", lease_ms=60_000, ttl_ms=60_000)
        )
        if key == "done":
            store.complete(
                CompleteRequest(
                    key,
                    owner="a",
                    fence=c.fence,
                    fingerprint="f",
                    payload=b"1",
                    failed=False,
                    ttl_ms=60_000,
                )
            )
        elif key == "cancelled":
            assert store.abandon(Held(key, owner="a", fence=c.fence))
        elif key == "free":
            assert store.release(Held(key, owner="a", fence=c.fence))
    store.close()
    url = f"sqlite:///{tmp_path / 'r.db'}"
    assert main(["ls", "--uncertain", "--json", "--url", url]) == 0
    listed = json.loads(capsys.readouterr().out)["records"]
    assert [r["key"] for r in listed] == ["cancelled"]
