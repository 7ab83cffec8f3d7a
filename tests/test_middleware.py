"""``IdempotencyMiddleware``: the same engine as the wrapper, as a ``create_agent`` middleware.

It wraps only the tools it names, works under ``invoke`` and ``ainvoke`` (``wrap_tool_call``
and ``awrap_tool_call``), and, because results returned by middleware skip ToolNode's
validation, re-stamps every replayed ``ToolMessage`` / ``Command`` with the current call.
"""

from __future__ import annotations

import asyncio
import importlib
import sys
from typing import Annotated, Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, InjectedToolCallId, StructuredTool, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from langgraph.types import Command

from langchain_idempotent import (
    IdempotencyMiddleware,
    InMemoryIdempotencyStore,
    MissingScopeError,
    idempotent,
)
from tests.support.graphs import (
    Effects,
    EventRecorder,
    ScriptedChatModel,
    assert_every_call_answered,
    call,
    calls,
    on_each_turn,
    thread,
    tool_results,
)

REFUND = {"invoice_id": "INV-7", "amount": 140}
LOOKUP = {"invoice_id": "INV-7"}


def _tools(effects: Effects) -> list[BaseTool]:
    def issue_refund(invoice_id: str, amount: float) -> str:
        return f"refund #{effects.record('issue_refund')}: {amount:g} on {invoice_id}"

    async def aissue_refund(invoice_id: str, amount: float) -> str:
        await asyncio.sleep(0)
        return issue_refund(invoice_id, amount)

    def lookup_invoice(invoice_id: str) -> str:
        return f"lookup #{effects.record('lookup_invoice')}: {invoice_id} is $140"

    async def alookup_invoice(invoice_id: str) -> str:
        return lookup_invoice(invoice_id)

    return [
        StructuredTool.from_function(
            issue_refund, coroutine=aissue_refund, name="issue_refund", description="Refund."
        ),
        StructuredTool.from_function(
            lookup_invoice, coroutine=alookup_invoice, name="lookup_invoice", description="Look up."
        ),
    ]


async def run(graph: Any, input: Any, config: RunnableConfig, mode: str) -> dict[str, Any]:
    if mode == "async":
        return await graph.ainvoke(input, config)  # type: ignore[no-any-return]
    return graph.invoke(input, config)  # type: ignore[no-any-return]


@pytest.fixture
def store() -> InMemoryIdempotencyStore:
    return InMemoryIdempotencyStore()


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_only_the_named_tools_run_once_per_key(
    store: InMemoryIdempotencyStore, mode: str
) -> None:
    effects = Effects()
    model = ScriptedChatModel(
        then=on_each_turn(("lookup_invoice", LOOKUP), ("issue_refund", REFUND))
    )
    agent = create_agent(
        model,
        tools=_tools(effects),
        middleware=[IdempotencyMiddleware(store, tools=["issue_refund"])],
        checkpointer=InMemorySaver(),
    )
    recorder = EventRecorder()
    config: RunnableConfig = {**thread(f"mw-{mode}"), "callbacks": [recorder]}
    await run(agent, {"messages": [HumanMessage("refund INV-7")]}, config, mode)
    out = await run(agent, {"messages": [HumanMessage("did it work?")]}, config, mode)

    assert effects.count("issue_refund") == 1
    assert effects.count("lookup_invoice") == 2  # not named: runs every time
    refunds = [(i, c) for i, c in tool_results(out["messages"]) if c.startswith("refund")]
    assert [c for _, c in refunds] == ["refund #1: 140 on INV-7"] * 2
    assert refunds[0][0] != refunds[1][0]
    assert_every_call_answered(out["messages"])
    [record] = store.list(thread_id=f"mw-{mode}")
    assert (record.meta["tool"], record.meta["node"]) == ("issue_refund", "tools")


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_replayed_command_is_re_stamped_to_the_current_call(
    store: InMemoryIdempotencyStore, mode: str
) -> None:
    effects = Effects()

    @tool
    def close_ticket(
        ticket_id: str, tool_call_id: Annotated[str, InjectedToolCallId]
    ) -> Command[Any]:
        """Close a ticket."""
        n = effects.record("close_ticket")
        return Command(
            update={
                "messages": [ToolMessage(f"closed {ticket_id} (#{n})", tool_call_id=tool_call_id)]
            }
        )

    model = ScriptedChatModel(
        script=[
            calls(call("close_ticket", {"ticket_id": "T-1"}, "first")),
            calls(call("close_ticket", {"ticket_id": "T-1"}, "second")),
        ]
    )
    agent = create_agent(
        model,
        tools=[close_ticket],
        middleware=[IdempotencyMiddleware(store, tools=[close_ticket])],
        checkpointer=InMemorySaver(),
    )
    out = await run(agent, {"messages": [HumanMessage("close T-1")]}, thread(f"cmd-{mode}"), mode)
    assert effects.count() == 1
    assert tool_results(out["messages"]) == [
        ("first", "closed T-1 (#1)"),
        ("second", "closed T-1 (#1)"),
    ]
    # Without the stale id dropped, the replay would have replaced the first message.
    assert_every_call_answered(out["messages"])


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_replayed_tool_message_is_re_stamped_to_the_current_call(
    store: InMemoryIdempotencyStore, mode: str
) -> None:
    model = ScriptedChatModel(
        script=[calls(call("issue_refund", REFUND, "a")), calls(call("issue_refund", REFUND, "b"))]
    )
    agent = create_agent(
        model,
        tools=_tools(Effects()),
        middleware=[IdempotencyMiddleware(store, tools=["issue_refund"])],
        checkpointer=InMemorySaver(),
    )
    out = await run(agent, {"messages": [HumanMessage("refund")]}, thread(f"tm-{mode}"), mode)
    messages = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert [(m.tool_call_id, m.name, m.content) for m in messages] == [
        ("a", "issue_refund", "refund #1: 140 on INV-7"),
        ("b", "issue_refund", "refund #1: 140 on INV-7"),
    ]
    assert messages[0].id != messages[1].id


