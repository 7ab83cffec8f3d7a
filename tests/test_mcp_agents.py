"""The reply-lost refund through LangGraph: a ToolNode with a RetryPolicy, and
``create_agent`` with ``ToolRetryMiddleware``, over a real refund MCP server that is
SIGKILLed after recording its result and before replying (see test_mcp_crash.py).
The graph's own retry reaches the restarted server with the same key: one refund with
``McpIdempotency``, two with a plain server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langchain_mcp_adapters")
pytest.importorskip("fastmcp")
pytest.importorskip("langchain.agents")

from langchain.agents import create_agent
from langchain.agents.middleware import ToolRetryMiddleware
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from langgraph.types import RetryPolicy

from langchain_idempotent import IdempotencyError
from tests.support.graphs import ScriptedChatModel, call, calls, thread
from tests.support.mcp_bank import LOST_REPLY_TIMEOUT_S, bank

REFUND = {"order_id": "A-7", "amount": 140}
LOST = ("--die-after", "record")


def retryable(exc: BaseException) -> bool:
    return not isinstance(exc, IdempotencyError)


def refunds_answered(messages: list[Any]) -> list[Any]:
    return [m for m in messages if m.type == "tool"]


@pytest.mark.parametrize("transport", ["http", pytest.param("stdio", marks=pytest.mark.slow)])
@pytest.mark.parametrize(("ours", "rows"), [(False, 2), (True, 1)], ids=["plain", "ours"])
async def test_a_tool_node_retry_after_a_lost_reply_refunds_once(
    tmp_path: Path, transport: str, ours: bool, rows: int
) -> None:
    args = (*LOST, "--die-marker", str(tmp_path / "died"))
    with bank(
        tmp_path, transport, ours=ours, args=args, read_timeout=LOST_REPLY_TIMEOUT_S
    ) as the_bank:
        tool = await the_bank.tool()
        graph = StateGraph(MessagesState)
        graph.add_node(
            "tools",
            ToolNode([tool]),
            retry_policy=RetryPolicy(
                max_attempts=60,
                initial_interval=0.25,
                backoff_factor=1.0,
                jitter=False,
                retry_on=retryable,
            ),
        )
        graph.add_edge(START, "tools")
        app = graph.compile(checkpointer=InMemorySaver())
        out = await app.ainvoke(
            {"messages": [calls(call("refund", REFUND))]}, thread(f"node-{ours}")
        )
        assert (tmp_path / "died").exists()
        assert the_bank.rows.count() == rows
        assert len(refunds_answered(out["messages"])) == 1


@pytest.mark.parametrize(("ours", "rows"), [(False, 2), (True, 1)], ids=["plain", "ours"])
async def test_create_agent_with_tool_retry_after_a_lost_reply_refunds_once(
    tmp_path: Path, ours: bool, rows: int
) -> None:
    args = (*LOST, "--die-marker", str(tmp_path / "died"))
    with bank(
        tmp_path, "http", ours=ours, args=args, read_timeout=LOST_REPLY_TIMEOUT_S
    ) as the_bank:
        tool = await the_bank.tool()
        model = ScriptedChatModel(script=[calls(call("refund", REFUND))])
        agent = create_agent(
            model,
            tools=[tool],
            middleware=[
                ToolRetryMiddleware(
                    max_retries=60,
                    initial_delay=0.25,
                    backoff_factor=1.0,
                    jitter=False,
                    retry_on=retryable,
                )
            ],
            checkpointer=InMemorySaver(),
        )
        out = await agent.ainvoke(
            {"messages": [("user", "refund A-7 please")]}, thread(f"agent-{ours}")
        )
        assert (tmp_path / "died").exists()
        assert the_bank.rows.count() == rows
        answered = refunds_answered(out["messages"])
        assert len(answered) == 1
        assert answered[0].status == "success"
