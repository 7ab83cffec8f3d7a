"""The invoice-refund agent: an LLM planner node and a ToolNode, with a checkpointer.

::

    START → planner ─(tool calls)→ tools → planner … → (final answer) → END

``issue_refund`` and ``notify_customer`` have side effects, so they are wrapped with
:func:`langchain_idempotent.idempotent`: each runs at most once per thread (ticket), node,
tool and canonical arguments, and hands its key downstream to the provider.
``lookup_invoice`` is a read and is deliberately left unwrapped (see below).

Provider failures (:class:`~graphs.tools.ProviderError`) are handed back to the planner as
error tool messages, so the agent itself retries the call, as agents do; anything else
(an LLM gateway 502, a lease still held by another worker) propagates to the caller, whose
worker loop retries the ticket by resuming the same thread from its checkpoint.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage, SystemMessage
from langchain_core.tools import BaseTool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from langchain_idempotent import BaseIdempotencyStore, idempotent
from langchain_idempotent.stores.sqlite import switch_to_wal

from .fake_model import ScriptedRefundModel
from .tools import DEFAULT_TIMEOUT, ProviderError, make_tools

if TYPE_CHECKING:  # the demo extra's; the Agent Server ([server] only) never needs it
    from langgraph.checkpoint.sqlite import SqliteSaver

__all__ = [
    "SYSTEM_PROMPT",
    "RefundAgent",
    "agent_loop",
    "build_refund_agent",
    "refund_tools",
    "sqlite_checkpointer",
]

RefundAgent = CompiledStateGraph[MessagesState, None, MessagesState, MessagesState]

SYSTEM_PROMPT = """\
You process customer refund tickets for the billing team. For each ticket:
1. call lookup_invoice with the invoice id from the ticket;
2. call issue_refund with that invoice id, the amount in dollars the ticket asks for, and
   the reason "Support ticket <ticket id>";
3. call notify_customer with the customer id, the ticket id and a one-sentence message
   that names the amount, the invoice and the refund id;
4. answer with one line that summarises what you did.
If a tool call fails, call it again with the same arguments. Make one call at a time."""


def sqlite_checkpointer(path: str | Path = ":memory:") -> SqliteSaver:
    """A :class:`SqliteSaver` on ``path``, usable from several threads and processes."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = sqlite3.connect(str(path), check_same_thread=False, timeout=30.0)
    switch_to_wal(conn, timeout=30.0)  # workers open a fresh file at once
    conn.execute("PRAGMA synchronous=NORMAL")
    saver = SqliteSaver(conn)
    saver.setup()
    return saver


def refund_tools(
    store: BaseIdempotencyStore | None,
    *,
    provider_url: str | None = None,
    http: httpx.Client | None = None,
    idempotency: Mapping[str, Any] | None = None,
    protect: Callable[[list[BaseTool]], Sequence[BaseTool]] | None = None,
    after_refund_committed: Callable[[], None] | None = None,
    on_refund_resent: Callable[[], None] | None = None,
    before_refund: Callable[[], None] | None = None,
) -> list[BaseTool]:
    """``[lookup_invoice, issue_refund, notify_customer]`` on the provider, the effectful
    two protected as :func:`build_refund_agent` describes (its arguments of these names)."""
    if http is None:
        if provider_url is None:
            raise ValueError("give the provider as provider_url=... or http=httpx.Client(...)")
        http = httpx.Client(base_url=provider_url, timeout=DEFAULT_TIMEOUT)
    lookup_invoice, issue_refund, notify_customer = make_tools(
        http,
        after_refund_committed=after_refund_committed,
        on_refund_resent=on_refund_resent,
        before_refund=before_refund,
        mark_effects=store is not None and bool((idempotency or {}).get("boundary")),
    )
    effectful: list[BaseTool] = [issue_refund, notify_customer]
    if store is not None:
        effectful = list(idempotent(effectful, store=store, **dict(idempotency or {})))
    elif protect is not None:
        effectful = list(protect(effectful))
    # lookup_invoice is NOT wrapped: it only reads, so running it twice is harmless and
    # returns the invoice as it is now, which is what the planner should see on a retry.
    # Memoizing it would cost a store round trip per call and could replay stale data.
    return [lookup_invoice, *effectful]


def agent_loop(planner: Any, tools: Sequence[BaseTool]) -> StateGraph[MessagesState]:
    """``START → planner ⇄ tools``: the planner node (sync or async) and a ``ToolNode``
    that hands provider errors back to the planner as error tool messages."""
    graph = StateGraph(MessagesState)
    graph.add_node("planner", planner)
    graph.add_node("tools", ToolNode(tools, handle_tool_errors=(ProviderError,)))
    graph.add_edge(START, "planner")
    graph.add_conditional_edges("planner", tools_condition)
    graph.add_edge("tools", "planner")
    return graph


def build_refund_agent(
    store: BaseIdempotencyStore | None,
    model: BaseChatModel | None = None,
    checkpointer: BaseCheckpointSaver[Any] | str | Path | None = None,
    *,
    provider_url: str | None = None,
    http: httpx.Client | None = None,
    idempotency: Mapping[str, Any] | None = None,
    protect: Callable[[list[BaseTool]], Sequence[BaseTool]] | None = None,
    after_refund_committed: Callable[[], None] | None = None,
    on_refund_resent: Callable[[], None] | None = None,
    on_llm_call: Callable[[], None] | None = None,
    before_refund: Callable[[], None] | None = None,
) -> RefundAgent:
    """Compile the refund agent.

    - ``store``: where idempotency records live. ``None`` leaves the effectful tools
      unprotected (the ``none`` baseline) unless ``protect`` wraps them.
    - ``model``: the planner; default a :class:`ScriptedRefundModel` without faults.
      Any chat model that supports ``bind_tools`` works (e.g. ``ChatOpenAI``).
    - ``checkpointer``: a saver, or a path for a SQLite file; default SQLite in memory.
    - ``provider_url`` or ``http`` (an ``httpx.Client`` whose ``base_url`` is the
      provider, with explicit timeouts).
    - ``idempotency``: keyword arguments for ``idempotent()`` (lease, wait_timeout,
      ``reconcile`` — e.g. :func:`~graphs.tools.make_reconcilers` — ...).
    - ``protect``: another wrapper for the effectful tools (the reference baseline);
      only used when ``store`` is ``None``.
    - ``after_refund_committed``, ``before_refund``, ``on_refund_resent``, ``on_llm_call``:
      hooks for fault injection and counting (see :func:`~graphs.tools.make_tools`).
      With ``idempotency={"boundary": True, ...}`` the tools mark their POSTs with
      ``side_effect()``.
    """
    tools = refund_tools(
        store,
        provider_url=provider_url,
        http=http,
        idempotency=idempotency,
        protect=protect,
        after_refund_committed=after_refund_committed,
        on_refund_resent=on_refund_resent,
        before_refund=before_refund,
    )
    planner_model = model if model is not None else ScriptedRefundModel()
    bound = planner_model.bind_tools(tools)

    def planner(state: MessagesState) -> dict[str, list[BaseMessage]]:
        if on_llm_call is not None:
            on_llm_call()
        reply = bound.invoke([SystemMessage(SYSTEM_PROMPT), *state["messages"]])
        return {"messages": [reply]}

    graph = agent_loop(planner, tools)

    if checkpointer is None or isinstance(checkpointer, str | Path):
        checkpointer = sqlite_checkpointer(checkpointer or ":memory:")
    return graph.compile(checkpointer=checkpointer)