async def test_under_ainvoke_the_async_hook_runs_an_async_only_tool(
    store: InMemoryIdempotencyStore,
) -> None:
    effects = Effects()

    async def send_email(to: str) -> str:
        await asyncio.sleep(0)
        return f"email #{effects.record('send_email')}"

    inner = StructuredTool.from_function(
        coroutine=send_email, name="send_email", description="Send."
    )
    agent = create_agent(
        ScriptedChatModel(then=on_each_turn(("send_email", {"to": "a@example.com"}))),
        tools=[inner],
        middleware=[IdempotencyMiddleware(store, tools=["send_email"])],
        checkpointer=InMemorySaver(),
    )
    config = thread("async-only")
    await agent.ainvoke({"messages": [HumanMessage("send")]}, config)
    out = await agent.ainvoke({"messages": [HumanMessage("send again")]}, config)
    assert effects.count() == 1
    assert [c for _, c in tool_results(out["messages"])] == ["email #1"] * 2


@pytest.mark.parametrize(("scope", "expected"), [("thread", 1), ("turn", 2)])
def test_the_turn_scope_reads_the_user_turn_from_the_agent_state(
    store: InMemoryIdempotencyStore, scope: str, expected: int
) -> None:
    effects = Effects()
    agent = create_agent(
        ScriptedChatModel(then=on_each_turn(("issue_refund", REFUND))),
        tools=_tools(effects),
        middleware=[IdempotencyMiddleware(store, tools=["issue_refund"], scope=scope)],
        checkpointer=InMemorySaver(),
    )
    config = thread(f"turns-{scope}")
    agent.invoke({"messages": [HumanMessage("refund")]}, config)
    agent.invoke({"messages": [HumanMessage("refund once more")]}, config)
    assert effects.count("issue_refund") == expected


def test_a_failed_call_is_released_and_the_next_turn_runs_it_again(
    store: InMemoryIdempotencyStore,
) -> None:
    effects = Effects()

    @tool
    def charge(card: str) -> str:
        """Charge a card."""
        if effects.record("charge") == 1:
            raise ConnectionError("gateway reset")
        return "charged"

    agent = create_agent(
        ScriptedChatModel(then=on_each_turn(("charge", {"card": "4242"}))),
        tools=[charge],
        middleware=[IdempotencyMiddleware(store, tools=["charge"])],
        checkpointer=InMemorySaver(),
    )
    config = thread("errors")
    with pytest.raises(ConnectionError):
        agent.invoke({"messages": [HumanMessage("charge")]}, config)
    out = agent.invoke({"messages": [HumanMessage("try again")]}, config)
    assert effects.count() == 2
    assert tool_results(out["messages"])[-1][1] == "charged"


