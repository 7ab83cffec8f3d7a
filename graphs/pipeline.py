"""The refund pipeline: a ``langgraph-supervisor`` supervisor and three specialist agents.

::

    START → supervisor ─transfer_to_triage→ triage (lookup_invoice)
                ▲      ─transfer_to_billing→ billing (issue_refund)
                │      ─transfer_to_notifications→ notifications (notify_customer)
                └──────────── each specialist hands back ───────────┘

Each specialist is its own LangGraph agent (a planner and a ``ToolNode``, compiled with
its name), run by the supervisor as a node of the parent graph; every node has a
``RetryPolicy`` for an LLM gateway 502, so a specialist whose model fails *after* its tool
ran is invoked again from the start — the retry that pays twice without protection. The
parent graph has the checkpointer, so a worker that dies inside ``issue_refund`` leaves the
thread with the billing step pending, and the next worker resumes it.

Protection is that of :func:`graphs.refund_agent.build_refund_agent`: ``issue_refund`` and
``notify_customer`` wrapped with ``idempotent()`` (or the reference recipe); the keys carry
the specialist's place in the graph (``billing|tools``), so the retry of a specialist is the
same effect and two specialists never share a key.

``build_pipeline_agent`` takes the same arguments as ``build_refund_agent`` plus
``seed`` / ``error_rate`` / ``drift_rate`` / ``on_fault`` for the scripted models
(:mod:`graphs.pipeline_models`); the pipeline runs on scripted models only.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage
from langchain_core.tools import BaseTool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import RetryPolicy
from langgraph_supervisor import create_supervisor

from langchain_idempotent import BaseIdempotencyStore, idempotent

from .fake_model import UpstreamGatewayError
from .pipeline_models import AGENTS, TOOL_OF, ScriptedSpecialist, ScriptedSupervisor
from .refund_agent import sqlite_checkpointer
from .tools import DEFAULT_TIMEOUT, ProviderError, make_tools

__all__ = ["NODE_RETRY", "PipelineAgent", "build_pipeline_agent"]

PipelineAgent = CompiledStateGraph[Any, Any, Any, Any]

#: Every node of the pipeline (the supervisor and each specialist) retries an LLM 502.
NODE_RETRY = RetryPolicy(
    max_attempts=3, initial_interval=0.05, max_interval=0.5, retry_on=UpstreamGatewayError
)


def _specialist(
    name: str, model: BaseChatModel, tools: list[BaseTool]
) -> CompiledStateGraph[Any, Any, Any, Any]:
    """A specialist agent: a planner and a ToolNode; provider errors go back to the
    planner as error tool messages (it calls again), anything else propagates."""
    bound = model.bind_tools(tools)

    def planner(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [bound.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("planner", planner)
    graph.add_node("tools", ToolNode(tools, handle_tool_errors=(ProviderError,)))
    graph.add_edge(START, "planner")
    graph.add_conditional_edges("planner", tools_condition)
    graph.add_edge("tools", "planner")
    return graph.compile(name=name)


def build_pipeline_agent(
    store: BaseIdempotencyStore | None,
    checkpointer: BaseCheckpointSaver[Any] | str | Path | None = None,
    *,
    provider_url: str | None = None,
    http: httpx.Client | None = None,
    idempotency: Mapping[str, Any] | None = None,
    protect: Callable[[list[BaseTool]], Sequence[BaseTool]] | None = None,
    after_refund_committed: Callable[[], None] | None = None,
    on_refund_resent: Callable[[], None] | None = None,
    on_llm_call: Callable[[], None] | None = None,
    seed: int = 0,
    error_rate: float = 0.0,
    drift_rate: float = 0.0,
    on_fault: Callable[[str], None] | None = None,
    node_retry: RetryPolicy | None = NODE_RETRY,
    fail_after_tool: Collection[str] = (),
) -> PipelineAgent:
    """Compile the pipeline (see the module docstring and ``build_refund_agent``).

    ``node_retry``: every node's ``RetryPolicy`` (``None``: none). ``fail_after_tool``:
    the specialists (e.g. ``{"billing"}``) whose model fails once per ticket right after
    their tool succeeded, so that their node is retried after the effect.
    """
    unknown = set(fail_after_tool) - set(AGENTS)
    if unknown:
        raise ValueError(
            f"fail_after_tool: unknown agent(s) {sorted(unknown)}; choose from {AGENTS}"
        )
    if http is None:
        if provider_url is None:
            raise ValueError("give the provider as provider_url=... or http=httpx.Client(...)")
        http = httpx.Client(base_url=provider_url, timeout=DEFAULT_TIMEOUT)
    lookup_invoice, issue_refund, notify_customer = make_tools(
        http, after_refund_committed=after_refund_committed, on_refund_resent=on_refund_resent
    )
    effectful: list[BaseTool] = [issue_refund, notify_customer]
    if store is not None:
        effectful = list(idempotent(effectful, store=store, **dict(idempotency or {})))
    elif protect is not None:
        effectful = list(protect(effectful))
    tools = {t.name: t for t in [lookup_invoice, *effectful]}

    def model(cls: type[ScriptedSupervisor | ScriptedSpecialist], role: str) -> BaseChatModel:
        return cls(
            role=role,
            seed=seed,
            error_rate=error_rate,
            drift_rate=drift_rate,
            on_fault=on_fault,
            on_call=on_llm_call,
            fail_once_after_tool=role in fail_after_tool,
        )

    specialists = [
        _specialist(name, model(ScriptedSpecialist, name), [tools[TOOL_OF[name]]])
        for name in AGENTS
    ]
    builder = create_supervisor(
        specialists,  # type: ignore[arg-type]
        model=model(ScriptedSupervisor, "supervisor"),
        prompt="Hand each refund ticket to triage, then billing, then notifications.",
        output_mode="last_message",
    )
    if node_retry is not None:
        for spec in builder.nodes.values():
            spec.retry_policy = node_retry
    if checkpointer is None or isinstance(checkpointer, str | Path):
        checkpointer = sqlite_checkpointer(checkpointer or ":memory:")
    return builder.compile(checkpointer=checkpointer)
