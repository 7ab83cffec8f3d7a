"""Approval in both of LangChain's formats, each answer bound to its call: proven against
LangChain's own ``HumanInTheLoopMiddleware`` in real ``create_agent`` graphs.

A scripted model emits two gated refunds in one ``AIMessage``; the graph keeps its
checkpoints in ``InMemorySaver``. Four columns run the same script: LangChain's HITL with
a plain tool, in its ``"batched"`` and ``"per_call"`` modes, and ``IdempotencyMiddleware``
with ``approval=True`` in both modes. Each scenario counts the refunds paid per invoice,
under ``invoke`` and ``ainvoke``:

=====================================================  =========  ========  ====  ====
scenario                                               LC batch   LC per    ours  ours
                                                                  call      (b)   (pc)
=====================================================  =========  ========  ====  ====
answer both                                            2          2         2     2
the same answers re-sent against the checkpoint        4          4         2     2
  that asked
one answer invalid, then all corrected                 stuck, 0   2         2     2
=====================================================  =========  ========  ====  ====

Before answers were checked against a ``response_schema``, ours (batched) gave "stuck, 1"
under ``invoke`` and "stuck, 2, one paid twice" under ``ainvoke`` in the last row (issue
21): the invalid answer was saved and re-read, and on the async path the valid call's task
was cancelled after its refund went out. The async refund here takes a moment after its
effect (as a provider's answer does), which is the window that cancellation fell into.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import HumanInTheLoopMiddleware
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command
from pydantic import ValidationError

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

ONE, TWO = {"invoice_id": "INV-1", "amount": 10}, {"invoice_id": "INV-2", "amount": 20}
APPROVE: dict[str, Any] = {"type": "approve"}
INVALID: dict[str, Any] = {"type": "approve-please"}  # not a decision type
#: These tests route answers, not takeovers: a lease no stall of a loaded CI machine outlasts
#: (under the 2 s default one, a call whose run stalled 1.5 s was taken over and its refund
#: paid twice; docs/effects.md, "Leases"), as in tests/test_approval_parallel.py.
LEASE = 60
COLUMNS = ["langchain-batched", "langchain-per_call", "ours-batched", "ours-per_call"]
MODES = pytest.mark.parametrize("mode", ["sync", "async"])


def refund_tool(effects: Effects) -> BaseTool:
    def issue_refund(invoice_id: str, amount: float) -> str:
        n = effects.record("issue_refund", invoice_id=invoice_id, amount=amount)
        return f"refund #{n}: {amount:g} on {invoice_id}"

    async def aissue_refund(invoice_id: str, amount: float) -> str:
        result = issue_refund(invoice_id, amount)  # the POST has gone out ...
        await asyncio.sleep(0.05)  # ... and its answer takes a moment
        return result

    return StructuredTool.from_function(
        issue_refund, coroutine=aissue_refund, name="issue_refund", description="Refund."
    )


def agent(column: str, effects: Effects, store: BaseIdempotencyStore, *calls: Any) -> Any:
    """One ``create_agent`` graph for ``column``, its model asking for ``calls`` at once."""
    owner, mode = column.split("-")
    middleware: Any = (
        HumanInTheLoopMiddleware(interrupt_on={"issue_refund": True}, interrupt_mode=mode)
        if owner == "langchain"
        else IdempotencyMiddleware(
            store, tools=["issue_refund"], approval=True, interrupt_mode=mode, lease=LEASE
        )
    )
    model = ScriptedChatModel(
        then=on_each_turn(*(("issue_refund", c) for c in calls or (ONE, TWO)))
    )
    return create_agent(
        model, tools=[refund_tool(effects)], middleware=[middleware], checkpointer=InMemorySaver()
    )


def invoice_of(args: dict[str, Any]) -> str:
    return str(args["invoice_id"])


def keys_by_invoice(pending: Any) -> dict[str, str]:
    """The idempotency key each of our questions names, by invoice."""
    found = {}
    for question in pending:
        value = question.value
        for action in value.get("action_requests", [value]):
            found[invoice_of(action["args"])] = action["idempotency_key"]
    return found


def answers(pending: Any, plan: Callable[[str], dict[str, Any]]) -> Command[Any]:
    """One resume answering every pending question by its interrupt id, each call's
    decision chosen by ``plan(invoice)``, in the format the question came in."""
    resume: dict[str, Any] = {}
    for question in pending:
        value = question.value
        if value.get("type") == "tool_approval":  # per call: one bare decision
            resume[question.id] = plan(invoice_of(value["args"]))
        else:  # batched: {"decisions": [...]}, one per action request, in order
            invoices = [invoice_of(a["args"]) for a in value["action_requests"]]
            resume[question.id] = {"decisions": [plan(i) for i in invoices]}
    return Command(resume=resume)


class Thread:
    """One agent thread: runs a step sync or async; counts questions and refunds."""

    def __init__(
        self, graph: Any, effects: Effects, store: BaseIdempotencyStore, name: str, mode: str
    ) -> None:
        self.graph, self.effects, self.store, self.mode = graph, effects, store, mode
        self.config: RunnableConfig = thread(name)
        self.out: dict[str, Any] = {}

    async def __call__(self, step: Any, config: RunnableConfig | None = None) -> list[Any]:
        config = config or self.config
        if self.mode == "async":
            self.out = await self.graph.ainvoke(step, config)
        else:
            self.out = self.graph.invoke(step, config)
        return list(self.out.get("__interrupt__", ()))

    def pending(self) -> list[Any]:
        return list(self.graph.get_state(self.config).interrupts)

    def refunds(self) -> Counter[str]:
        return Counter(invoice_of(args) for _, args in self.effects.log)

    def tool_messages(self) -> list[ToolMessage]:
        return [m for m in self.out["messages"] if isinstance(m, ToolMessage)]


def new_thread(column: str, mode: str, name: str, *calls: Any) -> Thread:
    effects, store = Effects(), InMemoryIdempotencyStore()
    graph = agent(column, effects, store, *calls)
    return Thread(graph, effects, store, f"{name}-{column}-{mode}", mode)


# -- the issue's table ----------------------------------------------------------------------


async def answer_both(column: str, mode: str) -> int:
    run = new_thread(column, mode, "both")
    pending = await run({"messages": [HumanMessage("refund both")]})
    await run(answers(pending, lambda _: APPROVE))
    assert run.pending() == []
    assert_every_call_answered(run.out["messages"])
    return sum(run.refunds().values())


async def resend_against_the_asking_checkpoint(column: str, mode: str) -> int:
    """A client that sends its answers twice (a retried request, a double click): the
    second time against the checkpoint that asked."""
    run = new_thread(column, mode, "resend")
    pending = await run({"messages": [HumanMessage("refund both")]})
    asked = run.graph.get_state(run.config).config  # the checkpoint that asked
    resume = answers(pending, lambda _: APPROVE)
    await run(resume)
    await run(resume, asked)
    return sum(run.refunds().values())


async def one_invalid_then_corrected(column: str, mode: str) -> str:
    """Both answered in one resume, one with a bad decision type; then both sent again,
    corrected. ``"stuck, N"`` when the corrected resume cannot finish."""
    run = new_thread(column, mode, "invalid")
    pending = await run({"messages": [HumanMessage("refund both")]})
    with pytest.raises((ValueError, ValidationError)):
        await run(answers(pending, lambda i: INVALID if i == "INV-2" else APPROVE))
    if column.startswith("ours"):  # refused before anything was saved for INV-2
        key = keys_by_invoice(pending)["INV-2"]
        assert run.store.get(key) is None and run.store.get(decision_key(key)) is None
    try:
        await run(answers(pending, lambda _: APPROVE))
        left = run.pending()
    except (ValueError, ValidationError):
        left = ["error"]
    refunds = run.refunds()
    figure = f"{'stuck, ' if left else ''}{sum(refunds.values())}"
    if any(n > 1 for n in refunds.values()):
        figure += ", one paid twice"
    if not left:
        assert_every_call_answered(run.out["messages"])
    return figure


TABLE: dict[str, dict[str, Any]] = {
    "answer both": {c: 2 for c in COLUMNS},
    "re-sent against the checkpoint that asked": {
        "langchain-batched": 4,
        "langchain-per_call": 4,
        "ours-batched": 2,
        "ours-per_call": 2,
    },
    "one invalid, then corrected": {
        "langchain-batched": "stuck, 0",
        "langchain-per_call": "2",
        "ours-batched": "2",
        "ours-per_call": "2",
    },
}
SCENARIOS = {
    "answer both": answer_both,
    "re-sent against the checkpoint that asked": resend_against_the_asking_checkpoint,
    "one invalid, then corrected": one_invalid_then_corrected,
}


@MODES
@pytest.mark.parametrize("column", COLUMNS)
@pytest.mark.parametrize("scenario", list(SCENARIOS))
async def test_the_issue_table_plain_langchain_against_ours(
    scenario: str, column: str, mode: str
) -> None:
    """Each cell of the table: LangChain's HITL pays twice on a re-sent answer (and stays
    stuck in batched mode after an invalid one); ours pays each approved refund once."""
    assert await SCENARIOS[scenario](column, mode) == TABLE[scenario][column]


# -- the per-call format ---------------------------------------------------------------------


def edit(invoice: str, amount: int) -> dict[str, Any]:
    args = {"invoice_id": invoice, "amount": amount}
    return {"type": "edit", "edited_action": {"name": "issue_refund", "args": args}}


@MODES
async def test_a_per_call_question_is_langchains_tool_approval_request_bound_to_the_key(
    mode: str,
) -> None:
    run = new_thread("ours-per_call", mode, "shape", ONE)
    [question] = await run({"messages": [HumanMessage("refund INV-1")]})
    value = question.value
    assert value["type"] == "tool_approval" and value["name"] == "issue_refund"
    assert value["args"] == ONE and value["tool_call_id"].startswith("call_")
    assert "Idempotency key: " + value["idempotency_key"] in value["description"]
    assert len(value["args_hash"]) == 32
    # The response_schema LangGraph publishes: the three decisions, an edit's args as the
    # tool's own argument schema.
    schema = question.response_schema
    assert schema is not None
    text = str(schema)
    assert all(f"'{kind}'" in text for kind in ("approve", "edit", "reject"))
    assert "invoice_id" in text and "amount" in text
    # LangChain's per-call question has the same fields (ours adds the key and hash).
    plain = new_thread("langchain-per_call", mode, "shape", ONE)
    [theirs] = await plain({"messages": [HumanMessage("refund INV-1")]})
    assert set(theirs.value) == set(value) - {"idempotency_key", "args_hash"}


@MODES
@pytest.mark.parametrize("column", ["ours-per_call", "ours-batched"])
async def test_approve_edit_and_reject_each_call_by_interrupt_id(column: str, mode: str) -> None:
    three = {"invoice_id": "INV-3", "amount": 30}
    run = new_thread(column, mode, "per-id", ONE, TWO, three)
    pending = await run({"messages": [HumanMessage("refund all three")]})
    assert len(pending) == 3 and len({q.id for q in pending}) == 3
    plan = {
        "INV-1": APPROVE,
        "INV-2": edit("INV-2", 5),
        "INV-3": {"type": "reject", "message": "not this one"},
    }
    # One question answered per resume, in an order unlike the model's.
    by_invoice = {
        invoice_of(q.value.get("args") or q.value["action_requests"][0]["args"]): q for q in pending
    }
    for invoice in ("INV-3", "INV-1", "INV-2"):
        single = answers([by_invoice[invoice]], lambda i: plan[i])
        left = await run(single)
        assert by_invoice[invoice].id not in {q.id for q in left}
    assert run.pending() == []
    assert sorted(args["amount"] for _, args in run.effects.log) == [5, 10]
    rejected = [m for m in run.tool_messages() if m.status == "error"]
    assert len(rejected) == 1 and "not this one" in str(rejected[0].content)
    assert_every_call_answered(run.out["messages"])
    keys = keys_by_invoice(pending)
    assert run.store.get(keys["INV-2"]) is None  # the edit ran under its own key
    assert run.store.get(decision_key(keys["INV-3"])) is None  # a "no" is not memoized


@MODES
async def test_parallel_gated_calls_answered_in_one_resume_each_run_once(mode: str) -> None:
    calls = [{"invoice_id": f"INV-{i}", "amount": 10 * i} for i in range(1, 5)]
    run = new_thread("ours-per_call", mode, "parallel", *calls)
    pending = await run({"messages": [HumanMessage("refund all")]})
    assert len(pending) == 4
    resume = answers(pending, lambda i: edit(i, 1) if i == "INV-4" else APPROVE)
    assert await run(resume) == []
    await run(resume)  # the same answers once more: nothing runs again
    assert run.refunds() == Counter({"INV-1": 1, "INV-2": 1, "INV-3": 1, "INV-4": 1})
    assert_every_call_answered(run.out["messages"])


@MODES
async def test_an_edit_that_does_not_fit_the_tool_schema_is_refused_before_it_is_saved(
    mode: str,
) -> None:
    run = new_thread("ours-per_call", mode, "bad-edit", ONE)
    [question] = await run({"messages": [HumanMessage("refund INV-1")]})
    records = run.store.list()
    bad = {"type": "edit", "edited_action": {"name": "issue_refund", "args": {"amount": "lots"}}}
    with pytest.raises(ValidationError, match="does not fit its arguments") as refused:
        await run(Command(resume={question.id: bad}))
    from langgraph.errors import is_invalid_resume

    assert is_invalid_resume(refused.value)  # LangGraph refused it: nothing saved
    assert run.store.list() == records and run.effects.count() == 0
    await run(Command(resume={question.id: edit("INV-1", 3)}))  # answered again
    assert run.refunds() == Counter({"INV-1": 1}) and run.effects.log[0][1]["amount"] == 3


@MODES
async def test_the_wrapper_asks_per_call_in_a_tool_node_binding_each_answer_to_its_key(
    mode: str,
) -> None:
    """A hand-built ToolNode runs both calls in one task: the questions come one at a
    time, each answer goes to the call whose key its question names."""
    effects, store = Effects(), InMemoryIdempotencyStore()
    refund = idempotent(
        refund_tool(effects), store=store, approval=True, interrupt_mode="per_call", lease=LEASE
    )
    model = ScriptedChatModel(then=on_each_turn(("issue_refund", ONE), ("issue_refund", TWO)))
    run = Thread(
        tool_graph(model, [refund], checkpointer=InMemorySaver()),
        effects,
        store,
        f"wrapper-{mode}",
        mode,
    )
    plan = {"INV-1": edit("INV-1", 7), "INV-2": APPROVE}
    pending = await run({"messages": [HumanMessage("refund both")]})
    asked = []
    for _ in range(4):
        if not pending:
            break
        [question] = pending
        assert question.value["type"] == "tool_approval"
        asked.append(invoice_of(question.value["args"]))
        pending = await run(answers([question], lambda i: plan[i]))
    assert sorted(asked) == ["INV-1", "INV-2"]
    assert sorted((invoice_of(a), a["amount"]) for _, a in effects.log) == [
        ("INV-1", 7),
        ("INV-2", 20),
    ]
    assert_every_call_answered(run.out["messages"])


def test_interrupt_mode_is_checked_and_per_call_needs_a_tool_call_id() -> None:
    store = InMemoryIdempotencyStore()
    with pytest.raises(ValueError, match="interrupt_mode must be 'batched' or 'per_call'"):
        IdempotencyMiddleware(store, tools=["issue_refund"], interrupt_mode="each")  # type: ignore[arg-type]
    refund = idempotent(
        refund_tool(Effects()), store=store, approval=True, interrupt_mode="per_call"
    )

    def node(state: Any, config: RunnableConfig) -> dict[str, Any]:
        refund.invoke(ONE, config)  # a dict, not a ToolCall: no tool call id
        return {}

    from langgraph.graph import START, MessagesState, StateGraph

    builder = StateGraph(MessagesState)
    builder.add_node("node", node)
    builder.add_edge(START, "node")
    graph = builder.compile(checkpointer=InMemorySaver())
    with pytest.raises(ValueError, match=r"without a tool call id.*interrupt_mode='batched'"):
        graph.invoke({"messages": []}, thread("no-id"))


class Crash(BaseException):
    """The process dying between the approval and the tool's effect."""


