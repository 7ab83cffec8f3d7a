"""Steps inside a tool: an effect that happened never runs again when LangGraph re-executes
the tool (resume after ``interrupt()``, a retry after a later step failed, a new process
after the worker was killed while paused).

Each scenario runs the same tool unwrapped first and shows the duplicate: a tool that
refunds, then asks with ``interrupt()``, then e-mails refunds twice, because LangGraph
re-executes an interrupted tool from its first line. Journaled with ``ctx.step`` it refunds
once.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import HumanInTheLoopMiddleware
from langchain_core.messages import HumanMessage
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.errors import GraphInterrupt
from langgraph.types import Command, interrupt

from langchain_idempotent import (
    IdempotencyMiddleware,
    InMemoryIdempotencyStore,
    Policy,
    idempotency_scope,
    idempotent,
)
from langchain_idempotent.adapters._compat import NEVER_TERMINAL
from langchain_idempotent.core.context import astep, get_idempotency_context, side_effect, step
from langchain_idempotent.core.engine import Engine, step_fingerprint, step_key
from langchain_idempotent.core.reconcile import ReconcileCall
from langchain_idempotent.core.store import BaseIdempotencyStore, ClaimRequest
from langchain_idempotent.errors import (
    OutcomeUnknownError,
    PayloadMismatchError,
    SideEffectMisuseError,
    UnstorableResultError,
)
from langchain_idempotent.stores.postgres import PostgresIdempotencyStore
from langchain_idempotent.testing import FakeClock
from tests.support import forked
from tests.support.graphs import (
    Effects,
    ScriptedChatModel,
    on_each_turn,
    thread,
    tool_graph,
)
from tests.support.postgres_fixtures import pg_server, pg_table, pg_url

__all__ = ["pg_server", "pg_table", "pg_url"]  # the fixtures this module uses

REFUND = {"invoice_id": "INV-7", "amount": 140}
MODES = pytest.mark.parametrize("mode", ["sync", "async"])


def refund_then_email(effects: Effects, *, journaled: bool) -> BaseTool:
    """Refund, ask a human whether to tell the customer (``interrupt()``), then e-mail.
    ``journaled``: each effect is a step (``ctx.step`` / ``ctx.astep``)."""

    def refund(invoice_id: str, amount: float) -> str:
        n = effects.record("refund", invoice_id=invoice_id)
        return f"refund #{n}: {amount:g} on {invoice_id}"

    def email(text: str) -> str:
        effects.record("email", text=text)
        return "sent"

    def handle(invoice_id: str, amount: float) -> str:
        if journaled:
            receipt = step("refund", refund, invoice_id, amount)
        else:
            receipt = refund(invoice_id, amount)
        answer = interrupt({"receipt": receipt, "question": "e-mail the customer?"})
        if answer == "yes":
            if journaled:
                step("email", email, receipt)
            else:
                email(receipt)
        return receipt

    async def ahandle(invoice_id: str, amount: float) -> str:
        if journaled:
            receipt = await astep("refund", refund, invoice_id, amount)
        else:
            receipt = refund(invoice_id, amount)
        answer = interrupt({"receipt": receipt, "question": "e-mail the customer?"})
        if answer == "yes":
            if journaled:
                await astep("email", _async(email), receipt)
            else:
                email(receipt)
        return receipt

    return StructuredTool.from_function(
        handle, coroutine=ahandle, name="refund_and_notify", description="Refund, then e-mail."
    )


def _async(fn: Any) -> Any:
    async def run(*args: Any) -> Any:
        await asyncio.sleep(0)
        return fn(*args)

    return run


async def drive(graph: Any, input: Any, thread_id: str, mode: str) -> dict[str, Any]:
    config = thread(thread_id)
    if mode == "async":
        return await graph.ainvoke(input, config)  # type: ignore[no-any-return]
    return graph.invoke(input, config)  # type: ignore[no-any-return]


def one_call_model() -> ScriptedChatModel:
    return ScriptedChatModel(then=on_each_turn(("refund_and_notify", REFUND)))


# -- interrupt() between two effects in a ToolNode ------------------------------------------


@MODES
@pytest.mark.parametrize("wrapped", [False, True], ids=["plain", "steps"])
async def test_a_refund_before_interrupt_runs_once_when_the_tool_node_resumes(
    mode: str, wrapped: bool
) -> None:
    effects = Effects()
    tool = refund_then_email(effects, journaled=wrapped)
    if wrapped:
        tool = idempotent(tool, InMemoryIdempotencyStore())
    graph = tool_graph(one_call_model(), [tool], checkpointer=InMemorySaver())

    paused = await drive(graph, {"messages": [HumanMessage("refund INV-7")]}, "t", mode)
    assert paused["__interrupt__"][0].value["receipt"] == "refund #1: 140 on INV-7"
    done = await drive(graph, Command(resume="yes"), "t", mode)

    assert effects.count("email") == 1
    assert effects.count("refund") == (1 if wrapped else 2)  # plain: re-executed on resume
    assert done["messages"][-2].content == "refund #1: 140 on INV-7" if wrapped else True


# -- through IdempotencyMiddleware, with a human approval before the tool --------------------


@MODES
@pytest.mark.parametrize("wrapped", [False, True], ids=["plain", "steps"])
async def test_a_refund_before_interrupt_runs_once_through_the_middleware_after_an_approval(
    mode: str, wrapped: bool
) -> None:
    effects = Effects()
    middleware: list[Any] = [HumanInTheLoopMiddleware(interrupt_on={"refund_and_notify": True})]
    if wrapped:
        middleware.append(
            IdempotencyMiddleware(InMemoryIdempotencyStore(), tools=["refund_and_notify"])
        )
    agent = create_agent(
        one_call_model(),
        tools=[refund_then_email(effects, journaled=wrapped)],
        middleware=middleware,
        checkpointer=InMemorySaver(),
    )

    asked = await drive(agent, {"messages": [HumanMessage("refund INV-7")]}, "t", mode)
    assert "action_requests" in asked["__interrupt__"][0].value  # the approval
    paused = await drive(agent, Command(resume={"decisions": [{"type": "approve"}]}), "t", mode)
    assert paused["__interrupt__"][0].value["question"] == "e-mail the customer?"
    await drive(agent, Command(resume="yes"), "t", mode)

    assert effects.count("email") == 1
    assert effects.count("refund") == (1 if wrapped else 2)


# -- the worker killed while paused, a new process resumes ------------------------------------

_WORKER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from langchain_core.messages import HumanMessage
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.types import Command
    from langchain_idempotent import SqliteIdempotencyStore, idempotent
    from tests.support.graphs import thread, tool_graph
    from tests.test_steps import FileEffects, one_call_model, refund_then_email

    folder, phase, wrapped = Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "steps"
    effects = FileEffects(folder / "effects.log")
    tool = refund_then_email(effects, journaled=wrapped)
    if wrapped:
        tool = idempotent(tool, SqliteIdempotencyStore(str(folder / "records.db")))
    with SqliteSaver.from_conn_string(str(folder / "graph.db")) as saver:
        graph = tool_graph(one_call_model(), [tool], checkpointer=saver)
        if phase == "start":
            graph.invoke({"messages": [HumanMessage("refund INV-7")]}, thread("t"))
            print("paused", flush=True)
            time.sleep(60)  # the worker waits for the human, and is killed
        else:
            graph.invoke(Command(resume="yes"), thread("t"))
            print("done", flush=True)
    """
)


