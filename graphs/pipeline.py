"""The refund pipeline: LangChain's sub-agents-as-tools pattern, a ``create_agent`` supervisor
whose tools invoke three ``create_agent`` specialists.

::

    START → supervisor ─triage(request)→        triage agent (lookup_invoice)
                ▲      ─billing(request)→       billing agent (issue_refund)
                │      ─notifications(request)→ notifications agent (notify_customer)
                └──────── each tool answers with its agent's last message ───────┘

Each specialist is its own ``create_agent`` agent (named, no checkpointer of its own); the
supervisor's tools invoke them, and only the supervisor, the outermost graph, has the
checkpointer (LangChain's recommended multi-agent shape). The supervisor retries an LLM
gateway 502: its model calls through ``ModelRetryMiddleware``, its tools through
``ToolRetryMiddleware``, so a specialist whose model fails *after* its tool ran is invoked
again from the start: the retry that pays twice without protection. A worker that dies
inside ``issue_refund`` leaves the thread with the supervisor's tool call pending, and the
next worker resumes it.

Protection is that of :func:`graphs.refund_agent.build_refund_agent`: ``issue_refund`` and
``notify_customer`` wrapped with ``idempotent()`` (or the reference recipe); a key carries
the specialist's name (``lc_agent_name``) and its place in the graph, and a retried
specialist asks for the same arguments, so its retry is the same effect and two
specialists never share a key. (``langgraph-supervisor``'s ``create_supervisor`` and the
swarm stay tested integrations: ``tests/test_multiagent_*.py``.)

``build_pipeline_agent`` takes the same arguments as ``build_refund_agent`` plus
``seed`` / ``error_rate`` / ``drift_rate`` / ``on_fault`` for the scripted models
(:mod:`graphs.pipeline_models`); the pipeline runs on scripted models only.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
from langchain.agents import create_agent
from langchain.agents.middleware import (
    AgentMiddleware,
    ModelRetryMiddleware,
    ToolRetryMiddleware,
    wrap_tool_call,
)
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph.state import CompiledStateGraph

from langchain_idempotent import BaseIdempotencyStore

from .fake_model import UpstreamGatewayError
from .pipeline_models import AGENTS, TOOL_OF, ScriptedSpecialist, ScriptedSupervisor
from .refund_agent import refund_tools, sqlite_checkpointer
from .tools import ProviderError

__all__ = ["RETRIES", "PipelineAgent", "build_pipeline_agent"]

PipelineAgent = CompiledStateGraph[Any, Any, Any, Any]

#: How many times the supervisor retries an LLM 502 (of its model, or of a specialist, by
#: invoking the specialist again).
RETRIES = 2


@wrap_tool_call  # type: ignore[arg-type]
def _provider_errors_to_the_model(request: Any, handler: Callable[[Any], Any]) -> Any:
    """A payment-provider error goes back to the specialist's model as an error tool
    message (it calls again, or escalates); anything else propagates."""
    try:
        return handler(request)
    except ProviderError as exc:
        call = request.tool_call
        return ToolMessage(
            content=f"Error: {exc!r}", tool_call_id=call["id"], name=call["name"], status="error"
        )


def _as_tool(name: str, agent: CompiledStateGraph[Any, Any, Any, Any]) -> BaseTool:
    """The specialist ``agent`` as a supervisor tool: it runs on ``request`` and answers
    with its last message (the sub-agents-as-tools pattern)."""

    def run(request: str) -> str:
        out = agent.invoke({"messages": [HumanMessage(request)]})
        return str(out["messages"][-1].content)

    return StructuredTool.from_function(
        func=run,
        name=name,
        description=f"Hand the refund ticket to the {name} agent; `request` is the ticket "
        "and what the agent needs from the agents before it.",
    )


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
    retries: int = RETRIES,
    fail_after_tool: Collection[str] = (),
) -> PipelineAgent:
    """Compile the pipeline (see the module docstring and ``build_refund_agent``).

    ``retries``: how many times the supervisor retries an LLM 502 (``0``: it reaches the
    caller). ``fail_after_tool``: the specialists (e.g. ``{"billing"}``) whose model fails
    once per ticket right after their tool succeeded, so that they are invoked again after
    the effect.
    """
    unknown = set(fail_after_tool) - set(AGENTS)
    if unknown:
        raise ValueError(
            f"fail_after_tool: unknown agent(s) {sorted(unknown)}; choose from {AGENTS}"
        )
    if retries < 0:
        raise ValueError(f"retries must be 0 or more, got {retries}")
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
        _as_tool(
            name,
            create_agent(
                model(ScriptedSpecialist, name),
                tools=[tools[TOOL_OF[name]]],
                middleware=[_provider_errors_to_the_model],
                name=name,
            ),
        )
        for name in AGENTS
    ]
    retry: dict[str, Any] = {
        "max_retries": retries,
        "retry_on": (UpstreamGatewayError,),
        "on_failure": "error",
        "initial_delay": 0.05,
        "max_delay": 0.5,
    }
    middleware: list[AgentMiddleware[Any, Any]] = (
        [ModelRetryMiddleware(**retry), ToolRetryMiddleware(**retry)] if retries else []
    )
    if checkpointer is None or isinstance(checkpointer, str | Path):
        checkpointer = sqlite_checkpointer(checkpointer or ":memory:")
    agent: PipelineAgent = create_agent(
        model(ScriptedSupervisor, "supervisor"),
        tools=specialists,
        system_prompt="Hand each refund ticket to triage, then billing, then notifications.",
        middleware=middleware,
        checkpointer=checkpointer,
        name="supervisor",
    )
    return agent
