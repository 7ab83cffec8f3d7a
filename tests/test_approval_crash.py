"""A worker killed (SIGKILL) after the human approved, before the tool ran.

The first process asks, gets the approval and dies inside the tool before its effect. The
checkpoint dies with it (an in-process ``InMemorySaver``), so LangGraph has no resume value
left. A second process builds a fresh graph with a new checkpointer on the same store and
re-runs the same call in the same thread: the stored decision is used, no question is
asked, and (after the dead worker's lease) the refund runs once. The same script with LangChain's
``HumanInTheLoopMiddleware`` and a plain tool asks the human again.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import HumanInTheLoopMiddleware
from langchain_core.messages import HumanMessage
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from langchain_idempotent import IdempotencyMiddleware, idempotent
from langchain_idempotent.adapters.approval import decision_key
from langchain_idempotent.stores.sqlite import SqliteIdempotencyStore
from tests.support.graphs import ScriptedChatModel, on_each_turn, thread, tool_graph

FORK = mp.get_context("fork")
REFUND = {"invoice_id": "INV-7", "amount": 140}
THREAD = "crash-after-approval"
#: The dead worker's lease on the effect, which the next worker waits out before taking over.
LEASE = 1.0


def refund_tool(workdir: Path) -> BaseTool:
    """Dies (SIGKILL) on its first call, before the effect; appends to a ledger after."""

    def issue_refund(invoice_id: str, amount: float) -> str:
        marker = workdir / "died-once"
        if not marker.exists():
            marker.touch()
            os.kill(os.getpid(), signal.SIGKILL)
        with (workdir / "ledger").open("a") as ledger:
            ledger.write(f"{invoice_id} {amount:g}\n")
        return f"refunded {amount:g} on {invoice_id}"

    return StructuredTool.from_function(issue_refund, name="issue_refund", description="Refund.")


def graph_for(setup: str, workdir: Path) -> Any:
    """A fresh graph with a new checkpointer: what a new worker process builds."""
    model = ScriptedChatModel(then=on_each_turn(("issue_refund", REFUND)))
    tool = refund_tool(workdir)
    if setup == "plain":
        return create_agent(
            model,
            tools=[tool],
            middleware=[HumanInTheLoopMiddleware(interrupt_on={"issue_refund": True})],
            checkpointer=InMemorySaver(),
        )
    store = SqliteIdempotencyStore(str(workdir / "records.db"))
    if setup == "wrapper":
        tool = idempotent(tool, store=store, approval=True, lease=LEASE)
        return tool_graph(model, [tool], checkpointer=InMemorySaver())
    middleware = IdempotencyMiddleware(store, tools=["issue_refund"], approval=True, lease=LEASE)
    return create_agent(model, tools=[tool], middleware=[middleware], checkpointer=InMemorySaver())


def worker(setup: str, workdir: Path) -> None:
    """Run one user turn, approving every question; count the questions in a file."""
    graph = graph_for(setup, workdir)
    step: Any = {"messages": [HumanMessage("refund INV-7")]}
    while True:
        out = graph.invoke(step, thread(THREAD))
        questions = out.get("__interrupt__", ())
        if not questions:
            return
        with (workdir / "questions").open("a") as log:
            for question in questions:
                action = question.value["action_requests"][0]
                log.write(f"{action.get('idempotency_key', '-')}\n")
        step = Command(resume={q.id: {"decisions": [{"type": "approve"}]} for q in questions})


def run_worker(setup: str, workdir: Path) -> int:
    process = FORK.Process(target=worker, args=(setup, workdir))
    process.start()
    process.join(60)
    assert process.exitcode is not None, "the worker hung"
    return process.exitcode


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.parametrize("setup", ["wrapper", "middleware", "plain"])
def test_a_worker_killed_after_the_approval_is_not_asked_again_and_runs_once(
    setup: str, tmp_path: Path
) -> None:
    assert run_worker(setup, tmp_path) == -signal.SIGKILL  # approved, then died in the tool
    assert lines(tmp_path / "ledger") == []
    assert len(lines(tmp_path / "questions")) == 1

    assert run_worker(setup, tmp_path) == 0  # a new worker, a new checkpointer, same store
    questions, effects = lines(tmp_path / "questions"), lines(tmp_path / "ledger")
    print(f"{setup}: {len(questions)} questions, {len(effects)} effects")
    assert effects == ["INV-7 140"]
    if setup == "plain":
        assert len(questions) == 2  # LangChain's HITL asks the human again
    else:
        assert len(questions) == 1  # the decision outlived the process
        store = SqliteIdempotencyStore(str(tmp_path / "records.db"))
        stored = store.get(decision_key(questions[0]))
        assert stored is not None and stored.done
        store.close()
