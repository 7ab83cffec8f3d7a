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
from langgraph.graph import MessagesState
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import RetryPolicy
from langgraph_supervisor import create_supervisor

from langchain_idempotent import BaseIdempotencyStore

from .fake_model import UpstreamGatewayError
from .pipeline_models import AGENTS, TOOL_OF, ScriptedSpecialist, ScriptedSupervisor
from .refund_agent import agent_loop, refund_tools, sqlite_checkpointer

__all__ = ["NODE_RETRY", "PipelineAgent", "build_pipeline_agent"]

PipelineAgent = CompiledStateGraph[Any, Any, Any, Any]

#: Every node of the pipeline (the supervisor and each specialist) retries an LLM 502.
NODE_RETRY = RetryPolicy(
    max_attempts=3, initial_interval=0.05, max_interval=0.5, retry_on=UpstreamGatewayError
)


def _specialist(
    name: str, model: BaseChatModel, tools: list[BaseTool]
) -> CompiledStateGraph[Any, Any, Any, Any]:
    """A specialist agent: a planner and a ToolNode (:func:`~graphs.refund_agent.agent_loop`);
    provider errors go back to the planner (it calls again), anything else propagates."""
    bound = model.bind_tools(tools)

    def planner(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [bound.invoke(state["messages"])]}

    return agent_loop(planner, tools).compile(name=name)


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
    tools = {
        t.name: t
        for t in refund_tools(
            store,
            provider_url=provider_url,
            http=http,
            idempotency=idempotency,
            protect=protect,
            after_refund_committed=after_refund_committed,
            on_refund_resent=on_refund_resent,
        )
    }

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
