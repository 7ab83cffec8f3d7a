"""Long Agent Server scenarios (campaign only: ``python -m tests.faults``).

Re-dispatch: the platform hands a thread whose run outlives its heartbeat to a second
worker while the first still runs the tool. The in-memory runtime has one worker and never
re-dispatches, so the second worker is a second ``langgraph dev`` process sharing the
idempotency store, given the same thread (same ``thread_id``, the checkpoint before the
tools node, copied through the SDK) while the first still runs a 10 s tool with a 2 s
lease renewed as it runs.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

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
