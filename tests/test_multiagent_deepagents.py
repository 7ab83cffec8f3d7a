"""deepagents, plain vs ours: a re-sent request, an ``interrupt()`` beside a ``task`` call,
a crash between sub-agents, and the ``task`` tool itself memoized (a finished sub-agent
run is replayed instead of run again: its LLM calls are saved)."""

from __future__ import annotations

from typing import Any

import pytest
from deepagents import create_deep_agent
from deepagents.backends import StateBackend
from deepagents.middleware.subagents import SubAgentMiddleware
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.tools import BaseTool, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command, interrupt

from langchain_idempotent import IdempotencyMiddleware, InMemoryIdempotencyStore, idempotent
from tests.support.agents import (
    GatewayError,
    Ledger,
    ReplyModel,
    email_tool,
    last_tool_result,
    refund_tool,
)
from tests.support.graphs import assert_every_call_answered, thread

PROTECTIONS = ["plain", "ours"]
REQUEST = {"messages": [HumanMessage("refund INV-7, $140 and tell C-42")]}


def protect(t: BaseTool, mode: str, store: InMemoryIdempotencyStore) -> Any:
    return t if mode == "plain" else idempotent(t, store)


def task(description: str, subagent_type: str, id: str) -> dict[str, Any]:
    args = {"description": description, "subagent_type": subagent_type}
    return {"name": "task", "args": args, "id": id}


def billing_model(fail: bool = False) -> ReplyModel:
    def reply(messages: list[BaseMessage]) -> AIMessage:
        if last_tool_result(messages) is not None:
            return AIMessage("refunded INV-7")
        return AIMessage(
            "",
            tool_calls=[
                {"name": "issue_refund", "args": {"invoice_id": "INV-7", "amount": 140}, "id": "r1"}
            ],
        )

    return ReplyModel(reply=reply)


def comms_model(fail_once: bool) -> ReplyModel:
    def reply(messages: list[BaseMessage]) -> AIMessage:
        if last_tool_result(messages) is not None:
            return AIMessage("e-mailed C-42")
        args = {"customer_id": "C-42", "subject": "your refund"}
        return AIMessage("", tool_calls=[{"name": "send_email", "args": args, "id": "e1"}])

    # The comms sub-agent's gateway fails once, before it does anything.
    return ReplyModel(reply=reply, fail_when=lambda m: True, failures=1 if fail_once else 0)


def subagents(
    ledger: Ledger, mode: str, store: InMemoryIdempotencyStore, **models: Any
) -> list[Any]:
    return [
        {
            "name": "billing",
            "description": "refunds invoices",
            "system_prompt": "You refund invoices.",
            "tools": [protect(refund_tool(ledger), mode, store)],
            "model": models.get("billing") or billing_model(),
        },
        {
            "name": "comms",
            "description": "e-mails customers",
            "system_prompt": "You e-mail customers.",
            "tools": [protect(email_tool(ledger), mode, store)],
            "model": models.get("comms") or comms_model(False),
        },
    ]


def main_model(*first: dict[str, Any]) -> ReplyModel:
    """Delegates ``first`` (parallel calls), then answers once every call is answered."""

    def reply(messages: list[BaseMessage]) -> AIMessage:
        if last_tool_result(messages) is not None:
            return AIMessage("all done")
        return AIMessage("", tool_calls=[dict(c) for c in first])

    return ReplyModel(reply=reply)


@pytest.mark.parametrize("mode", PROTECTIONS)
def test_a_deep_agent_re_sent_the_same_request_refunds_once(mode: str) -> None:
    ledger, store = Ledger(), InMemoryIdempotencyStore()
    agent = create_deep_agent(
        model=main_model(task("refund INV-7 $140", "billing", "t1")),
        subagents=subagents(ledger, mode, store),
        checkpointer=InMemorySaver(),
    )
    config = thread(f"deep-resend-{mode}")
    for _ in range(2):
        out = agent.invoke(REQUEST, config)
        assert_every_call_answered(out["messages"])
    assert ledger.count("refund") == {"plain": 2, "ours": 1}[mode]
    if mode == "ours":
        [record] = store.list(thread_id=config["configurable"]["thread_id"])
        assert (record.meta["graph_path"], record.meta["agent"]) == ("tools|tools", "billing")


