"""A replayed ``ToolMessage`` / ``Command`` answers the current call, and only that.

The ``ToolMessage`` that answered the stored call gets the current call's id and keeps
its name; every other message in the update keeps its ids, so ``add_messages`` merges it
with itself. Every form of ``Command.update`` (mapping, ``(channel, value)`` pairs, a bare
message list) and a tool invoked with ``{..., "tool_call_id": "direct"}``.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import pytest
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langchain_core.tools import InjectedToolCallId, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode
from langgraph.types import Command
from pydantic import BaseModel

from langchain_idempotent import InMemoryIdempotencyStore, idempotency_scope, idempotent
from tests.support.graphs import (
    Effects,
    ScriptedChatModel,
    assert_every_call_answered,
    call,
    on_each_turn,
    thread,
    tool_graph,
)


@pytest.fixture
def store() -> InMemoryIdempotencyStore:
    return InMemoryIdempotencyStore()


OLD_AI = AIMessage("", id="ai-0", tool_calls=[call("lookup", {}, "older")])
OLD_ANSWER = ToolMessage("found", tool_call_id="older", name="lookup", id="tm-0")


def _status_tool(form: str, effects: Effects) -> Any:
    @tool
    def set_status(status: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> Command[Any]:
        """Set the ticket status."""
        effects.record("set_status")
        answer = ToolMessage(f"status={status}", tool_call_id=tool_call_id, name="set_status")
        messages = [OLD_AI, OLD_ANSWER, answer]
        if form == "dict":
            return Command(update={"status": status, "messages": messages})
        if form == "pairs":
            return Command(update=[("status", status), ("messages", messages)])
        return Command(update=messages)

    return set_status


@pytest.mark.parametrize("run", ["sync", "async"])
@pytest.mark.parametrize("form", ["dict", "pairs", "list"])
def test_a_replayed_command_re_stamps_only_the_answer_to_the_stored_call(
    store: InMemoryIdempotencyStore, form: str, run: str
) -> None:
    effects = Effects()
    wrapped = idempotent(_status_tool(form, effects), store)

    def invoke(call_id: str) -> Any:
        request = call("set_status", {"status": "closed"}, call_id)
        if run == "async":
            return asyncio.run(wrapped.ainvoke(request))
        return wrapped.invoke(request)

    with idempotency_scope("s"):
        first, again = invoke("a"), invoke("b")
    assert effects.count() == 1
    for result, current in ((first, "a"), (again, "b")):
        assert isinstance(result, Command)
        update = result.update
        if form == "dict":
            assert isinstance(update, dict)
            messages = update["messages"]
        elif form == "pairs":
            assert isinstance(update, list)
            assert dict(update)["status"] == "closed"
            messages = dict(update)["messages"]
        else:
            messages = update
        old_ai, old_answer, answer = messages
        # The messages the tool copied from the state are untouched: same ids, same call.
        assert (old_ai.id, old_ai.tool_calls[0]["id"]) == ("ai-0", "older")
        assert (old_answer.id, old_answer.tool_call_id) == ("tm-0", "older")
        # Only the answer changes, and it keeps its name.
        assert (answer.tool_call_id, answer.name) == (current, "set_status")
        assert answer.content == "status=closed"


def test_a_replayed_list_update_answers_the_current_call_in_a_tool_node() -> None:
    """``Command(update=[ToolMessage(...)])`` on a graph whose state is the message list,
    LangGraph's own form: ToolNode requires the update to answer its call."""
    effects = Effects()
    store = InMemoryIdempotencyStore()

    @tool
    def transfer(tool_call_id: Annotated[str, InjectedToolCallId]) -> Command[Any]:
        """Hand the conversation over."""
        effects.record("transfer")
        return Command(update=[ToolMessage("transferred", tool_call_id=tool_call_id)])

    builder = StateGraph(Annotated[list[AnyMessage], add_messages])
    builder.add_node("tools", ToolNode([idempotent(transfer, store)]))
    builder.add_edge(START, "tools")
    builder.add_edge("tools", END)
    graph = builder.compile(checkpointer=InMemorySaver())
    config = thread("list-update")
    graph.invoke([AIMessage("", tool_calls=[call("transfer", {}, "t1")])], config)
    out = graph.invoke([AIMessage("", tool_calls=[call("transfer", {}, "t2")])], config)
    assert effects.count() == 1
    assert [m.tool_call_id for m in out if isinstance(m, ToolMessage)] == ["t1", "t2"]
    assert [m.name for m in out if isinstance(m, ToolMessage)] == ["transfer"] * 2
    assert_every_call_answered(out)


def test_a_replayed_command_keeps_the_history_valid_in_an_agent_loop() -> None:
    effects = Effects()
    store = InMemoryIdempotencyStore()

    @tool
    def close_ticket(ticket: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> Command[Any]:
        """Close a ticket."""
        effects.record("close")
        return Command(
            update={"messages": [ToolMessage(f"closed {ticket}", tool_call_id=tool_call_id)]}
        )

    model = ScriptedChatModel(then=on_each_turn(("close_ticket", {"ticket": "T-1"})))
    graph = tool_graph(model, [idempotent(close_ticket, store)], checkpointer=InMemorySaver())
    config = thread("agent-loop")
    graph.invoke({"messages": [HumanMessage("close T-1")]}, config)
    out = graph.invoke({"messages": [HumanMessage("close it again")]}, config)
    assert effects.count() == 1
    assert_every_call_answered(out["messages"])


def test_a_tool_message_of_a_direct_call_is_re_stamped_to_the_id_it_was_given(
    store: InMemoryIdempotencyStore,
) -> None:
    class Input(BaseModel):
        x: int

    @tool(args_schema=Input)
    def echo(x: int, tool_call_id: Annotated[str, InjectedToolCallId]) -> ToolMessage:
        """Echo x."""
        return ToolMessage(str(x), tool_call_id=tool_call_id)

    wrapped = idempotent(echo, store)
    with idempotency_scope("s"):
        first = wrapped.invoke({"x": 42, "tool_call_id": "direct"})
        again = wrapped.invoke({"x": 42, "tool_call_id": "direct-2"})
    assert first == ToolMessage("42", tool_call_id="direct")
    assert (again.content, again.tool_call_id) == ("42", "direct-2")
