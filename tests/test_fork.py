"""Time travel: ``on_fork="replay"`` (default) replays a call re-executed on a branch that
LangGraph started (``update_state``, or a run resumed from an earlier checkpoint, which
LangGraph marks ``source: "update"`` / ``"fork"``); ``on_fork="run"`` runs it as a new
effect, once per branch. On a real ``SqliteSaver``, beside the plain tool (which re-runs
on every branch)."""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.sqlite import SqliteSaver

from langchain_idempotent import InMemoryIdempotencyStore, Policy, idempotent
from tests.support.graphs import Effects, ScriptedChatModel, on_each_turn, thread, tool_graph


def _graph(tmp_path: Path, option: str | None, effects: Effects, store: Any) -> Any:
    @tool
    def refund(invoice: str) -> str:
        """Refund an invoice."""
        return f"refund #{effects.record('refund', invoice=invoice)}"

    tools = (
        [refund]
        if option == "plain"
        else [idempotent(refund, store, **({} if option is None else {"on_fork": option}))]
    )
    conn = sqlite3.connect(
        tmp_path / f"checkpoints-{uuid.uuid4().hex}.sqlite", check_same_thread=False
    )
    model = ScriptedChatModel(then=on_each_turn(("refund", {"invoice": "A"})))
    return tool_graph(model, tools, checkpointer=SqliteSaver(conn))


def _before_tools(graph: Any, config: Any) -> Any:
    return next(s for s in graph.get_state_history(config) if s.next == ("tools",))


@pytest.mark.parametrize(
    ("option", "refunds"), [("plain", 3), (None, 1), ("replay", 1), ("run", 3)]
)
def test_a_branch_replays_or_runs_its_calls_as_on_fork_says(
    tmp_path: Path, option: str | None, refunds: int
) -> None:
    effects, store = Effects(), InMemoryIdempotencyStore()
    graph = _graph(tmp_path, option, effects, store)
    config = thread(f"t-{uuid.uuid4().hex}")
    graph.invoke({"messages": [HumanMessage("refund A")]}, config)
    assert effects.count("refund") == 1
    # Branch 1: resume from the checkpoint before the tools step (LangGraph forks it).
    graph.invoke(None, _before_tools(graph, config).config)
    # Branch 2: update_state on that checkpoint, then resume the branch it starts.
    earlier = [s for s in graph.get_state_history(config) if s.next == ("tools",)][-1]
    branch = graph.update_state(earlier.config, {"messages": []}, as_node="agent")
    graph.invoke(None, branch)
    assert effects.count("refund") == refunds


def test_a_branch_resumed_again_from_its_own_head_runs_nothing_new(tmp_path: Path) -> None:
    effects, store = Effects(), InMemoryIdempotencyStore()
    graph = _graph(tmp_path, "run", effects, store)
    config = thread(f"t-{uuid.uuid4().hex}")
    graph.invoke({"messages": [HumanMessage("refund A")]}, config)
    earlier = _before_tools(graph, config)
    branch = graph.update_state(earlier.config, {"messages": []}, as_node="agent")
    graph.invoke(None, branch)
    assert effects.count("refund") == 2
    graph.invoke(None, config)  # the thread's head: nothing left to run, nothing re-run
    assert effects.count("refund") == 2


def test_on_fork_must_be_replay_or_run() -> None:
    with pytest.raises(ValueError, match="on_fork must be 'replay' or 'run'"):
        Policy(on_fork="always")  # type: ignore[arg-type]