@pytest.mark.parametrize("mode", PROTECTIONS)
def test_an_interrupt_beside_a_task_call_does_not_refund_again_on_resume(mode: str) -> None:
    ledger, store = Ledger(), InMemoryIdempotencyStore()

    @tool
    def ask_manager(question: str) -> str:
        """Ask the manager and wait for the answer."""
        return str(interrupt(question))

    agent = create_deep_agent(
        model=main_model(
            task("refund INV-7 $140", "billing", "t1"),
            {"name": "ask_manager", "args": {"question": "also waive the fee?"}, "id": "q1"},
        ),
        tools=[ask_manager],
        subagents=subagents(ledger, mode, store),
        checkpointer=InMemorySaver(),
    )
    config = thread(f"deep-interrupt-{mode}")
    paused = agent.invoke(REQUEST, config)
    assert paused["__interrupt__"]
    out = agent.invoke(Command(resume="yes"), config)
    assert_every_call_answered(out["messages"])
    # A second resume-style retry of the whole request (the caller did not see the answer).
    out = agent.invoke(REQUEST, config)
    if "__interrupt__" in out:
        out = agent.invoke(Command(resume="yes"), config)
    assert_every_call_answered(out["messages"])
    assert ledger.count("refund") == {"plain": 2, "ours": 1}[mode]


@pytest.mark.parametrize("mode", PROTECTIONS)
def test_a_crash_between_sub_agents_then_a_retry_refunds_once_and_e_mails_once(mode: str) -> None:
    """billing refunds, then the comms sub-agent's gateway fails: the run raises. The
    caller re-sends the request; the agent plans it again from the start."""
    ledger, store = Ledger(), InMemoryIdempotencyStore()

    def reply(messages: list[BaseMessage]) -> AIMessage:
        last_human = max(i for i, m in enumerate(messages) if m.type == "human")
        done = {m.content for m in messages[last_human:] if m.type == "tool"}
        if "refunded INV-7" not in done:
            return AIMessage("", tool_calls=[task("refund INV-7 $140", "billing", "t1")])
        if "e-mailed C-42" not in done:
            return AIMessage("", tool_calls=[task("tell C-42", "comms", "t2")])
        return AIMessage("all done")

    agent = create_deep_agent(
        model=ReplyModel(reply=reply),
        subagents=subagents(ledger, mode, store, comms=comms_model(fail_once=True)),
        checkpointer=InMemorySaver(),
    )
    config = thread(f"deep-crash-{mode}")
    with pytest.raises(GatewayError):
        agent.invoke(REQUEST, config)
    assert ledger.count("refund") == 1 and ledger.count("email") == 0
    # The caller retries on a fresh run of the thread (the request again).
    out = agent.invoke(
        {"messages": [HumanMessage("refund INV-7, $140 and tell C-42")]},
        thread(f"deep-crash-{mode}"),
    )
    assert out["messages"][-1].content == "all done"
    assert ledger.count("email") == 1
    assert ledger.count("refund") == {"plain": 2, "ours": 1}[mode]


def wrapped_task_agent(
    ledger: Ledger, store: InMemoryIdempotencyStore, how: str, sub_model: ReplyModel
) -> Any:
    """A deep agent's ``task`` tool: plain, memoized with ``idempotent(handoff="replay")``,
    or by ``IdempotencyMiddleware``."""
    specs = subagents(ledger, "ours", store, billing=sub_model)
    middleware = SubAgentMiddleware(backend=StateBackend(), subagents=specs)
    if how == "wrapper":
        # key_state=(): task passes the state on to the sub-agent; its effect is its
        # description and sub-agent type, which the model sends (docs/keys.md).
        middleware.tools = [
            idempotent(t, store, handoff="replay", key_state=()) for t in middleware.tools
        ]
    extra: list[Any] = (
        [IdempotencyMiddleware(store, tools=["task"], handoff="replay", key_state=())]
        if how == "middleware"
        else []
    )
    return create_agent(
        main_model(task("refund INV-7 $140", "billing", "t1")),
        middleware=[middleware, *extra],
        checkpointer=InMemorySaver(),
    )


@pytest.mark.parametrize("how", ["task plain", "wrapper", "middleware"])
def test_a_memoized_task_tool_replays_the_finished_sub_agent_run(how: str) -> None:
    ledger, store = Ledger(), InMemoryIdempotencyStore()
    sub_model = billing_model()
    agent = wrapped_task_agent(ledger, store, how, sub_model)
    config = thread(f"deep-task-{how}")
    first = agent.invoke(REQUEST, config)
    calls_per_run = sub_model.calls
    for _ in range(2):
        out = agent.invoke(REQUEST, config)
        assert_every_call_answered(out["messages"])
    assert calls_per_run == 2
    # Re-sent twice: the sub-agent ran again each time (its refund replayed), or not at all.
    saved = {"task plain": 0, "wrapper": 4, "middleware": 4}[how]
    assert sub_model.calls == calls_per_run * 3 - saved
    assert ledger.count("refund") == 1
    assert [m.content for m in out["messages"] if m.type == "tool"] == ["refunded INV-7"] * 3
    assert first["messages"][-1].content == "all done"
