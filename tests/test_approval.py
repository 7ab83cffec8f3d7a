"""Human approval bound to the exact call: ask once per effect, run once, never memoize a "no".

Each case counts the questions a human was asked (interrupts surfaced) and the effects
applied; where LangChain's ``HumanInTheLoopMiddleware`` with a plain tool repeats a
question or an effect, the same script is run against it too.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import HumanInTheLoopMiddleware
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from langchain_idempotent import IdempotencyMiddleware, InMemoryIdempotencyStore, idempotent
from langchain_idempotent.adapters.approval import decision_key
from langchain_idempotent.core.store import BaseIdempotencyStore
from tests.support.graphs import (
    Effects,
    ScriptedChatModel,
    assert_every_call_answered,
    on_each_turn,
    thread,
    tool_graph,
)

REFUND = {"invoice_id": "INV-7", "amount": 140}
APPROVE = {"decisions": [{"type": "approve", "reviewer": "alice"}]}


def refund_tool(effects: Effects) -> BaseTool:
    def issue_refund(invoice_id: str, amount: float) -> str:
        n = effects.record("issue_refund", invoice_id=invoice_id, amount=amount)
        return f"refund #{n}: {amount:g} on {invoice_id}"

    async def aissue_refund(invoice_id: str, amount: float) -> str:
        await asyncio.sleep(0)
        return issue_refund(invoice_id, amount)

    return StructuredTool.from_function(
        issue_refund, coroutine=aissue_refund, name="issue_refund", description="Refund."
    )


class Run:
    """Drives one agent thread and counts the questions it surfaced."""

    def __init__(self, graph: Any, thread_id: str, mode: str) -> None:
        self.graph, self.mode = graph, mode
        self.config: RunnableConfig = thread(thread_id)
        self.questions: list[Any] = []
        self.out: dict[str, Any] = {}

    async def __call__(self, input: Any) -> list[Any]:
        if self.mode == "async":
            self.out = await self.graph.ainvoke(input, self.config)
        else:
            self.out = self.graph.invoke(input, self.config)
        pending = list(self.out.get("__interrupt__", ()))
        known = {q.id for q in self.questions}
        self.questions += [q for q in pending if q.id not in known]
        return pending

    def tool_messages(self) -> list[ToolMessage]:
        return [m for m in self.out["messages"] if isinstance(m, ToolMessage)]


def agent_with(store: BaseIdempotencyStore, effects: Effects, **options: Any) -> Any:
    model = ScriptedChatModel(then=on_each_turn(("issue_refund", REFUND)))
    return create_agent(
        model,
        tools=[refund_tool(effects)],
        middleware=[IdempotencyMiddleware(store, tools=["issue_refund"], **options)],
        checkpointer=InMemorySaver(),
    )


def plain_hitl_agent(effects: Effects, **script: Any) -> Any:
    model = ScriptedChatModel(then=on_each_turn(("issue_refund", REFUND)), **script)
    return create_agent(
        model,
        tools=[refund_tool(effects)],
        middleware=[HumanInTheLoopMiddleware(interrupt_on={"issue_refund": True})],
        checkpointer=InMemorySaver(),
    )


def only_key(store: BaseIdempotencyStore) -> str:
    [rec] = [r for r in store.list() if "kind" not in r.meta]
    return rec.key


MODES = pytest.mark.parametrize("mode", ["sync", "async"])


@MODES
async def test_approve_asks_in_the_hitl_format_then_runs_once_and_records_the_decision(
    any_store: BaseIdempotencyStore, mode: str
) -> None:
    store, effects = any_store, Effects()
    run = Run(agent_with(store, effects, approval=True), f"approve-{mode}", mode)
    [question] = await run({"messages": [HumanMessage("refund INV-7")]})
    [action] = question.value["action_requests"]
    assert action["name"] == "issue_refund"
    assert action["args"] == {"invoice_id": "INV-7", "amount": 140}
    assert "issue_refund" in action["description"]
    assert question.value["review_configs"] == [
        {"action_name": "issue_refund", "allowed_decisions": ["approve", "edit", "reject"]}
    ]
    assert effects.count() == 0

    assert await run(Command(resume=APPROVE)) == []
    assert effects.count() == 1
    rec = store.get(action["idempotency_key"])
    assert rec is not None and rec.done
    assert rec.meta["approval"] == "approve" and rec.meta["reviewer"] == "alice"
    assert len(run.questions) == 1
    assert_every_call_answered(run.out["messages"])


@MODES
async def test_edit_runs_the_edited_arguments_once_under_their_own_key(
    any_store: BaseIdempotencyStore, mode: str
) -> None:
    store, effects = any_store, Effects()
    run = Run(agent_with(store, effects, approval=True), f"edit-{mode}", mode)
    [question] = await run({"messages": [HumanMessage("refund INV-7")]})
    asked_key = question.value["action_requests"][0]["idempotency_key"]
    edit = {
        "type": "edit",
        "edited_action": {"name": "issue_refund", "args": {**REFUND, "amount": 100}},
    }
    await run(Command(resume={"decisions": [edit]}))

    assert effects.log == [("issue_refund", {"invoice_id": "INV-7", "amount": 100})]
    assert store.get(asked_key) is None  # the model's call never ran
    ran = store.get(only_key(store))
    assert ran is not None and ran.meta["approval"] == "edit"
    assert ran.meta["approval_of"] == asked_key
    assert "100 on INV-7" in str(run.tool_messages()[-1].content)


async def test_an_edit_that_does_not_fit_the_schema_is_refused_and_nothing_runs() -> None:
    store, effects = InMemoryIdempotencyStore(), Effects()
    run = Run(agent_with(store, effects, approval=True), "bad-edit", "sync")
    await run({"messages": [HumanMessage("refund INV-7")]})
    edit = {"type": "edit", "edited_action": {"name": "issue_refund", "args": {"amount": "lots"}}}
    with pytest.raises(ValueError, match="does not fit its arguments"):
        await run(Command(resume={"decisions": [edit]}))
    assert effects.count() == 0
    assert [r.meta["kind"] for r in store.list()] == ["approval_question"]  # no decision


@MODES
async def test_reject_answers_with_the_message_runs_nothing_and_stores_nothing(
    any_store: BaseIdempotencyStore, mode: str
) -> None:
    store, effects = any_store, Effects()
    run = Run(agent_with(store, effects, approval=True), f"reject-{mode}", mode)
    [question] = await run({"messages": [HumanMessage("refund INV-7")]})
    key = question.value["action_requests"][0]["idempotency_key"]
    await run(Command(resume={"decisions": [{"type": "reject", "message": "not yet"}]}))

    [answer] = run.tool_messages()
    assert answer.status == "error" and "not yet" in str(answer.content)
    assert effects.count() == 0
    assert store.get(key) is None and store.get(decision_key(key)) is None
    assert_every_call_answered(run.out["messages"])

    # LangChain's HITL with a plain tool does the same here: 1 question, 0 effects.
    effects = Effects()
    plain = Run(plain_hitl_agent(effects), f"plain-reject-{mode}", mode)
    await plain({"messages": [HumanMessage("refund INV-7")]})
    await plain(Command(resume={"decisions": [{"type": "reject", "message": "not yet"}]}))
    assert (len(plain.questions), effects.count()) == (1, 0)


@MODES
async def test_rejected_then_approved_in_a_later_turn_runs_once(
    any_store: BaseIdempotencyStore, mode: str
) -> None:
    store, effects = any_store, Effects()
    run = Run(agent_with(store, effects, approval=True), f"reject-later-{mode}", mode)
    await run({"messages": [HumanMessage("refund INV-7")]})
    await run(Command(resume={"decisions": [{"type": "reject", "message": "check first"}]}))
    # The same call in a later turn asks again (the "no" was not memoized) ...
    [again] = await run({"messages": [HumanMessage("checked, refund it")]})
    assert again.value["action_requests"][0]["args"] == REFUND
    await run(Command(resume=APPROVE))
    # ... and a third turn replays without asking.
    assert await run({"messages": [HumanMessage("did it work?")]}) == []
    assert (len(run.questions), effects.count()) == (2, 1)

    # LangChain's HITL with a plain tool: the third turn asks again and refunds again.
    effects = Effects()
    plain = Run(plain_hitl_agent(effects), f"plain-reject-later-{mode}", mode)
    await plain({"messages": [HumanMessage("refund INV-7")]})
    await plain(Command(resume={"decisions": [{"type": "reject", "message": "check first"}]}))
    for text in ("checked, refund it", "did it work?"):
        await plain({"messages": [HumanMessage(text)]})
        await plain(Command(resume={"decisions": [{"type": "approve"}]}))
    assert (len(plain.questions), effects.count()) == (3, 2)


@MODES
async def test_a_completed_call_in_a_later_turn_replays_without_asking(
    any_store: BaseIdempotencyStore, mode: str
) -> None:
    store, effects = any_store, Effects()
    run = Run(agent_with(store, effects, approval=True), f"later-{mode}", mode)
    await run({"messages": [HumanMessage("refund INV-7")]})
    await run(Command(resume=APPROVE))
    assert await run({"messages": [HumanMessage("refund INV-7 again, to be sure")]}) == []
    assert (len(run.questions), effects.count()) == (1, 1)
    assert "refund #1" in str(run.tool_messages()[-1].content)

    # LangChain's HITL with a plain tool: asked again, and the refund runs again.
    effects = Effects()
    plain = Run(plain_hitl_agent(effects), f"plain-later-{mode}", mode)
    await plain({"messages": [HumanMessage("refund INV-7")]})
    await plain(Command(resume={"decisions": [{"type": "approve"}]}))
    await plain({"messages": [HumanMessage("refund INV-7 again, to be sure")]})
    await plain(Command(resume={"decisions": [{"type": "approve"}]}))
    assert (len(plain.questions), effects.count()) == (2, 2)


@MODES
async def test_parallel_calls_get_one_interrupt_each_resumed_one_at_a_time(
    any_store: BaseIdempotencyStore, mode: str
) -> None:
    store, effects = any_store, Effects()
    first, second = {"invoice_id": "INV-1", "amount": 10}, {"invoice_id": "INV-2", "amount": 20}
    model = ScriptedChatModel(then=on_each_turn(("issue_refund", first), ("issue_refund", second)))
    agent = create_agent(
        model,
        tools=[refund_tool(effects)],
        middleware=[IdempotencyMiddleware(store, tools=["issue_refund"], approval=True)],
        checkpointer=InMemorySaver(),
    )
    run = Run(agent, f"parallel-{mode}", mode)
    questions = await run({"messages": [HumanMessage("refund both")]})
    assert len(questions) == 2 and len({q.id for q in questions}) == 2
    by_invoice = {q.value["action_requests"][0]["args"]["invoice_id"]: q for q in questions}

    left = await run(Command(resume={by_invoice["INV-1"].id: APPROVE}))
    assert [q.id for q in left] == [by_invoice["INV-2"].id]  # the same question, not a new one
    assert effects.log == [("issue_refund", {"invoice_id": "INV-1", "amount": 10})]

    assert await run(Command(resume={by_invoice["INV-2"].id: APPROVE})) == []
    assert sorted(args["invoice_id"] for _, args in effects.log) == ["INV-1", "INV-2"]
    assert (len(run.questions), effects.count()) == (2, 2)
    assert_every_call_answered(run.out["messages"])


class Crash(BaseException):
    """The process dying between the approval and the tool's effect."""