class FileEffects(Effects):
    """Effects appended to a file, so that they outlive the process that made them."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    def record(self, name: str, **args: Any) -> int:
        with self.path.open("a") as log:
            log.write(name + "\n")
        return self.path.read_text().split().count(name)


def killed_then_run_again(
    script: str, folder: Path, kind: str, *, ready: str
) -> subprocess.CompletedProcess[str]:
    """Run ``script`` (``python -c script folder start kind``) until it prints ``ready``,
    SIGKILL it, then run it again in a new process (``... resume kind``): that run."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
    argv = ["-c", script, str(folder)]
    out = folder / "worker-stdout.txt"
    worker = forked.start([*argv, "start", kind], env=env, stdout=out, stderr=folder / "err")
    try:
        forked.wait_for_line(worker, out, ready)
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait()
    return forked.run([*argv, "resume", kind], folder=folder, env=env, timeout=60)


@pytest.mark.parametrize("wrapped", [False, True], ids=["plain", "steps"])
def test_a_refund_before_interrupt_runs_once_when_a_new_process_resumes_a_killed_worker(
    tmp_path: Path, wrapped: bool
) -> None:
    kind = "steps" if wrapped else "plain"
    resumed = killed_then_run_again(_WORKER, tmp_path, kind, ready="paused")
    assert resumed.stdout.strip() == "done", resumed.stderr
    log = (tmp_path / "effects.log").read_text().split()
    assert log.count("email") == 1
    assert log.count("refund") == (1 if wrapped else 2)


# -- the protocol of a step, on every store ---------------------------------------------------


class World:
    def __init__(self, store: BaseIdempotencyStore, **options: Any) -> None:
        self.effects: list[str] = []
        self.asked: list[ReconcileCall] = []

        def hook(call: ReconcileCall) -> Any:
            self.asked.append(call)
            return None

        options.setdefault("reconcile", hook)
        self.engine = Engine(store, Policy(**options), never_terminal=NEVER_TERMINAL)

    def effect(self, name: str) -> str:
        self.effects.append(name)
        return f"{name} #{self.effects.count(name)}"

    def tool(self, *, ask: bool) -> Any:
        def run() -> str:
            ctx = get_idempotency_context()
            assert ctx is not None
            receipt = ctx.step("refund", self.effect, "refund")
            if ask:
                raise GraphInterrupt(())  # what interrupt() raises before its resume value
            return f"{receipt}; {ctx.step('email', self.effect, 'email')}"

        return run


