"""Parallel gated calls in one hand-built ``ToolNode`` step: every answer reaches the call it
was asked about, whatever order the calls reach ``interrupt()`` in.

A ``ToolNode`` runs the calls of one ``AIMessage`` in one LangGraph task (executor threads,
or one ``asyncio.gather``), and LangGraph matches a task's answers to its ``interrupt()``
calls by position. The approval predicate here sleeps a random moment, so the threads
reach the question in a different order on every run. Each case counts the questions
asked and the effects applied, on the memory, SQLite and Redis stores, and runs the same
script against the pattern LangGraph documents (a plain tool that calls ``interrupt()``
itself) and against LangChain's ``HumanInTheLoopMiddleware``.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import HumanInTheLoopMiddleware
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command, interrupt

from langchain_idempotent import InMemoryIdempotencyStore, idempotent
from langchain_idempotent.core.store import BaseIdempotencyStore
from langchain_idempotent.errors import IdempotencyError
from tests.support.graphs import (
    Effects,
    ScriptedChatModel,
    assert_every_call_answered,
    on_each_turn,
    thread,
    tool_graph,
)

APPROVE: dict[str, Any] = {"type": "approve"}
REJECT: dict[str, Any] = {"type": "reject", "message": "not this one"}


def edit(amount: int) -> dict[str, Any]:
    return {"type": "edit", "edited_action": {"name": "issue_refund", "args": {"amount": amount}}}


def refund_tool(effects: Effects) -> BaseTool:
    def issue_refund(invoice_id: str, amount: float) -> str:
        n = effects.record("issue_refund", invoice_id=invoice_id, amount=amount)
        return f"refund #{n}: {amount:g} on {invoice_id}"

    async def aissue_refund(invoice_id: str, amount: float) -> str:
        await asyncio.sleep(random.random() / 200)
        return issue_refund(invoice_id, amount)

    return StructuredTool.from_function(
        issue_refund, coroutine=aissue_refund, name="issue_refund", description="Refund."
    )


#: A lease no stall of a loaded CI machine outlasts (see docs/effects.md, "Leases").
LEASE = 60


def jittered(call: Any) -> bool:
    """Ask about every call, after a random pause: the threads arrive in any order."""
    time.sleep(random.random() / 100)
    return True


class Reviewer:
    """Answers each question by the invoice it names, and counts the questions."""

    def __init__(self, plan: dict[str, dict[str, Any]]) -> None:
        self.plan = plan
        self.asked: list[str] = []

    def answer(self, out: dict[str, Any], *, by_id: bool) -> Command[Any] | None:
        pending = list(out.get("__interrupt__", ()))
        if not pending:
            return None
        resume: dict[str, Any] = {}
        for question in pending:
            invoices = [a["args"]["invoice_id"] for a in question.value["action_requests"]]
            self.asked += invoices
            decisions = []
            for invoice in invoices:
                decision = dict(self.plan[invoice])
                if decision["type"] == "edit":
                    args = {"invoice_id": invoice, **decision["edited_action"]["args"]}
                    decision["edited_action"] = {"name": "issue_refund", "args": args}
                decisions.append(decision)
            resume[question.id] = {"decisions": decisions}
        if by_id or len(resume) > 1:
            return Command(resume=resume)
        [only] = resume.values()
        return Command(resume=only)


async def drive(
    graph: Any, config: RunnableConfig, reviewer: Reviewer, mode: str, *, by_id: bool = False
) -> Any:
    """Run one user turn to the end, answering every question the graph asks, each by
    its interrupt id or each with a plain ``Command(resume=...)``. (Not mixed: LangGraph
    keeps a plain answer and hands it once more to the task's next ``interrupt()`` after
    an answer by id.)"""
    step: Any = {"messages": [HumanMessage("refund them")]}
    for _ in range(10):
        out = await graph.ainvoke(step, config) if mode == "async" else graph.invoke(step, config)
        step = reviewer.answer(out, by_id=by_id)
        if step is None:
            return out
    raise AssertionError("the graph kept asking")


PLANS = {
    "approve,reject": [APPROVE, REJECT],
    "reject,approve": [REJECT, APPROVE],
    "edit,approve": [edit(5), APPROVE],
    "approve,reject,edit": [APPROVE, REJECT, edit(7)],
    "edit,approve,reject": [edit(7), APPROVE, REJECT],
    "reject,edit,approve": [REJECT, edit(7), APPROVE],
}


def invoices(n: int) -> list[dict[str, Any]]:
    return [{"invoice_id": f"INV-{i}", "amount": 10 * i} for i in range(1, n + 1)]


def expected_effects(calls: list[dict[str, Any]], plan: list[dict[str, Any]]) -> list[Any]:
    effects = []
    for args, decision in zip(calls, plan, strict=True):
        if decision["type"] == "approve":
            effects.append(("issue_refund", args))
        elif decision["type"] == "edit":
            effects.append(("issue_refund", {**args, **decision["edited_action"]["args"]}))
    return sorted(effects, key=lambda e: e[1]["invoice_id"])


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("plan_name", list(PLANS))
async def test_each_parallel_call_in_a_tool_node_gets_its_own_decision(
    any_store: BaseIdempotencyStore, plan_name: str, mode: str
) -> None:
    plan = PLANS[plan_name]
    calls = invoices(len(plan))
    for attempt in range(3):  # three arrival orders per case
        effects = Effects()
        # LEASE: these tests are about routing decisions, not takeovers; the 2 s default lease
        # can lapse on an overloaded CI machine (a stall past 1.5 s is a takeover by design).
        refund = idempotent(refund_tool(effects), store=any_store, approval=jittered, lease=LEASE)
        model = ScriptedChatModel(then=on_each_turn(*(("issue_refund", a) for a in calls)))
        graph = tool_graph(model, [refund], checkpointer=InMemorySaver())
        reviewer = Reviewer({a["invoice_id"]: d for a, d in zip(calls, plan, strict=True)})
        config = thread(f"parallel-{plan_name}-{mode}-{attempt}")

        out = await drive(graph, config, reviewer, mode, by_id=attempt == 1)

        # Asked once about each call, one call per question, never twice.
        assert sorted(reviewer.asked) == [a["invoice_id"] for a in calls]
        # One effect per approved (or edited) call, with the arguments decided.
        assert sorted(effects.log, key=lambda e: e[1]["invoice_id"]) == expected_effects(
            calls, plan
        )
        # Each call's answer names its own outcome.
        answers = {m.tool_call_id: m for m in out["messages"] if isinstance(m, ToolMessage)}
        [ai] = [m for m in out["messages"] if getattr(m, "tool_calls", None)]
        for tool_call, decision in zip(ai.tool_calls, plan, strict=True):
            answer = answers[tool_call["id"]]
            invoice = tool_call["args"]["invoice_id"]
            if decision["type"] == "reject":
                assert answer.status == "error" and "not this one" in str(answer.content)
            else:
                assert answer.status != "error" and invoice in str(answer.content)
                if decision["type"] == "edit":
                    assert " 7 on " in str(answer.content) or " 5 on " in str(answer.content)
        assert_every_call_answered(out["messages"])


# -- what the plain setups do with the same script --------------------------------------------


def interrupting_refund_tool(effects: Effects) -> BaseTool:
    """LangGraph's documented pattern: the tool asks for itself with ``interrupt()``."""

    def issue_refund(invoice_id: str, amount: float) -> str:
        jittered(None)
        answer = interrupt(
            {
                "action_requests": [
                    {"name": "issue_refund", "args": {"invoice_id": invoice_id, "amount": amount}}
                ]
            }
        )
        decision = answer["decisions"][0]
        if decision["type"] == "reject":
            return "rejected"
        n = effects.record("issue_refund", invoice_id=invoice_id, amount=amount)
        return f"refund #{n}: {amount:g} on {invoice_id}"

    return StructuredTool.from_function(issue_refund, name="issue_refund", description="Refund.")


