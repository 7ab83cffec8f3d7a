"""A batch never strands a call: one message with 40 parallel refunds, the worker
SIGKILLed after 12, a new process resumes the thread (``tests/support/batch_crash.py``).

The step claims its calls together (``claim_many``); a call that had not started when the
worker died is a free retry after the crash, so only the calls in flight at the kill are
uncertain (``takeover=True``, the reconcile hook asked). For every effect class, on Redis
and PostgreSQL: 40 refunds, no duplicate, every call answered. The unwrapped tool, resumed
the same way, refunds again every call it had finished.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import StructuredTool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

from langchain_idempotent import InMemoryIdempotencyStore, idempotent
from tests.support import forked
from tests.support.batch_crash import CALLS
from tests.support.counting import CountingStore
from tests.support.postgres_fixtures import pg_server, pg_table, pg_url

__all__ = ["pg_server", "pg_table", "pg_url"]  # the fixtures this module uses

ROOT = Path(__file__).resolve().parents[1]
KILL_AFTER = 12
#: The most calls that run at once: ToolNode's executor has Python's default pool size. A
#: call runs in the engine (its start recorded) an instant before its tool marks itself
#: "started", so at the kill a few more than the marked ones may be uncertain, never more
#: than were running.
RUNNING = min(32, (os.cpu_count() or 1) + 4)


@pytest.fixture(params=["redis", "postgres"])
def spec(request: pytest.FixtureRequest) -> str:
    if request.param == "redis":
        server = request.getfixturevalue("redis_server")
        return f"redis|{server.url}|crash-{uuid.uuid4().hex[:8]}:"
    return f"postgres|{request.getfixturevalue('pg_url')}|{request.getfixturevalue('pg_table')}"


def _run(folder: Path, spec: str, effect: str, mode: str) -> tuple[int, dict[str, Any]]:
    """Start, kill after ``KILL_AFTER`` refunds, resume: the calls in flight at the kill,
    and the resumed process's report."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = ["-m", "tests.support.batch_crash", str(folder), spec, effect, mode]
    worker = forked.start([*argv, "start"], env=env, stdout=folder / "worker.log")
    ledger = folder / "ledger"
    try:
        deadline = time.monotonic() + 120
        while not (ledger.is_dir() and len(list(ledger.iterdir())) >= KILL_AFTER):
            assert worker.poll() is None, "the worker finished before it could be killed"
            assert time.monotonic() < deadline
            time.sleep(0.005)
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait()
    started = {p.name for p in (folder / "started").iterdir()}
    ended = {p.name for p in (folder / "ended").iterdir()}
    resumed = forked.run([*argv, "resume"], folder=folder, env=env, timeout=180)
    assert resumed.returncode == 0, resumed.stderr
    return len(started - ended), json.loads(resumed.stdout.strip().splitlines()[-1])


def _refunds(folder: Path) -> list[str]:
    return [p.name.split(".")[0] for p in (folder / "ledger").iterdir()]


@pytest.mark.parametrize("effect", ["none", "keyed", "unsafe"])
def test_a_killed_batch_resumes_with_one_refund_each_and_no_call_stranded(
    tmp_path: Path, spec: str, effect: str
) -> None:
    in_flight, report = _run(tmp_path, spec, effect, "ours")
    refunds = _refunds(tmp_path)

    assert report["error"] is None and report["answered"] == CALLS  # 0 stranded
    assert len(refunds) == len(set(refunds)) == CALLS  # 40 refunds, 0 duplicates
    events = report["events"]
    # Only the calls running at the kill were uncertain, not the 28 that never started.
    assert report["asked"] <= max(in_flight, RUNNING)
    assert events.get("takeover", 0) <= max(in_flight, RUNNING)
    assert events.get("outcome_unknown", 0) == 0
    # The calls that never started run clean: a free retry of a batch claim, or a first
    # claim where the dead worker's pickup window had given the batch claim back.
    clean = events.get("free_retry", 0) + events.get("claim", 0)
    assert clean >= CALLS - KILL_AFTER - max(in_flight, RUNNING)


def test_the_plain_tool_resumed_after_the_kill_refunds_the_finished_calls_again(
    tmp_path: Path, spec: str
) -> None:
    _, report = _run(tmp_path, spec, "none", "plain")
    refunds = _refunds(tmp_path)
    assert report["answered"] == CALLS
    assert len(set(refunds)) == CALLS and len(refunds) >= CALLS + KILL_AFTER


# -- what the start marks cost ----------------------------------------------------------------


@pytest.mark.parametrize("face", ["sync", "async"])
def test_a_step_claims_in_one_round_trip_and_marks_only_calls_that_started_late(
    face: str,
) -> None:
    def refund(invoice: str) -> str:
        """Refund an invoice."""
        return f"refunded {invoice}"

    async def arefund(invoice: str) -> str:
        await asyncio.sleep(0)
        return f"refunded {invoice}"

    store = CountingStore(InMemoryIdempotencyStore())
    tools = idempotent([StructuredTool.from_function(refund, coroutine=arefund)], store)
    builder = StateGraph(MessagesState)
    builder.add_node("tools", ToolNode(tools))
    builder.add_edge(START, "tools")
    graph = builder.compile(checkpointer=InMemorySaver())
    refunds = [{"name": "refund", "args": {"invoice": f"I{i}"}, "id": f"c{i}"} for i in range(8)]
    message = {"messages": [HumanMessage("refund"), AIMessage("", tool_calls=refunds)]}
    for run in ("first", "replay"):
        store.reset()
        config: Any = {"configurable": {"thread_id": "t"}}
        if face == "sync":
            graph.invoke(message, config)
        else:
            asyncio.run(graph.ainvoke(message, config))
        marks = store.counts["mark_effect"] + store.counts["amark_effect"]
        assert store.claims() == (0, 1), (run, store.counts)
        if run == "replay" or face == "async":  # a replay runs nothing; gathered calls arrive
            assert marks == 0, (run, store.counts)
        else:  # a call that reached its adapter after the batch was claimed marks its start
            assert marks <= len(refunds) - 1