@pytest.fixture(params=["any", "postgres"])
def store(
    request: pytest.FixtureRequest, any_store: BaseIdempotencyStore
) -> Any:  # memory, SQLite, Redis (any_store), and PostgreSQL
    if request.param == "any":
        return any_store
    if any_store.__class__.__name__ != "InMemoryIdempotencyStore":
        pytest.skip("PostgreSQL runs once")
    store = PostgresIdempotencyStore.from_url(
        request.getfixturevalue("pg_url"), table=request.getfixturevalue("pg_table")
    )
    request.addfinalizer(store.close)
    return store


def test_a_completed_step_returns_its_stored_result_when_the_tool_runs_again(
    store: BaseIdempotencyStore,
) -> None:
    w = World(store)
    with pytest.raises(GraphInterrupt):
        w.engine.run("k", fingerprint="fp", action=w.tool(ask=True))
    assert w.engine.run("k", fingerprint="fp", action=w.tool(ask=False)) == "refund #1; email #1"
    assert w.effects == ["refund", "email"]
    assert w.asked == []


async def test_a_completed_async_step_returns_its_stored_result_when_the_tool_runs_again(
    store: BaseIdempotencyStore,
) -> None:
    w = World(store)

    def tool(ask: bool) -> Any:
        async def run() -> str:
            receipt = await astep("refund", _async(w.effect), "refund")
            if ask:
                raise GraphInterrupt(())
            return f"{receipt}; {await astep('email', w.effect, 'email')}"

        return run

    with pytest.raises(GraphInterrupt):
        await w.engine.arun("k", fingerprint="fp", action=tool(True))
    assert await w.engine.arun("k", fingerprint="fp", action=tool(False)) == "refund #1; email #1"
    assert w.effects == ["refund", "email"]


def test_a_step_is_retried_free_after_a_later_step_failed_and_the_earlier_one_replays() -> None:
    w = World(InMemoryIdempotencyStore())
    failures = [ConnectionRefusedError("mail server down")]

    def email(name: str) -> str:
        if failures:
            raise failures.pop()
        return w.effect(name)

    def run() -> str:
        return f"{step('refund', w.effect, 'refund')}; {step('email', email, 'email')}"

    with pytest.raises(ConnectionRefusedError):
        w.engine.run("k", fingerprint="fp", action=run)
    assert w.engine.run("k", fingerprint="fp", action=run) == "refund #1; email #1"
    assert w.effects == ["refund", "email"]


def _died_inside_step(w: World, clock: FakeClock, name: str) -> None:
    """A worker began the step ``name`` (running ``w.effect``) of call ``k`` and died before
    it finished: its lease runs out."""
    request = ClaimRequest(
        step_key("k", name), "dead", step_fingerprint(w.effect), lease_ms=5000, ttl_ms=60_000
    )
    w.engine.store.claim(request)
    clock.now += 6


def test_a_step_that_began_and_never_finished_asks_reconcile_with_the_steps_name() -> None:
    clock = FakeClock()
    w = World(InMemoryIdempotencyStore(clock=clock), lease=5)
    _died_inside_step(w, clock, "refund")

    assert w.engine.run("k", fingerprint="fp", action=w.tool(ask=False)) == "refund #1; email #1"
    [asked] = w.asked
    assert (asked.step, asked.key, asked.tool) == ("refund", step_key("k", "refund"), None)


def test_a_step_that_began_and_never_finished_in_an_unsafe_tool_is_an_unknown_outcome() -> None:
    clock = FakeClock()
    store = InMemoryIdempotencyStore(clock=clock)
    w = World(store, lease=5, effect="unsafe", reconcile=None)
    _died_inside_step(w, clock, "refund")

    with pytest.raises(OutcomeUnknownError, match="refund"):
        w.engine.run("k", fingerprint="fp", action=w.tool(ask=False))
    assert w.effects == []  # neither the refund again nor the e-mail after it


# -- side_effect() entered, then interrupt(): never a blind second run ------------------------


