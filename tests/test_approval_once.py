"""An approval is used once: consumed by its one effect, never applied to another call.

``scope="turn"``: the same arguments in a later user turn are a new effect, asked about
again; under the default ``thread`` scope the later turn replays the completed effect and
is never asked. A decision that names another call than the one it answers is refused
before anything is saved. (A decision is never applied to other arguments under one key:
``test_approval_per_call.py``,
``test_a_stored_decision_approves_only_the_arguments_it_was_given_for``.)
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command
from pydantic import ValidationError

from langchain_idempotent import IdempotencyMiddleware, InMemoryIdempotencyStore
from tests.support.graphs import Effects, ScriptedChatModel, on_each_turn, thread
from tests.test_approval_fresh import PAYMENT, pay_tool

MODES = pytest.mark.parametrize("mode", ["sync", "async"])


async def two_turns(scope: str, mode: str) -> tuple[int, int]:
    """The same payment asked for in two user turns of one thread, every question
    approved. Returns (questions asked, payments)."""
    effects, store = Effects(), InMemoryIdempotencyStore()
    middleware = IdempotencyMiddleware(
        store, tools=["pay"], approval=True, interrupt_mode="per_call", scope=scope
    )
    model = ScriptedChatModel(then=on_each_turn(("pay", PAYMENT)))
    agent = create_agent(
        model, tools=[pay_tool(effects)], middleware=[middleware], checkpointer=InMemorySaver()
    )
    config, questions = thread(f"once-{scope}"), 0
    for turn in ("pay the invoice", "pay it again"):
        step: Any = {"messages": [HumanMessage(turn)]}
        while True:
            out = (
                agent.invoke(step, config) if mode == "sync" else await agent.ainvoke(step, config)
            )
            pending = out.get("__interrupt__", [])
            if not pending:
                break
            questions += len(pending)
            step = Command(resume={q.id: {"type": "approve"} for q in pending})
    return questions, effects.count()


@MODES
async def test_an_approval_is_spent_by_its_effect_a_later_turn_asks_again(mode: str) -> None:
    assert await two_turns("turn", mode) == (2, 2)
    # thread scope: the later turn is a replay of the completed effect, never asked
    assert await two_turns("thread", mode) == (1, 1)


@MODES
async def test_a_decision_naming_another_call_is_refused_before_anything_is_saved(
    mode: str,
) -> None:
    effects, store = Effects(), InMemoryIdempotencyStore()
    middleware = IdempotencyMiddleware(
        store, tools=["pay"], approval=True, interrupt_mode="per_call"
    )
    model = ScriptedChatModel(then=on_each_turn(("pay", PAYMENT)))
    agent = create_agent(
        model, tools=[pay_tool(effects)], middleware=[middleware], checkpointer=InMemorySaver()
    )
    config = thread("unknown-call")

    async def run(step: Any) -> dict[str, Any]:
        return agent.invoke(step, config) if mode == "sync" else await agent.ainvoke(step, config)

    [question] = (await run({"messages": [HumanMessage("pay")]}))["__interrupt__"]
    wrong = {"type": "approve", "tool_call_id": "call_that_does_not_exist"}
    with pytest.raises(ValidationError, match="names tool call 'call_that_does_not_exist'"):
        await run(Command(resume={question.id: wrong}))
    assert effects.count() == 0  # and only the question's record is kept
    assert [r.meta.get("kind") for r in store.list()] == ["approval_question"]
    right = {"type": "approve", "tool_call_id": question.value["tool_call_id"]}
    out = await run(Command(resume={question.id: right}))
    [answer] = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert answer.status == "success" and effects.count() == 1
