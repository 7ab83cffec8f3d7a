"""Long Agent Server scenarios (campaign only: ``python -m tests.faults``): the server
SIGKILLed mid-tool and restarted, and a run re-dispatched to a second server.

Re-dispatch: the platform hands a thread whose run outlives its heartbeat to a second
worker while the first still runs the tool. The in-memory runtime has one worker and never
re-dispatches, so the second worker is a second ``langgraph dev`` process sharing the
idempotency store, given the same thread (same ``thread_id``, the checkpoint before the
tools node, copied through the SDK) while the first still runs a 10 s tool with a 2 s
lease renewed as it runs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from graphs.provider import PaymentProvider
from tests.support.agent_server import AgentServer, langgraph_cli
from tests.support.refund_server import ASSISTANTS, INVOICE, TICKET, Figures, wait_for_refunds

pytestmark = [
    pytest.mark.campaign,
    pytest.mark.slow,
    pytest.mark.skipif(langgraph_cli() is None, reason="langgraph-cli not installed"),
]
langgraph_sdk = pytest.importorskip("langgraph_sdk")

TOOL_SECONDS = 10


@pytest.fixture
def provider(tmp_path: Path) -> Iterator[PaymentProvider]:
    with PaymentProvider(tmp_path / "ledger.db", invoices=[INVOICE]) as p:
        yield p


@pytest.mark.parametrize("mode", ["protected", "plain"])
async def test_a_run_redispatched_to_a_second_worker_waits_for_the_first_tool(
    tmp_path: Path, provider: PaymentProvider, mode: str
) -> None:
    env = {
        "REFUND_PROVIDER_URL": provider.url,
        "IDEMPOTENCY_STORE_URL": f"sqlite:///{tmp_path / 'idempotency.db'}",
        "IDEMPOTENCY_LEASE": "2",
    }
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    started = time.monotonic()
    with AgentServer(tmp_path / "a", env=env) as a, AgentServer(tmp_path / "b", env=env) as b:
        first, second = (langgraph_sdk.get_client(url=s.url) for s in (a, b))
        assistant = ASSISTANTS[mode]
        config = {"configurable": {"settle_seconds": TOOL_SECONDS}}
        thread = (await first.threads.create())["thread_id"]
        run = await first.runs.create(thread, assistant, input=TICKET, config=config)
        await wait_for_refunds(provider, 1)
        state = await first.threads.get_state(thread)
        assert state["next"] == ["tools"]  # the checkpoint the second worker resumes from
        await second.threads.create(thread_id=thread, graph_id=assistant)
        await second.threads.update_state(thread, state["values"], as_node="planner")
        redispatched = time.monotonic()
        result = await second.runs.wait(thread, assistant, input=None, config=config)
        waited = time.monotonic() - redispatched
        await first.runs.join(thread, run["run_id"])
    figures = Figures.of("re-dispatch (lease 2 s, tool 10 s)", mode, provider, 2, started)
    print(figures.line(), f"| second worker's run {waited:.1f} s")
    if mode == "plain":
        assert figures.effects == 2
        return
    assert figures.effects == 1 and figures.posts == 1
    assert waited > TOOL_SECONDS / 2  # it waited for the first worker's tool
    refund_id = provider.ledger.refunds()[0]["refund_id"]
    assert refund_id in result["messages"][-1]["content"]


#: The dev server flushes its in-memory runs, threads and checkpoints to
#: ``.langgraph_api/*.pckl`` every 10 s (``langgraph_runtime_inmem._persistence``).
FLUSH_SECONDS = 10


async def _flushed_after(workdir: Path, moment: float, timeout: float = 3 * FLUSH_SECONDS) -> None:
    """Until every ``.langgraph_api`` file was written after ``moment`` (wall clock): the
    runs (one of them ``running``) and the checkpoint before the tools node are on disk."""
    files = workdir / ".langgraph_api"
    deadline = time.monotonic() + timeout
    while True:
        written = [p.stat().st_mtime for p in files.glob("*.pckl")]
        if len(written) >= 2 and min(written) > moment:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"the dev server did not flush {files} within {timeout:g}s")
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("mode", ["protected", "plain"])
async def test_a_server_killed_mid_tool_and_restarted_resumes_the_run_and_refunds_once(
    tmp_path: Path, provider: PaymentProvider, mode: str
) -> None:
    """The server is SIGKILLed while ``issue_refund`` runs, after the provider committed the
    refund and after the dev server flushed the run (``running``) and the thread's
    checkpoint. Restarted in the same directory, the in-memory runtime loads them and puts
    the run back in the queue (``start_pool``: a run saved as running was cut off by a
    crash), so the thread resumes by itself. Protected: the dead owner's 2 s lease runs
    out, the resumed run takes the key over, reconciles (the provider knows the key) and
    sends nothing. Plain: the resumed run refunds again."""
    env = {
        "REFUND_PROVIDER_URL": provider.url,
        "IDEMPOTENCY_STORE_URL": f"sqlite:///{tmp_path / 'idempotency.db'}",
        "IDEMPOTENCY_LEASE": "2",
    }
    settle = FLUSH_SECONDS + 5  # the tool outlives one flush after the refund
    started = time.monotonic()
    server = AgentServer(tmp_path, env=env)
    with server:
        client = langgraph_sdk.get_client(url=server.url)
        thread = (await client.threads.create())["thread_id"]
        run = await client.runs.create(
            thread,
            ASSISTANTS[mode],
            input=TICKET,
            config={"configurable": {"settle_seconds": settle}},
        )
        await wait_for_refunds(provider, 1)
        await _flushed_after(tmp_path, time.time())
        server.kill()
        [before] = await _runs_after_restart(server, thread)
        assert before["run_id"] == run["run_id"]
        client = langgraph_sdk.get_client(url=server.url)
        await client.runs.join(thread, run["run_id"])
        [after] = await client.runs.list(thread)
        state = await client.threads.get_state(thread)
    figures = Figures.of("server SIGKILL + restart", mode, provider, 1, started)
    print(figures.line(), f"| run {after['status']}")
    assert after["status"] == "success", server.log_text()[-3000:]
    assert "Retrying runs left running" in server.log_text()
    if mode == "plain":
        assert figures.effects == 2
        return
    assert figures.effects == 1 and figures.posts == 1  # reconciled, not re-sent
    refund_id = provider.ledger.refunds()[0]["refund_id"]
    assert refund_id in state["values"]["messages"][-1]["content"]


async def _runs_after_restart(server: AgentServer, thread: str) -> list[dict[str, Any]]:
    server.start()
    client = langgraph_sdk.get_client(url=server.url)
    return list(await client.runs.list(thread))
