"""One model message with 40 parallel refunds in a ``ToolNode``, the worker killed mid-way,
the thread resumed by a new process: what each call became.

``python -m tests.support.batch_crash FOLDER STORE CLASS MODE PHASE``: ``STORE`` is
``redis|url|prefix`` or ``postgres|url|table``; ``CLASS`` an effect class or ``none``;
``MODE`` ``plain`` (the unwrapped tool) or ``ours``; ``PHASE`` ``start`` (runs until killed)
or ``resume`` (prints one JSON line: the events of the resumed run, the calls answered).

The downstream is a ledger of files in ``FOLDER/ledger`` (one per refund, holding the
idempotency key it was sent with); it deduplicates a refund re-sent with a key it has seen,
as a payment API does, and the reconcile hook looks a key up in it. Each tool also writes
``FOLDER/started/<invoice>`` on entry and ``FOLDER/ended/<invoice>`` on return, so the
test can tell how many calls were in flight when the worker died.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import StructuredTool
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

from langchain_idempotent import idempotent
from langchain_idempotent.core.context import get_idempotency_context
from langchain_idempotent.core.events import IdempotencyEvent
from langchain_idempotent.core.reconcile import ReconcileCall
from langchain_idempotent.core.store import BaseIdempotencyStore

CALLS = 40
#: The protected tool's lease: the resumed run waits it out once for the calls in flight at
#: the kill (the library's 2 s default works the same, only slower).
LEASE_S = 1.0
#: Each refund's two halves (before and after the ledger write): long enough that calls
#: are in flight when the worker is killed.
STEP_S = 0.03


def open_store(spec: str) -> BaseIdempotencyStore:
    kind, address, name = spec.split("|")
    if kind == "redis":
        from langchain_idempotent.stores.redis import RedisIdempotencyStore

        return RedisIdempotencyStore.from_url(address, prefix=name)
    from langchain_idempotent.stores.postgres import PostgresIdempotencyStore

    return PostgresIdempotencyStore.from_url(address, table=name)


def ledger_keys(folder: Path) -> dict[str, str]:
    """The keys the ledger has seen, to the invoice each refunded."""
    return {p.read_text(): p.name.split(".")[0] for p in (folder / "ledger").iterdir()}


def refund_tool(folder: Path) -> StructuredTool:
    def refund(invoice: str) -> str:
        """Refund an invoice."""
        (folder / "started" / invoice).touch()
        time.sleep(STEP_S)  # prepare
        ctx = get_idempotency_context()
        key = ctx.key if ctx is not None else uuid.uuid4().hex
        if key not in ledger_keys(folder):  # the downstream deduplicates by key
            entry = f"{invoice}.{uuid.uuid4().hex}"
            (folder / "tmp" / entry).write_text(key)  # then moved in: a refund is whole
            os.replace(folder / "tmp" / entry, folder / "ledger" / entry)
        time.sleep(STEP_S)  # the answer travels back
        (folder / "ended" / invoice).touch()
        return f"refunded {invoice}"

    return StructuredTool.from_function(refund)


def main(folder: Path, spec: str, effect: str, mode: str, phase: str) -> None:
    for sub in ("ledger", "started", "ended", "tmp"):
        (folder / sub).mkdir(exist_ok=True)
    events: Counter[str] = Counter()
    asked: list[str] = []

    def found(call: ReconcileCall) -> str | None:
        asked.append(call.key)
        invoice = ledger_keys(folder).get(call.key)
        return None if invoice is None else f"refunded {invoice}"

    def seen(event: IdempotencyEvent) -> None:
        events[event.kind] += 1

    tool: Any = refund_tool(folder)
    if mode == "ours":
        options: dict[str, Any] = {"reconcile": found, "on_event": seen, "lease": LEASE_S}
        if effect != "none":
            options["effect"] = effect
        [tool] = idempotent([tool], open_store(spec), **options)
    builder = StateGraph(MessagesState)
    builder.add_node("tools", ToolNode([tool]))
    builder.add_edge(START, "tools")
    config: Any = {"configurable": {"thread_id": "batch-crash"}}
    with SqliteSaver.from_conn_string(str(folder / "graph.db")) as saver:
        graph = builder.compile(checkpointer=saver)
        if phase == "start":
            refunds = [
                {"name": "refund", "args": {"invoice": f"INV-{i:02d}"}, "id": f"c{i}"}
                for i in range(CALLS)
            ]
            message = AIMessage("", tool_calls=refunds)
            graph.invoke({"messages": [HumanMessage("refund all"), message]}, config)
            print("finished before the kill", flush=True)
            return
        error = None
        try:
            out = graph.invoke(None, config)
            answered = sum(
                1 for m in out["messages"] if isinstance(m, ToolMessage) and m.status != "error"
            )
        except Exception as exc:
            answered, error = 0, f"{type(exc).__name__}: {exc}"
    report = {"events": dict(events), "asked": len(asked), "answered": answered, "error": error}
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), *sys.argv[2:6])