@MODES
async def test_a_crash_after_approval_does_not_ask_again_and_runs_once(
    any_store: BaseIdempotencyStore, mode: str
) -> None:
    store, effects = any_store, Effects()
    crashes = [Crash()]

    def issue_refund(invoice_id: str, amount: float) -> str:
        if crashes:
            raise crashes.pop()
        return f"refund #{effects.record('issue_refund')}"

    async def aissue_refund(invoice_id: str, amount: float) -> str:
        return issue_refund(invoice_id, amount)

    tool = StructuredTool.from_function(
        issue_refund, coroutine=aissue_refund, name="issue_refund", description="Refund."
    )
    checkpointer = InMemorySaver()
    model = ScriptedChatModel(then=on_each_turn(("issue_refund", REFUND)))
    middleware = IdempotencyMiddleware(store, tools=["issue_refund"], approval=True)
    agent = create_agent(model, tools=[tool], middleware=[middleware], checkpointer=checkpointer)
    run = Run(agent, f"crash-{mode}", mode)
    [question] = await run({"messages": [HumanMessage("refund INV-7")]})
    with pytest.raises(Crash):
        await run(Command(resume=APPROVE))
    key = question.value["action_requests"][0]["idempotency_key"]
    assert store.get(decision_key(key)) is not None  # the decision outlived the crash

    # A new worker picks the thread up from its checkpoint (no resume value given).
    assert await run(None) == []
    assert (len(run.questions), effects.count()) == (1, 1)


