"""An approval is checked again when its effect is about to run: ``authorize=`` (a mandate
revoked while the run was paused) and ``approval_ttl=`` (a decision too old by then).

Each scenario runs on both faces (``create_agent`` with ``IdempotencyMiddleware``, a
hand-built ``ToolNode`` over ``idempotent(...)``) under ``invoke`` and ``ainvoke``, and
beside the same script without the check, which shows what it prevents. Time is the
store's clock, injected: nothing sleeps.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from langchain_idempotent import IdempotencyMiddleware, InMemoryIdempotencyStore, idempotent
from langchain_idempotent.adapters.approval import Decision
from langchain_idempotent.adapters.keys import CallInfo
from langchain_idempotent.core.policy import Policy
from tests.support.graphs import Effects, ScriptedChatModel, on_each_turn, thread, tool_graph

PAYMENT = {"mandate": "M-1", "amount": 140}
FACES = pytest.mark.parametrize("face", ["agent", "toolnode"])
MODES = pytest.mark.parametrize("mode", ["sync", "async"])


class Clock:
    """The store's clock, moved by hand."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class Paused(BaseException):
    """The run stopping between the approval and the effect (a deploy, a crash)."""


def pay_tool(effects: Effects, stops: list[Paused] | None = None) -> BaseTool:
    def pay(mandate: str, amount: float) -> str:
        if stops:
            raise stops.pop()
        n = effects.record("pay", mandate=mandate, amount=amount)
        return f"paid ${amount:g} under {mandate} (payment #{n})"

    async def apay(mandate: str, amount: float) -> str:
        await asyncio.sleep(0)
        return pay(mandate, amount)

    return StructuredTool.from_function(pay, coroutine=apay, name="pay", description="Pay.")


def graph(face: str, tool: BaseTool, store: InMemoryIdempotencyStore, **options: Any) -> Any:
    model = ScriptedChatModel(then=on_each_turn(("pay", PAYMENT)))
    if face == "toolnode":
        wrapped = idempotent(tool, store=store, **options)
        return tool_graph(model, [wrapped], checkpointer=InMemorySaver())
    middleware = IdempotencyMiddleware(store, tools=["pay"], **options)
    return create_agent(model, tools=[tool], middleware=[middleware], checkpointer=InMemorySaver())


class Run:
    """One thread: each step's questions are kept."""

    def __init__(self, graph: Any, mode: str) -> None:
        self.graph, self.mode = graph, mode
        self.config: RunnableConfig = thread("pay-1")
        self.out: dict[str, Any] = {}
        self.questions = 0

    async def __call__(self, input: Any) -> list[Any]:
        if self.mode == "async":
            self.out = await self.graph.ainvoke(input, self.config)
        else:
            self.out = self.graph.invoke(input, self.config)
        pending = list(self.out.get("__interrupt__", ()))
        self.questions += len(pending)
        return pending

    async def approve(self, pending: list[Any]) -> list[Any]:
        return await self(
            Command(resume={q.id: {"decisions": [{"type": "approve"}]} for q in pending})
        )

    def answer(self) -> ToolMessage:
        [message] = [m for m in self.out["messages"] if isinstance(m, ToolMessage)]
        return message


class Mandates:
    """The payment mandates a bank holds: ``authorize`` asks it, sync or async."""

    def __init__(self) -> None:
        self.active = {"M-1": True}
        self.asked: list[tuple[str, str | None]] = []

    def check(self, call: CallInfo, decision: Decision | None) -> bool:
        self.asked.append((call.args["mandate"], None if decision is None else decision.type))
        return self.active[call.args["mandate"]]

    async def acheck(self, call: CallInfo, decision: Decision | None) -> bool:
        await asyncio.sleep(0)
        return self.check(call, decision)


async def revoked_while_paused(
    face: str, mode: str, authorize: Callable[..., Any] | None, mandates: Mandates
) -> tuple[int, Run, InMemoryIdempotencyStore]:
    """Asked, the mandate revoked while the run waits, then approved and resumed."""
    effects, store = Effects(), InMemoryIdempotencyStore()
    options: dict[str, Any] = {"approval": True}
    if authorize is not None:
        options["authorize"] = authorize
    run = Run(graph(face, pay_tool(effects), store, **options), mode)
    pending = await run({"messages": [HumanMessage("pay the invoice")]})
    assert len(pending) == 1
    mandates.active["M-1"] = False  # revoked while the run is paused
    assert await run.approve(pending) == []
    return effects.count(), run, store


