"""A caller agent on one Agent Server that hands the refund to an agent on another.

Served by ``langgraph dev`` next to the refund agent (see ``tests/test_remote_agents.py``)::

    server A: START → billing (RetryPolicy on a dropped connection) → END
                          │  ask_billing_agent(ticket)
                          ▼
    server B: refund_agent_plain (plain tools: a second run pays a second time)

Two assistants, the same graph:

- ``remote_caller``: ``ask_billing_agent`` is wrapped with ``idempotent()`` and its body
  runs the remote agent with
  :func:`langchain_idempotent.integrations.remote.aidempotent_remote`: the
  remote thread is derived from the call's key, so a retry after a dropped connection
  joins the run it started (or is answered from it) instead of starting another.
- ``remote_caller_plain``: the same tool without either: a new remote thread and run per
  attempt, as a caller writes it with ``langgraph_sdk`` alone.

Configuration, from the environment: ``BILLING_AGENT_URL`` (required: server B, or a proxy
in front of it), ``BILLING_ASSISTANT`` (default ``refund_agent_plain``),
``IDEMPOTENCY_STORE_URL`` (the caller's own store; default a SQLite file in the server's
working directory).
"""

from __future__ import annotations

import functools
import os
from typing import Any

import httpx
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import RetryPolicy
from langgraph_sdk.client import LangGraphClient
from langgraph_sdk.errors import APIConnectionError

from langchain_idempotent import BaseIdempotencyStore, idempotent
from langchain_idempotent.integrations.remote import aidempotent_remote
from langchain_idempotent.settings import store_from_url

__all__ = ["caller", "caller_plain"]

CallerAgent = CompiledStateGraph[MessagesState, None, MessagesState, MessagesState]

DEFAULT_STORE_URL = "sqlite:///caller-idempotency.db"

#: What the billing node retries: the connection to server B dropped or was refused.
RETRY = RetryPolicy(
    max_attempts=3, initial_interval=0.2, retry_on=(httpx.TransportError, APIConnectionError)
)


@functools.cache
def _remote() -> LangGraphClient:
    """One client per server process. ``verify=False`` / ``trust_env=False``: plain HTTP on
    loopback, so nothing is read from disk inside the event loop (the dev server's
    blocking-call detector is on)."""
    url = os.environ.get("BILLING_AGENT_URL")
    if not url:
        raise RuntimeError(
            "set BILLING_AGENT_URL to the Agent Server that serves the billing agent"
        )
    http = httpx.AsyncClient(
        base_url=url,
        transport=httpx.AsyncHTTPTransport(retries=0, verify=False),
        trust_env=False,
        timeout=httpx.Timeout(60.0, connect=5.0),
    )
    return LangGraphClient(http)


def _assistant() -> str:
    return os.environ.get("BILLING_ASSISTANT", "refund_agent_plain")


def _ticket_input(ticket: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": ticket}]}


def _answer(values: Any) -> str:
    messages = values.get("messages", []) if isinstance(values, dict) else []
    return str(messages[-1]["content"]) if messages else ""


@tool
async def ask_billing_agent(ticket: str, config: RunnableConfig) -> str:
    """Hand a refund ticket to the billing agent on the billing Agent Server, once."""
    run = await aidempotent_remote(
        _remote(),
        _assistant(),
        _ticket_input(ticket),
        config={"configurable": dict(config.get("configurable", {}).get("remote", {}))},
        metadata={"caller": "remote_caller"},
    )
    return _answer(run.values)


@tool
async def ask_billing_agent_plain(ticket: str, config: RunnableConfig) -> str:
    """Hand a refund ticket to the billing agent on the billing Agent Server."""
    client = _remote()
    thread = await client.threads.create()
    run = await client.runs.create(
        thread["thread_id"],
        _assistant(),
        input=_ticket_input(ticket),
        config={"configurable": dict(config.get("configurable", {}).get("remote", {}))},
        metadata={"caller": "remote_caller_plain"},
    )
    return _answer(await client.runs.join(thread["thread_id"], run["run_id"]))


@functools.cache
def _store(url: str) -> BaseIdempotencyStore:
    return store_from_url(url)


def _build(ask: BaseTool) -> CallerAgent:
    async def billing(state: MessagesState, config: RunnableConfig) -> dict[str, list[BaseMessage]]:
        ticket = str(state["messages"][-1].content)
        answer = await ask.ainvoke({"ticket": ticket}, config)
        return {"messages": [AIMessage(str(answer))]}

    graph = StateGraph(MessagesState)
    graph.add_node("billing", billing, retry_policy=RETRY)
    graph.add_edge(START, "billing")
    return graph.compile()  # no checkpointer: the server provides it


def caller() -> CallerAgent:
    """``remote_caller``: the remote agent runs once per call, across retries."""
    store = _store(os.environ.get("IDEMPOTENCY_STORE_URL") or DEFAULT_STORE_URL)
    return _build(idempotent(ask_billing_agent, store, wait_timeout=None))


def caller_plain() -> CallerAgent:
    """``remote_caller_plain``: a new remote run per attempt."""
    return _build(ask_billing_agent_plain)