@MODES
async def test_a_stored_decision_approves_only_the_arguments_it_was_given_for(mode: str) -> None:
    """A key function gives both calls one key; the reviewer approved INV-1 for 10, then the
    worker died before the refund. A call under that key for 20 is asked about, not run on
    the stored approval."""
    store = InMemoryIdempotencyStore()

    def crashing_refund(effects: Effects) -> BaseTool:
        def issue_refund(invoice_id: str, amount: float) -> str:
            raise Crash

        async def aissue_refund(invoice_id: str, amount: float) -> str:
            raise Crash

        return StructuredTool.from_function(
            issue_refund, coroutine=aissue_refund, name="issue_refund", description="Refund."
        )

    def agent_for(tool: BaseTool, args: dict[str, Any]) -> Any:
        middleware = IdempotencyMiddleware(
            store,
            tools=["issue_refund"],
            approval=True,
            interrupt_mode="per_call",
            scope=lambda call: f"refund:{call.args['invoice_id']}",
        )
        model = ScriptedChatModel(then=on_each_turn(("issue_refund", args)))
        return create_agent(
            model, tools=[tool], middleware=[middleware], checkpointer=InMemorySaver()
        )

    first = Thread(agent_for(crashing_refund(Effects()), ONE), Effects(), store, "first", mode)
    [question] = await first({"messages": [HumanMessage("refund INV-1")]})
    with pytest.raises(Crash):
        await first(Command(resume={question.id: APPROVE}))
    assert store.get(decision_key(question.value["idempotency_key"])) is not None

    effects = Effects()
    other = {"invoice_id": "INV-1", "amount": 20}
    second = Thread(agent_for(refund_tool(effects), other), effects, store, "second", mode)
    [asked] = await second({"messages": [HumanMessage("refund INV-1, 20")]})
    assert asked.value["idempotency_key"] == question.value["idempotency_key"]
    assert asked.value["args"] == other and asked.value["args_hash"] != question.value["args_hash"]
    assert effects.count() == 0  # not run on the approval given for 10
