"""``create_agent`` + ``ToolRetryMiddleware(max_retries=2)`` around a refund whose provider
commits and then answers too late (the client times out): three attempts.

Plain: three refunds. With ``IdempotencyMiddleware`` listed *before* (outside)
``ToolRetryMiddleware``: the retries run inside one claim, each hands the same
``Idempotency-Key`` downstream, and the provider applies the refund once (the retries are
answered from its key table); the result is stored once for the call.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("langchain.agents")
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware, ToolRetryMiddleware
from langgraph.checkpoint.memory import InMemorySaver

from graphs.fake_model import ScriptedRefundModel
from graphs.provider import PaymentProvider
from graphs.tools import make_tools
from langchain_idempotent import IdempotencyMiddleware, SqliteIdempotencyStore
from tests.support.refund_server import INVOICE, TICKET, Figures


class LateProvider(PaymentProvider):
    """Commits every refund, but answers the first ``late`` refund requests after the
    client has given up."""

    def __init__(self, *args: Any, late: int, delay: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.late, self.delay = late, delay

    def handle_post(self, path: str, body: Any, key: str | None, fence: int | None) -> Any:
        answer = super().handle_post(path, body, key, fence)
        if path == "/refunds" and self.late > 0:
            self.late -= 1
            time.sleep(self.delay)  # committed; the answer comes too late
        return answer


@pytest.fixture
def provider(tmp_path: Path) -> Iterator[PaymentProvider]:
    with LateProvider(tmp_path / "ledger.db", invoices=[INVOICE], late=2, delay=0.6) as p:
        yield p


@pytest.mark.parametrize("mode", ["protected", "plain"])
def test_tool_retry_middleware_retries_a_committed_refund_that_timed_out_once_effect(
    tmp_path: Path, provider: PaymentProvider, mode: str
) -> None:
    started = time.monotonic()
    http = httpx.Client(base_url=provider.url, timeout=httpx.Timeout(0.3, connect=2.0))
    tools = list(make_tools(http))
    retry = ToolRetryMiddleware(max_retries=2, initial_delay=0.05, jitter=False)
    middleware: list[AgentMiddleware[Any, Any]] = [retry]
    if mode == "protected":
        store = SqliteIdempotencyStore(tmp_path / "idempotency.db")
        middleware = [IdempotencyMiddleware(store, tools=["issue_refund"]), retry]
    agent = create_agent(
        ScriptedRefundModel(), tools=tools, middleware=middleware, checkpointer=InMemorySaver()
    )
    state = agent.invoke(TICKET, {"configurable": {"thread_id": "T-9001"}})
    figures = Figures.of("ToolRetryMiddleware(max_retries=2)", mode, provider, 1, started)
    print(figures.line())
    assert figures.posts == 3  # three attempts reached the provider either way
    if mode == "plain":
        assert figures.effects == 3  # each retry refunded again
        return
    assert figures.effects == 1
    refund_id = provider.ledger.refunds()[0]["refund_id"]
    assert refund_id in str(state["messages"][-1].content)
