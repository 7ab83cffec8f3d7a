"""Handoff tools: memoizing one is refused unless ``handoff=`` says what its replay means,
and with either choice the history stays valid on every replay — with the real
``langgraph-swarm`` and ``langgraph-supervisor`` handoff tools."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph_supervisor import create_supervisor
from langgraph_supervisor.handoff import create_handoff_tool as supervisor_handoff
from langgraph_swarm import create_handoff_tool, create_swarm

from langchain_idempotent import InMemoryIdempotencyStore, idempotent
from langchain_idempotent.adapters._handoff import is_handoff
from tests.support.agents import Ledger, ReplyModel, last_is, refund_tool, swarm_agents, tool_call
from tests.support.graphs import assert_every_call_answered, thread


def test_a_handoff_wrapped_without_saying_what_replay_means_reruns_on_every_call() -> None:
    """The safe default: a handoff never answers with another state's snapshot."""
    store = InMemoryIdempotencyStore()
    to_bob = create_handoff_tool(agent_name="bob")
    assert is_handoff(to_bob) and is_handoff(supervisor_handoff(agent_name="bob"))
    assert idempotent(to_bob, store)._handoff == "rerun"
    refund, handoff = idempotent(
        [refund_tool(Ledger()), supervisor_handoff(agent_name="bob")], store
    )
    assert (refund._handoff, handoff._handoff) == (None, "rerun")
    with pytest.raises(ValueError, match="'rerun' or 'replay'"):
        idempotent(to_bob, store, handoff="always")  # type: ignore[arg-type]
    # A list with handoff= applies it to the handoffs only; the refund stays memoized.
    refund, handoff = idempotent([refund_tool(Ledger()), to_bob], store, handoff="rerun")
    assert (refund._handoff, handoff._handoff) == (None, "rerun")


@pytest.mark.parametrize("mode", ["plain", "rerun", "replay"])
def test_a_swarm_re_sent_the_same_request_refunds_once_and_keeps_a_valid_history(
    mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    ledger, store = Ledger(), InMemoryIdempotencyStore()
    refund = refund_tool(ledger)
    to_bob, to_alice = (
        create_handoff_tool(agent_name="bob"),
        create_handoff_tool(agent_name="alice"),
    )
    if mode != "plain":
        # key_state=(): a memoized handoff reads the whole state (the history it copies),
        # which is no input of its effect (only handoff="replay" keys it: docs/keys.md).
        refund, to_bob, to_alice = idempotent(
            [refund, to_bob, to_alice], store, handoff=mode, key_state=()
        )
    graph = create_swarm(
        swarm_agents(refund, to_bob, to_alice), default_active_agent="alice"
    ).compile(checkpointer=InMemorySaver())
    config = thread(f"swarm-{mode}")
    caplog.set_level(logging.WARNING, logger="langchain_idempotent")
    for _ in range(3):  # the caller re-sends: each time alice hands over to bob again
        out = graph.invoke({"messages": [HumanMessage("refund INV-7, $140")]}, config)
        assert_every_call_answered(out["messages"])
        assert out["messages"][-1].content == "bob has refunded you"
    assert ledger.count("refund") == {"plain": 3, "rerun": 1, "replay": 1}[mode]
    if mode == "replay":  # the snapshot-carrying handoffs were never stored
        assert "not memoized" in caplog.text
        records = store.list(thread_id=config["configurable"]["thread_id"])
        assert {r.meta["tool"] for r in records if r.state == "completed"} == {"issue_refund"}


@pytest.mark.parametrize("mode", ["plain", "ours"])
def test_a_supervisor_re_sent_the_same_request_refunds_once_with_a_wrapped_handoff(
    mode: str,
) -> None:
    ledger, store = Ledger(), InMemoryIdempotencyStore()
    refund: Any = refund_tool(ledger)
    handoff: Any = supervisor_handoff(agent_name="billing")
    if mode == "ours":
        refund = idempotent(refund, store)
        handoff = idempotent(handoff, store, handoff="rerun")

    def billing(messages: list[BaseMessage]) -> AIMessage:
        if last_is(messages, "tool", "issue_refund"):
            return AIMessage("refunded INV-7")
        return tool_call("issue_refund", invoice_id="INV-7", amount=140)

    def supervisor(messages: list[BaseMessage]) -> AIMessage:
        if last_is(messages, "human"):
            return tool_call("transfer_to_billing")
        return AIMessage("your refund is done")

    agent = create_agent(ReplyModel(reply=billing), [refund], name="billing")
    graph = create_supervisor([agent], model=ReplyModel(reply=supervisor), tools=[handoff]).compile(
        checkpointer=InMemorySaver()
    )
    config = thread(f"supervisor-{mode}")
    for _ in range(2):
        out = graph.invoke({"messages": [HumanMessage("refund INV-7, $140")]}, config)
        assert_every_call_answered(out["messages"])
    assert ledger.count("refund") == {"plain": 2, "ours": 1}[mode]