@FACES
@MODES
@pytest.mark.parametrize("hook", ["sync", "async"])
async def test_a_mandate_revoked_while_paused_for_approval_stops_the_payment(
    face: str, mode: str, hook: str
) -> None:
    mandates = Mandates()
    authorize = mandates.check if hook == "sync" else mandates.acheck
    payments, run, store = await revoked_while_paused(face, mode, authorize, mandates)
    assert payments == 0
    assert mandates.asked == [("M-1", "approve")]  # after the resume, with the decision
    answer = run.answer()
    assert answer.status == "error" and "not authorized" in str(answer.content)
    assert "authorize denied it" in str(answer.content)
    assert [r for r in store.list() if "kind" not in r.meta] == []  # nothing memoized
    assert [r for r in store.list() if r.meta.get("kind") == "approval"] == []  # spent

    # Unprotected (no authorize=): the approval outlives the mandate and the payment goes out.
    unchecked, _, _ = await revoked_while_paused(face, mode, None, Mandates())
    assert unchecked == 1


@FACES
@MODES
async def test_an_authorize_that_raises_denies_the_call_and_says_why(face: str, mode: str) -> None:
    def authorize(call: CallInfo, decision: Decision | None) -> bool:
        raise ConnectionError("mandate service unreachable")

    effects, store = Effects(), InMemoryIdempotencyStore()
    run = Run(graph(face, pay_tool(effects), store, approval=True, authorize=authorize), mode)
    await run.approve(await run({"messages": [HumanMessage("pay")]}))
    assert effects.count() == 0
    answer = run.answer()
    assert answer.status == "error"
    assert "authorize raised ConnectionError: mandate service unreachable" in str(answer.content)
    assert store.list() == [] or all(r.meta.get("kind") for r in store.list())


@MODES
async def test_authorize_alone_is_asked_before_each_new_effect_never_for_a_replay(
    mode: str,
) -> None:
    mandates, effects, store = Mandates(), Effects(), InMemoryIdempotencyStore()
    tool = idempotent(pay_tool(effects), store=store, authorize=mandates.check)
    config = thread("alone")
    call = {"type": "tool_call", "name": "pay", "args": PAYMENT, "id": "c1"}

    async def invoke() -> Any:
        if mode == "sync":
            return tool.invoke(call, config)
        return await tool.ainvoke(call, config)

    assert "payment #1" in str((await invoke()).content)
    assert "payment #1" in str((await invoke()).content)  # a replay: authorize not asked
    assert mandates.asked == [("M-1", None)]  # no human asked: no decision
    mandates.active["M-1"] = False
    other = idempotent(pay_tool(effects), store=store, authorize=mandates.check)
    denied = other.invoke({**call, "args": {**PAYMENT, "amount": 20}, "id": "c2"}, config)
    assert denied.status == "error" and effects.count() == 1


async def paused_after_approval(
    face: str, mode: str, ttl: float | None, pause_s: float
) -> tuple[int, int]:
    """Approved, then the run stops before the payment; the thread resumes ``pause_s``
    later on the store's clock. Returns (questions asked, payments)."""
    clock, effects = Clock(), Effects()
    store = InMemoryIdempotencyStore(clock=clock)
    stops = [Paused()]
    options: dict[str, Any] = {"approval": True, "approval_ttl": ttl}
    run = Run(graph(face, pay_tool(effects, stops), store, **options), mode)
    pending = await run({"messages": [HumanMessage("pay the invoice")]})
    with pytest.raises(Paused):
        await run.approve(pending)
    clock.now += pause_s
    pending = await run(None)  # the thread picked up again from its checkpoint
    if pending:
        assert await run.approve(pending) == []
    return run.questions, effects.count()


@FACES
@MODES
async def test_an_approval_older_than_approval_ttl_when_the_effect_resumes_is_asked_again(
    face: str, mode: str
) -> None:
    # Resumed an hour later, approval_ttl=10 minutes: asked again, then paid once.
    assert await paused_after_approval(face, mode, ttl=600, pause_s=3600) == (2, 1)
    # Within the ttl: the stored approval still holds, not asked again.
    assert await paused_after_approval(face, mode, ttl=600, pause_s=60) == (1, 1)
    # Unprotected (no approval_ttl): an hour-old approval pays without asking.
    assert await paused_after_approval(face, mode, ttl=None, pause_s=3600) == (1, 1)


def test_bad_approval_options_are_refused_with_a_clear_error() -> None:
    with pytest.raises(ValueError, match="approval_ttl must be a positive duration, got -1"):
        Policy(approval_ttl=-1)
    with pytest.raises(TypeError, match="authorize must be a function of the call"):
        Policy(authorize="yes")  # type: ignore[arg-type]
