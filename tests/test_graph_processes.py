"""Crashes and competing workers, across real processes.

A graph checkpointed with LangGraph's ``SqliteSaver`` (``durability="sync"``) and tools made
idempotent with :class:`SqliteIdempotencyStore` (the store shared by the processes of one
host). Each effect is written to a SQLite ledger keyed by the idempotency key (what a
downstream API that accepts an ``Idempotency-Key`` does) and every *execution* of a tool
body is appended to a log, so the tests tell "ran once" from "ran twice, deduplicated".

This file is also the worker: ``python test_graph_processes.py <role> <workdir>``.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage

from tests.support import forked
from tests.support.graphs import thread

#: Graphs in real worker processes: left out of the default run (pytest -m slow).
pytestmark = pytest.mark.slow

THREAD = "ticket-4711"
LEASE = 1.0  # seconds; a crashed owner blocks its key this long


# -- the worker side (runs in a child process) ----------------------------------------------


def _ledger(workdir: Path) -> sqlite3.Connection:
    db = sqlite3.connect(workdir / "ledger.db", timeout=30, isolation_level=None)
    db.execute("CREATE TABLE IF NOT EXISTS effects (key TEXT PRIMARY KEY, tool TEXT, pid INTEGER)")
    return db


def _executed(workdir: Path, tool: str) -> None:
    """Append one line per execution of a tool body (O_APPEND: whole lines, any process)."""
    from langchain_idempotent import get_idempotency_context

    ctx = get_idempotency_context()
    assert ctx is not None
    line = json.dumps(
        {"tool": tool, "pid": os.getpid(), "attempt": ctx.attempt, "takeover": ctx.takeover}
    )
    with open(workdir / "executions.log", "a") as log:
        log.write(line + "\n")


def _effect(workdir: Path, tool: str) -> None:
    """The side effect, deduplicated downstream by the key the tool was handed."""
    from langchain_idempotent import get_idempotency_context

    ctx = get_idempotency_context()
    assert ctx is not None
    with _ledger(workdir) as db:
        db.execute("INSERT OR IGNORE INTO effects VALUES (?, ?, ?)", (ctx.key, tool, os.getpid()))


def build(workdir: Path, role: str) -> tuple[Any, Any, Any]:
    """The graph every process builds the same way: agent ⇄ ToolNode(refund, notify)."""
    from langchain_core.tools import tool
    from langgraph.checkpoint.sqlite import SqliteSaver

    from langchain_idempotent import idempotent
    from langchain_idempotent.core.record import Claim
    from langchain_idempotent.stores import ClaimRequest, SqliteIdempotencyStore
    from tests.support.graphs import ScriptedChatModel, on_each_turn, tool_graph

    class ObservedStore(SqliteIdempotencyStore):
        """Logs each claim's outcome, so a test can tell that a worker really waited."""

        def claim(self, request: ClaimRequest) -> Claim:
            claim = super().claim(request)
            with open(workdir / "claims.log", "a") as log:
                log.write(f"{os.getpid()} {(request.meta or {})['tool']} {claim.outcome}\n")
            return claim

    store = ObservedStore(workdir / "idempotency.db")

    @tool
    def issue_refund(invoice_id: str, amount: float) -> str:
        """Refund an invoice."""
        _executed(workdir, "issue_refund")
        if role == "worker":
            _wait_for_both_workers(workdir)
        _effect(workdir, "issue_refund")
        return f"refunded {amount:g} on {invoice_id} by pid {os.getpid()}"

    @tool
    def notify_customer(customer_id: str) -> str:
        """Tell the customer."""
        _executed(workdir, "notify_customer")
        _effect(workdir, "notify_customer")
        if role == "crash":
            # Die once the sibling refund's result is recorded, before this node's write
            # reaches the checkpoint: the next process must resume this very step.
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                done = [r for r in store.list(thread_id=THREAD) if r.state == "completed"]
                if any(r.meta.get("tool") == "issue_refund" for r in done):
                    break
                time.sleep(0.01)
            os._exit(17)
        return f"notified {customer_id} by pid {os.getpid()}"

    model = ScriptedChatModel(
        then=on_each_turn(
            ("issue_refund", {"invoice_id": "INV-7", "amount": 140}),
            ("notify_customer", {"customer_id": "C-42"}),
        )
    )
    conn = sqlite3.connect(workdir / "checkpoints.db", check_same_thread=False, timeout=30)
    tools = idempotent([issue_refund, notify_customer], store, lease=LEASE, wait_timeout=30)
    return tool_graph(model, tools, checkpointer=SqliteSaver(conn)), conn, store


def _wait_for_both_workers(workdir: Path) -> None:
    """Hold the lease until the other worker has found this key busy (it waits for us)."""
    deadline = time.monotonic() + 20
    me = str(os.getpid())
    while time.monotonic() < deadline:
        log = workdir / "claims.log"
        claims = [line.split() for line in log.read_text().splitlines()] if log.exists() else []
        if any(pid != me and rest == ["issue_refund", "busy"] for pid, *rest in claims):
            return
        time.sleep(0.01)