@MODES
async def test_an_approval_predicate_lets_small_refunds_through_unasked(
    any_store: BaseIdempotencyStore, mode: str
) -> None:
    store, effects = any_store, Effects()
    model = ScriptedChatModel(
        then=on_each_turn(
            ("issue_refund", {"invoice_id": "INV-1", "amount": 140}),
            ("issue_refund", {"invoice_id": "INV-2", "amount": 900}),
        )
    )
    agent = create_agent(
        model,
        tools=[refund_tool(effects)],
        middleware=[
            IdempotencyMiddleware(
                store,
                tools=["issue_refund"],
                approval={"issue_refund": lambda call: call.args["amount"] > 500},
            )
        ],
        checkpointer=InMemorySaver(),
    )
    run = Run(agent, f"predicate-{mode}", mode)
    [question] = await run({"messages": [HumanMessage("refund both")]})
    assert question.value["action_requests"][0]["args"]["amount"] == 900
    assert [a["invoice_id"] for _, a in effects.log] == ["INV-1"]  # ran unasked
    await run(Command(resume=APPROVE))
    assert (len(run.questions), effects.count()) == (1, 2)


# -- the wrapper in a hand-built ToolNode graph ---------------------------------------------


@MODES
async def test_the_wrapper_asks_in_a_tool_node_graph(
    any_store: BaseIdempotencyStore, mode: str
) -> None:
    store, effects = any_store, Effects()
    refund = idempotent(refund_tool(effects), store=store, approval=True)
    model = ScriptedChatModel(then=on_each_turn(("issue_refund", REFUND)))
    graph = tool_graph(model, [refund], checkpointer=InMemorySaver())
    run = Run(graph, f"wrapper-{mode}", mode)

    [question] = await run({"messages": [HumanMessage("refund INV-7")]})
    assert question.value["action_requests"][0]["args"] == REFUND
    await run(Command(resume={"decisions": [{"type": "reject", "message": "no"}]}))
    assert effects.count() == 0 and run.tool_messages()[-1].status == "error"

    [again] = await run({"messages": [HumanMessage("now yes")]})
    await run(Command(resume=APPROVE))
    assert await run({"messages": [HumanMessage("and again")]}) == []
    assert (len(run.questions), effects.count()) == (2, 1)
    assert store.get(again.value["action_requests"][0]["idempotency_key"]) is not None