def test_against_a_plain_interrupt_in_the_tool_each_answer_reaches_its_own_call() -> None:
    """The same three-call script (approve INV-1, reject INV-2, approve INV-3), ten runs
    each: ours, and the tool asking for itself. The plain tool's answers go by arrival
    order and its approved effects run again on every re-run; ours never."""
    calls = invoices(3)
    plan = {"INV-1": APPROVE, "INV-2": REJECT, "INV-3": APPROVE}
    figures: dict[str, dict[str, int]] = {}
    for name in ("ours", "plain"):
        tally = {"questions": 0, "effects": 0, "rejected ran": 0, "duplicates": 0}
        for attempt in range(10):
            effects = Effects()
            tool = (
                idempotent(
                    refund_tool(effects),
                    store=InMemoryIdempotencyStore(),
                    approval=jittered,
                    lease=LEASE,
                )
                if name == "ours"
                else interrupting_refund_tool(effects)
            )
            model = ScriptedChatModel(then=on_each_turn(*(("issue_refund", a) for a in calls)))
            graph = tool_graph(model, [tool], checkpointer=InMemorySaver())
            reviewer = Reviewer(plan)
            asyncio.run(drive(graph, thread(f"{name}-parallel-{attempt}"), reviewer, "sync"))
            ran = [args["invoice_id"] for _, args in effects.log]
            tally["questions"] += len(reviewer.asked)
            tally["effects"] += len(ran)
            tally["rejected ran"] += "INV-2" in ran
            tally["duplicates"] += len(ran) != len(set(ran))
        figures[name] = tally
    print(f"10 runs of 3 parallel calls: {figures}")
    assert figures["ours"] == {"questions": 30, "effects": 20, "rejected ran": 0, "duplicates": 0}
    plain = figures["plain"]
    assert plain["effects"] > 20 and plain["duplicates"] > 0


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_plain_hitl_middleware_with_parallel_calls(mode: str) -> None:
    """LangChain's HITL asks about both calls in one question and runs the approved one;
    the rejected one gets its message. (It asks per model turn: see the later-turn case.)"""
    effects = Effects()
    calls = invoices(2)
    model = ScriptedChatModel(then=on_each_turn(*(("issue_refund", a) for a in calls)))
    agent = create_agent(
        model,
        tools=[refund_tool(effects)],
        middleware=[HumanInTheLoopMiddleware(interrupt_on={"issue_refund": True})],
        checkpointer=InMemorySaver(),
    )
    reviewer = Reviewer({"INV-1": APPROVE, "INV-2": REJECT})
    await drive(agent, thread(f"hitl-parallel-{mode}"), reviewer, mode)
    assert sorted(reviewer.asked) == ["INV-1", "INV-2"]
    assert [args["invoice_id"] for _, args in effects.log] == ["INV-1"]


# -- outside a graph ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_approval_outside_a_graph_is_our_clear_error(mode: str) -> None:
    effects = Effects()
    refund = idempotent(
        refund_tool(effects), store=InMemoryIdempotencyStore(), approval=True, lease=LEASE
    )
    config: RunnableConfig = {"configurable": {"idempotency_scope": "order-1"}}
    with pytest.raises(IdempotencyError, match=r"needs human approval.*LangGraph graph") as err:
        if mode == "async":
            await refund.ainvoke({"invoice_id": "INV-1", "amount": 1}, config)
        else:
            refund.invoke({"invoice_id": "INV-1", "amount": 1}, config)
    assert "runnable context" not in str(err.value)
    assert effects.count() == 0