def worker(role: str, workdir: Path) -> None:
    from langchain_core.messages import HumanMessage

    from tests.support.graphs import EventRecorder, thread, tool_results

    graph, conn, _ = build(workdir, role)
    recorder = EventRecorder()
    config = {**thread(THREAD), "callbacks": [recorder]}
    if role == "crash":
        graph.invoke({"messages": [HumanMessage("refund INV-7")]}, config, durability="sync")
        raise SystemExit("the crash role must not get here")
    if role == "worker":
        while not (workdir / "go").exists():
            time.sleep(0.005)
    out = graph.invoke(None, config, durability="sync")
    conn.close()
    print(json.dumps({"results": tool_results(out["messages"]), "events": recorder.names()}))


# -- the test side ----------------------------------------------------------------------------


def _spawn(role: str, workdir: Path) -> forked.ForkedProcess:
    """``python this_file role workdir``, its output in files of its own in ``workdir``."""
    stem = workdir / f"{role}-{uuid.uuid4().hex[:8]}"
    return forked.start(
        [__file__, role, str(workdir)],
        cwd=Path(__file__).parent,
        stdout=stem.with_suffix(".out"),
        stderr=stem.with_suffix(".err"),
    )


def _executions(workdir: Path) -> list[dict[str, Any]]:
    lines = (workdir / "executions.log").read_text().splitlines()
    return [json.loads(line) for line in lines]


def _effects(workdir: Path) -> dict[str, int]:
    with _ledger(workdir) as db:
        rows = db.execute("SELECT tool, count(*) FROM effects GROUP BY tool").fetchall()
    return dict(rows)


def test_a_process_that_dies_mid_step_is_resumed_by_a_new_process_with_each_effect_once(
    tmp_path: Path,
) -> None:
    crashed = _spawn("crash", tmp_path).finish(90)
    assert crashed.returncode == 17, crashed.stderr[-3000:]
    # The dead process refunded (result recorded) and notified (result never recorded).
    died_with = sorted((e["tool"], e["attempt"]) for e in _executions(tmp_path))
    assert died_with == [("issue_refund", 1), ("notify_customer", 1)]

    resumed = _spawn("resume", tmp_path).finish(90)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    report = json.loads(resumed.stdout.strip().splitlines()[-1])

    executions = _executions(tmp_path)
    refunds = [e for e in executions if e["tool"] == "issue_refund"]
    notifies = [e for e in executions if e["tool"] == "notify_customer"]
    # The recorded refund is replayed: its body never ran again.
    assert len(refunds) == 1
    # The notification's result was lost with the process: it ran again, told that it took
    # over an expired lease, with the same key, which the downstream ledger deduplicated.
    assert [(e["attempt"], e["takeover"]) for e in notifies] == [(1, False), (2, True)]
    assert _effects(tmp_path) == {"issue_refund": 1, "notify_customer": 1}
    assert "idempotency.replay" in report["events"]
    assert "idempotency.takeover" in report["events"]
    contents = [content for _, content in report["results"]]
    assert len(contents) == 2
    assert any(c.startswith("refunded 140 on INV-7") for c in contents)
    assert any(c.startswith("notified C-42") for c in contents)


def test_two_workers_resuming_the_same_thread_at_once_run_the_effect_once_and_agree(
    tmp_path: Path,
) -> None:
    # Bring the thread to the tool step in this process, then let two workers resume it.
    graph, conn, _ = build(tmp_path, "setup")
    paused = graph.invoke(
        {"messages": [HumanMessage("refund INV-7")]},
        thread(THREAD),
        durability="sync",
        interrupt_before=["tools"],
    )
    assert paused["messages"][-1].tool_calls
    conn.close()

    workers = [_spawn("worker", tmp_path) for _ in range(2)]
    (tmp_path / "go").touch()
    finished = [w.finish(90) for w in workers]
    for done in finished:
        assert done.returncode == 0, done.stderr[-3000:]
    reports = [json.loads(done.stdout.strip().splitlines()[-1]) for done in finished]

    executions = _executions(tmp_path)
    refunds = [e for e in executions if e["tool"] == "issue_refund"]
    assert len(refunds) == 1
    assert len([e for e in executions if e["tool"] == "notify_customer"]) == 1
    assert _effects(tmp_path) == {"issue_refund": 1, "notify_customer": 1}
    # Both workers answer every call with the same content (the winner's pid in it).
    first, second = ({content for _, content in r["results"]} for r in reports)
    assert first == second
    assert {c for c in first if c.startswith("refunded")} == {
        f"refunded 140 on INV-7 by pid {refunds[0]['pid']}"
    }
    # For each call, one worker ran it and the other replayed its result (after waiting
    # for the lease when it got there first).
    replays = sum(r["events"].count("idempotency.replay") for r in reports)
    assert replays == 2
    # The refund's owner held its lease until the other worker found the key busy.
    waits = [r for r in reports if "idempotency.wait" in r["events"]]
    assert waits, reports


if __name__ == "__main__":
    worker(sys.argv[1], Path(sys.argv[2]))
