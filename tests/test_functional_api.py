"""A wrapped tool called from the Functional API (a ``@task`` in an ``@entrypoint``, the
entrypoint itself) and from a plain ``StateGraph`` node: 1 effect where the plain tool pays
2, under a task retry, an ``interrupt()`` / resume, and a worker killed then re-invoked by a
new process (docs/functional-api.md)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.func import entrypoint, task
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import Command, RetryPolicy, interrupt

from langchain_idempotent import InMemoryIdempotencyStore, idempotent
from tests.support.graphs import Effects, thread
from tests.test_steps import killed_then_run_again

WRAPPED = pytest.mark.parametrize("wrapped", [False, True], ids=["plain", "wrapped"])
RETRY = RetryPolicy(max_attempts=3, initial_interval=0.01, retry_on=ConnectionError)


def refund_tool(effects: Effects, wrapped: bool, store: Any = None) -> BaseTool:
    def issue_refund(invoice_id: str, amount: float) -> str:
        effects.record("refund", invoice_id=invoice_id)
        return f"refunded {amount:g} on {invoice_id}"

    tool = StructuredTool.from_function(issue_refund, description="Refund an invoice.")
    return idempotent(tool, store or InMemoryIdempotencyStore()) if wrapped else tool


@WRAPPED
def test_a_task_retried_after_a_later_failure_refunds_once(wrapped: bool) -> None:
    effects = Effects()
    refund = refund_tool(effects, wrapped)
    failures = [ConnectionError("mail down")]

    @task(retry_policy=RETRY)
    def refund_and_confirm(invoice_id: str) -> str:
        receipt = str(refund.invoke({"invoice_id": invoice_id, "amount": 140}))
        if failures:
            raise failures.pop()
        return receipt

    @entrypoint(checkpointer=InMemorySaver())
    def workflow(invoice_id: str) -> str:
        return refund_and_confirm(invoice_id).result()  # type: ignore[no-any-return]

    assert workflow.invoke("A", thread("t")) == "refunded 140 on A"
    assert effects.count("refund") == (1 if wrapped else 2)


@WRAPPED
def test_an_interrupted_task_resumed_refunds_once(wrapped: bool) -> None:
    effects = Effects()
    refund = refund_tool(effects, wrapped)

    @task
    def refund_then_ask(invoice_id: str) -> str:
        receipt = refund.invoke({"invoice_id": invoice_id, "amount": 140})
        return f"{receipt}; {interrupt('e-mail?')}"

    @entrypoint(checkpointer=InMemorySaver())
    def workflow(invoice_id: str) -> str:
        return refund_then_ask(invoice_id).result()  # type: ignore[no-any-return]

    assert "__interrupt__" in workflow.invoke("B", thread("t"))
    assert workflow.invoke(Command(resume="yes"), thread("t")) == "refunded 140 on B; yes"
    assert effects.count("refund") == (1 if wrapped else 2)


@WRAPPED
def test_an_interrupted_entrypoint_resumed_refunds_once(wrapped: bool) -> None:
    effects = Effects()
    refund = refund_tool(effects, wrapped)

    @entrypoint(checkpointer=InMemorySaver())
    def workflow(invoice_id: str) -> str:
        receipt = refund.invoke({"invoice_id": invoice_id, "amount": 140})
        return f"{receipt}; {interrupt('e-mail?')}"

    workflow.invoke("C", thread("t"))
    assert workflow.invoke(Command(resume="yes"), thread("t")) == "refunded 140 on C; yes"
    assert effects.count("refund") == (1 if wrapped else 2)


@WRAPPED
def test_a_plain_node_retried_after_a_later_failure_refunds_once(wrapped: bool) -> None:
    effects = Effects()
    refund = refund_tool(effects, wrapped)
    failures = [ConnectionError("mail down")]

    def approve(state: MessagesState) -> dict[str, Any]:
        receipt = refund.invoke({"invoice_id": "D", "amount": 140})
        if failures:
            raise failures.pop()
        return {"messages": [AIMessage(str(receipt))]}

    builder = StateGraph(MessagesState)
    builder.add_node("approve", approve, retry_policy=RETRY)
    builder.add_edge(START, "approve")
    builder.add_edge("approve", END)
    graph = builder.compile(checkpointer=InMemorySaver())
    out = graph.invoke({"messages": [HumanMessage("refund D")]}, thread("t"))
    assert out["messages"][-1].content == "refunded 140 on D"
    assert effects.count("refund") == (1 if wrapped else 2)


_WORKER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.func import entrypoint, task
    from langchain_idempotent import SqliteIdempotencyStore
    from tests.support.graphs import thread
    from tests.test_functional_api import refund_tool
    from tests.test_steps import FileEffects

    folder, phase, wrapped = Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "wrapped"
    effects = FileEffects(folder / "effects.log")
    refund = refund_tool(effects, wrapped, SqliteIdempotencyStore(str(folder / "records.db")))

    @task
    def refund_invoice(invoice_id):
        receipt = refund.invoke({"invoice_id": invoice_id, "amount": 140})
        if phase == "start":
            print("refunded", flush=True)
            time.sleep(60)  # killed here, after the refund, before the task's result is saved
        return receipt

    with SqliteSaver.from_conn_string(str(folder / "graph.db")) as saver:
        @entrypoint(checkpointer=saver)
        def workflow(invoice_id):
            return refund_invoice(invoice_id).result()

        print(workflow.invoke("E", thread("t")), flush=True)
    """
)


@WRAPPED
def test_a_task_killed_after_its_refund_and_invoked_again_by_a_new_process_refunds_once(
    tmp_path: Path, wrapped: bool
) -> None:
    kind = "wrapped" if wrapped else "plain"
    again = killed_then_run_again(_WORKER, tmp_path, kind, ready="refunded")
    assert again.stdout.strip() == "refunded 140 on E", again.stderr
    assert (tmp_path / "effects.log").read_text().split().count("refund") == (1 if wrapped else 2)