def test_the_wrapper_predicate_sees_the_canonical_arguments() -> None:
    store, effects = InMemoryIdempotencyStore(), Effects()
    seen: list[Any] = []

    def ask(call: Any) -> bool:
        seen.append(dict(call.args))
        return False

    refund = idempotent(refund_tool(effects), store=store, approval=ask)
    model = ScriptedChatModel(then=on_each_turn(("issue_refund", {**REFUND, "amount": 140.0})))
    graph = tool_graph(model, [refund], checkpointer=InMemorySaver())
    graph.invoke({"messages": [HumanMessage("refund")]}, thread("pred"))
    assert seen == [{"invoice_id": "INV-7", "amount": 140}] and effects.count() == 1


def test_a_bad_approval_setting_is_a_clear_error() -> None:
    with pytest.raises(TypeError, match="approval must be True, False, a function"):
        idempotent(refund_tool(Effects()), store=InMemoryIdempotencyStore(), approval="yes")  # type: ignore[arg-type]


def test_a_resume_with_two_decisions_for_one_call_is_refused() -> None:
    store, effects = InMemoryIdempotencyStore(), Effects()
    run = Run(agent_with(store, effects, approval=True), "two", "sync")
    asyncio.run(run({"messages": [HumanMessage("refund INV-7")]}))
    with pytest.raises(ValueError, match="exactly one decision"):
        asyncio.run(run(Command(resume={"decisions": [{"type": "approve"}] * 2})))
    assert effects.count() == 0


def test_show_prints_the_decision_behind_a_record() -> None:
    import io
    from types import SimpleNamespace

    from langchain_idempotent.cli.records import show

    store, effects = InMemoryIdempotencyStore(), Effects()
    run = Run(agent_with(store, effects, approval=True), "show", "sync")
    [question] = asyncio.run(run({"messages": [HumanMessage("refund INV-7")]}))
    asyncio.run(run(Command(resume=APPROVE)))
    out = io.StringIO()
    key = question.value["action_requests"][0]["idempotency_key"]
    assert show(SimpleNamespace(key=key, json=False, decrypt=False), store=store, out=out) == 0
    assert "approval:    approve by alice" in out.getvalue()
