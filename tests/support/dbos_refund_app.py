"""A DBOS application whose workflow step runs the refund agent (for the DBOS scenario).

DBOS is the durable system *around* the graph here: ``answer_ticket`` is one
``@DBOS.step`` that runs the whole agent in-process (:mod:`graphs.agent_server`, protected
or plain, no checkpointer), and ``ticket_workflow`` calls it with the workflow's id as the
agent's thread id — the id DBOS keeps across recovery, so a recovered step derives the same
idempotency keys. DBOS keeps global state, so each phase is its own process:

    python -m tests.support.dbos_refund_app start WORKFLOW_ID   # launch, start, wait
    python -m tests.support.dbos_refund_app recover WORKFLOW_ID # launch (recovers), wait

``recover`` is a new process of the same application on the same database: ``DBOS.launch()``
finds the workflow ``PENDING`` for this executor and runs it again; its step had not
finished, so the step (the agent) runs again. It prints the workflow's result as JSON.

Environment: ``DBOS_DATABASE_URL`` (DBOS's system database), ``REFUND_PROVIDER_URL``,
``IDEMPOTENCY_STORE_URL``, ``IDEMPOTENCY_LEASE``, ``REFUND_AGENT`` (``protected`` or
``plain``) and ``SETTLE_SECONDS`` (how long ``issue_refund`` stays busy after the refund
committed: the window in which the test kills the first process).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from dbos import DBOS, SetWorkflowID

from graphs.agent_server import plain, protected

TICKET = "Ticket T-9001 from customer C-501: please refund $140 of invoice INV-7001."

DBOS(
    config={
        "name": "refund-agent",
        "system_database_url": os.environ["DBOS_DATABASE_URL"],
        "application_version": "1",
        "log_level": "WARNING",
    }
)


@DBOS.step()
def answer_ticket(text: str, thread_id: str) -> str:
    """Run the agent on one ticket; its answer is the step's recorded output."""
    agent = protected() if os.environ.get("REFUND_AGENT", "protected") == "protected" else plain()
    config = {
        "configurable": {
            "thread_id": thread_id,
            "settle_seconds": float(os.environ.get("SETTLE_SECONDS", "0")),
        }
    }
    state = asyncio.run(agent.ainvoke({"messages": [("user", text)]}, config))  # type: ignore[arg-type]
    return str(state["messages"][-1].content)


@DBOS.workflow()
def ticket_workflow(text: str) -> str:
    workflow_id = DBOS.workflow_id
    assert workflow_id is not None
    return answer_ticket(text, workflow_id)


def main(phase: str, workflow_id: str) -> None:
    DBOS.launch()
    try:
        if phase == "start":
            with SetWorkflowID(workflow_id):
                handle = DBOS.start_workflow(ticket_workflow, TICKET)
            print("started", flush=True)
        else:
            handle = DBOS.retrieve_workflow(workflow_id)
        answer = handle.get_result()
        status = handle.get_status().status
        print(json.dumps({"answer": answer, "status": status}), flush=True)
    finally:
        DBOS.destroy()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
