"""One worker running a ``langgraph-swarm`` refund request, for the SIGKILL test.

``python -m tests.support.swarm_worker MODE DB LEDGER THREAD [--die]``: alice hands over
to bob, bob refunds INV-7 and hands back, alice answers. The refund books one line in the
``LEDGER`` file (the provider's books, with the idempotency key it was handed); with
``--die`` the worker SIGKILLs itself right after booking (the answer is never recorded).
``MODE`` ``plain`` runs the tool bare; ``ours`` wraps it with the SQLite store at ``DB``
and ``reconcile=``, a hook that asks the books whether the key's refund happened. Prints
one JSON line: the final answer and whether every tool call in the history is answered.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph_swarm import create_handoff_tool, create_swarm

from langchain_idempotent import (
    ReconcileCall,
    SqliteIdempotencyStore,
    get_idempotency_context,
    idempotent,
)
from tests.support.agents import swarm_agents


def main(argv: list[str]) -> int:
    mode, db, ledger, thread_id = argv[:4]
    die = "--die" in argv

    @tool
    def issue_refund(invoice_id: str, amount: float) -> str:
        """Refund ``amount`` on ``invoice_id``."""
        ctx = get_idempotency_context()
        with open(ledger, "a", encoding="utf-8") as books:
            books.write(json.dumps({"key": ctx.key if ctx else None, "invoice": invoice_id}))
            books.write("\n")
            books.flush()
            os.fsync(books.fileno())
        if die:
            os.kill(os.getpid(), signal.SIGKILL)
        return f"refunded {amount} on {invoice_id}"

    def booked(call: ReconcileCall) -> str | None:
        with open(ledger, encoding="utf-8") as books:
            rows = [json.loads(line) for line in books if line.strip()]
        if any(row["key"] == call.key for row in rows):
            return f"refunded {call.args['amount']} on {call.args['invoice_id']} (reconciled)"
        return None

    refund: Any = issue_refund
    if mode == "ours":
        store = SqliteIdempotencyStore(db)
        refund = idempotent(issue_refund, store, lease=0.5, wait_timeout=10, reconcile=booked)

    agents = swarm_agents(
        refund, create_handoff_tool(agent_name="bob"), create_handoff_tool(agent_name="alice")
    )
    graph = create_swarm(agents, default_active_agent="alice").compile(checkpointer=InMemorySaver())
    out = graph.invoke(
        {"messages": [HumanMessage("refund INV-7, $140")]},
        {"configurable": {"thread_id": thread_id}},
    )
    messages = out["messages"]
    asked = sorted(tc["id"] for m in messages if isinstance(m, AIMessage) for tc in m.tool_calls)
    answered = sorted(m.tool_call_id for m in messages if m.type == "tool")
    print(json.dumps({"answer": messages[-1].content, "valid": asked == answered}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