def test_the_middleware_and_the_wrapper_derive_the_same_key(
    store: InMemoryIdempotencyStore,
) -> None:
    effects = Effects()
    tools = _tools(effects)
    checkpointer = InMemorySaver()
    model = ScriptedChatModel(then=on_each_turn(("issue_refund", REFUND)))
    config = thread("migrate")
    wrapped = create_agent(
        model, tools=[idempotent(tools[0], store), tools[1]], checkpointer=checkpointer
    )
    wrapped.invoke({"messages": [HumanMessage("refund")]}, config)
    # The same thread, now served by an agent that uses the middleware instead.
    middleware = create_agent(
        model,
        tools=tools,
        middleware=[IdempotencyMiddleware(store, tools=["issue_refund"])],
        checkpointer=checkpointer,
    )
    out = middleware.invoke({"messages": [HumanMessage("refund again")]}, config)
    assert effects.count("issue_refund") == 1
    assert [c for _, c in tool_results(out["messages"])] == ["refund #1: 140 on INV-7"] * 2
    assert len(store.list(thread_id="migrate")) == 1


def test_the_middleware_needs_the_names_of_the_tools_it_wraps(
    store: InMemoryIdempotencyStore,
) -> None:
    with pytest.raises(ValueError, match="names of the tools"):
        IdempotencyMiddleware(store, tools=[])
    with pytest.raises(TypeError, match="unknown idempotency option"):
        IdempotencyMiddleware(store, tools=["x"], leese=3)


# -- a missing scope is the developer's mistake, never a tool failure for the model --------


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_missing_thread_id_reaches_the_developer_from_create_agent(
    store: InMemoryIdempotencyStore, mode: str
) -> None:
    effects = Effects()
    agent = create_agent(
        ScriptedChatModel(then=on_each_turn(("issue_refund", REFUND))),
        tools=_tools(effects),
        middleware=[IdempotencyMiddleware(store, tools=["issue_refund"])],
    )  # no checkpointer: no thread id
    with pytest.raises(MissingScopeError, match="without a thread id"):
        await run(agent, {"messages": [HumanMessage("refund")]}, {}, mode)
    assert effects.count() == 0


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_missing_thread_id_passes_through_a_tool_node_that_handles_every_error(
    store: InMemoryIdempotencyStore, mode: str
) -> None:
    effects = Effects()
    middleware = IdempotencyMiddleware(store, tools=["issue_refund"])
    node = ToolNode(
        _tools(effects),
        handle_tool_errors=True,
        wrap_tool_call=middleware.wrap_tool_call,
        awrap_tool_call=middleware.awrap_tool_call,
    )
    builder = StateGraph(MessagesState)
    builder.add_node("tools", node)
    builder.add_edge(START, "tools")
    graph = builder.compile()  # no checkpointer: no thread id
    state = {"messages": [calls(call("issue_refund", REFUND))]}
    with pytest.raises(MissingScopeError, match="without a thread id"):
        await run(graph, state, {}, mode)
    assert effects.count() == 0


def test_decisions_are_dispatched_as_callback_events(store: InMemoryIdempotencyStore) -> None:
    effects = Effects()
    agent = create_agent(
        ScriptedChatModel(then=on_each_turn(("issue_refund", REFUND))),
        tools=_tools(effects),
        middleware=[IdempotencyMiddleware(store, tools=["issue_refund"])],
        checkpointer=InMemorySaver(),
    )
    recorder = EventRecorder()
    config: RunnableConfig = {**thread("mw-events"), "callbacks": [recorder]}
    agent.invoke({"messages": [HumanMessage("refund")]}, config)
    agent.invoke({"messages": [HumanMessage("again")]}, config)
    assert recorder.names() == ["idempotency.replay"]


def test_importing_the_middleware_without_langchain_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in [m for m in sys.modules if m == "langchain" or m.startswith("langchain.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "langchain", None)  # what `import` sees when absent
    monkeypatch.delitem(sys.modules, "langchain_idempotent.adapters.middleware", raising=False)
    with pytest.raises(ImportError, match=r"pip install 'langchain-idempotent\[agents\]'"):
        importlib.import_module("langchain_idempotent.adapters.middleware")