@pytest.mark.parametrize("wrapped", [False, True], ids=["plain", "ours"])
def test_side_effect_entered_again_after_an_interrupt_is_an_unknown_outcome(wrapped: bool) -> None:
    effects = Effects()

    def handle(invoice_id: str, amount: float) -> str:
        ctx = get_idempotency_context()
        with ctx.side_effect() if ctx is not None else _nothing():
            effects.record("refund")
        if interrupt("e-mail?") == "yes":
            effects.record("email")
        return "done"

    tool: BaseTool = StructuredTool.from_function(
        handle, name="refund_and_notify", description="R."
    )
    if wrapped:
        tool = idempotent(tool, InMemoryIdempotencyStore(), boundary=True)
    graph = tool_graph(one_call_model(), [tool], checkpointer=InMemorySaver())
    graph.invoke({"messages": [HumanMessage("refund")]}, thread("t"))

    if not wrapped:
        graph.invoke(Command(resume="yes"), thread("t"))
        assert effects.count("refund") == 2  # the blind second run
        return
    with pytest.raises(OutcomeUnknownError, match=r"ctx\.step"):
        graph.invoke(Command(resume="yes"), thread("t"))
    with pytest.raises(OutcomeUnknownError):  # and it stays so: no retry sends it blind
        graph.invoke(Command(resume="yes"), thread("t"))
    assert effects.count("refund") == 1 and effects.count("email") == 0


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def test_an_interrupt_before_the_block_still_releases_the_key() -> None:
    w = World(InMemoryIdempotencyStore(), boundary=True)

    def asks() -> str:
        raise GraphInterrupt(())

    def sends() -> str:
        with side_effect():
            return w.effect("refund")

    with pytest.raises(GraphInterrupt):
        w.engine.run("k", fingerprint="fp", action=asks)
    assert w.engine.run("k", fingerprint="fp", action=sends) == "refund #1"
    assert w.asked == []


# -- bad input: a clear error naming the step, before the effect it guards --------------------


def test_a_step_outside_a_wrapped_tool_is_refused_naming_the_step() -> None:
    ran: list[str] = []
    with pytest.raises(SideEffectMisuseError, match=r"step\('refund'\) used outside"):
        step("refund", ran.append, "x")
    with pytest.raises(SideEffectMisuseError, match=r"astep\('refund'\) used outside"):
        asyncio.run(astep("refund", ran.append, "x"))
    assert ran == []


def test_a_step_name_reused_with_another_function_is_refused_before_it_runs() -> None:
    w = World(InMemoryIdempotencyStore())

    def run() -> str:
        step("refund", w.effect, "refund")
        return str(step("refund", lambda: w.effect("other")))

    with pytest.raises(SideEffectMisuseError, match="step 'refund' was already run with another"):
        w.engine.run("k", fingerprint="fp", action=run)
    assert w.effects == ["refund"]


def test_a_step_given_another_function_on_re_execution_is_refused_as_a_mismatch() -> None:
    w = World(InMemoryIdempotencyStore())
    w.engine.run("k", fingerprint="fp", action=lambda: step("refund", w.effect, "refund"))
    with pytest.raises(PayloadMismatchError):
        w.engine.run("k", fingerprint="fp2", action=lambda: step("refund", print, "x"))
    assert w.effects == ["refund"]


def test_a_step_result_that_cannot_be_stored_stops_the_tool_naming_the_step() -> None:
    w = World(InMemoryIdempotencyStore())

    def run() -> str:
        step("refund", lambda: object())  # an effect whose answer cannot be stored
        return w.effect("email")

    with pytest.raises(UnstorableResultError, match="step 'refund' of tool"):
        w.engine.run("k", fingerprint="fp", action=run)
    assert w.effects == []  # the e-mail after it never ran


def test_steps_are_encrypted_like_results() -> None:
    from langchain_idempotent.core.encryption import ResultEncryption

    store = InMemoryIdempotencyStore()
    w = World(store, encryption=ResultEncryption({"k1": os.urandom(32)}))
    w.engine.run("k", fingerprint="fp", action=lambda: step("refund", w.effect, "refund"))
    record = store.get(step_key("k", "refund"))
    assert record is not None and record.payload is not None
    assert b"refund #1" not in record.payload


def test_a_step_in_a_tool_called_in_a_scope_runs_once() -> None:
    effects = Effects()

    def handle(invoice_id: str, amount: float) -> str:
        return str(step("refund", effects.record, "refund"))

    tool = idempotent(
        StructuredTool.from_function(handle, name="r", description="R."), InMemoryIdempotencyStore()
    )
    with idempotency_scope("order-1"):
        tool.invoke(REFUND)
    assert effects.count("refund") == 1


def test_a_step_name_used_again_with_the_same_function_in_one_run_returns_its_result() -> None:
    w = World(InMemoryIdempotencyStore())
    sent: list[str] = []

    def run() -> str:
        first = step("email", sent.append, "hello")  # a bound method, made anew each time
        again = step("email", sent.append, "hello")
        return f"{first} {again}"

    assert w.engine.run("k", fingerprint="fp", action=run) == "None None"
    assert sent == ["hello"]
