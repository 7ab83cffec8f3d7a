"""``IdempotencyMiddleware``: the same engine as :class:`IdempotentTool`, as a LangChain v1
agent middleware for ``create_agent``.

    agent = create_agent(model, tools=[lookup_invoice, issue_refund],
                         middleware=[IdempotencyMiddleware(store, tools=["issue_refund"])],
                         checkpointer=InMemorySaver())

It wraps the tool calls it names (``wrap_tool_call`` and ``awrap_tool_call``, so the
agent works under ``invoke`` and ``ainvoke``); other tools run untouched. The key is
derived exactly as the wrapper derives it. Results returned by middleware skip
ToolNode's validation, so a replayed ``ToolMessage`` / ``Command`` is re-stamped with the
current ``tool_call_id`` here, and a result the wrapper stored (the tool's own return
value) is formatted as the ``ToolMessage`` LangChain would make of it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any, cast

from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command
from pydantic import ValidationError

from .engine import Engine
from .events import EventHook
from .keys import TURN_CONFIG_KEY, call_info, derive_key, model_schema, turn_from_messages
from .policy import Policy
from .stores.base import BaseIdempotencyStore
from .tool import _checked, _HandledToolError, _Pending, _restamp

__all__ = ["IdempotencyMiddleware"]

_Result = ToolMessage | Command[Any]


class IdempotencyMiddleware(AgentMiddleware):  # type: ignore[type-arg]
    """Make the named tools of a ``create_agent`` agent idempotent.

    ``tools`` is required: name the tools with side effects (names or the tools
    themselves). ``policy`` takes the fields of :class:`~langchain_idempotent.Policy`.
    """

    def __init__(
        self,
        store: BaseIdempotencyStore | None = None,
        *,
        tools: Iterable[str | BaseTool],
        on_event: EventHook | None = None,
        **policy: Any,
    ) -> None:
        super().__init__()
        from .settings import IdempotencySettings

        names = {t.name if isinstance(t, BaseTool) else t for t in tools}
        if not names or not all(isinstance(n, str) and n for n in names):
            raise ValueError("IdempotencyMiddleware(tools=...) needs the names of the tools")
        self.tool_names = frozenset(names)
        settings = IdempotencySettings()
        resolved = Policy.from_kwargs(settings.policy(), **policy)
        self.engine = Engine(store or settings.store(), resolved, on_event=on_event)

    def _prepare(self, request: ToolCallRequest) -> _Pending | None:
        call = request.tool_call
        if call["name"] not in self.tool_names or request.tool is None:
            return None
        config: RunnableConfig = dict(getattr(request.runtime, "config", None) or {})  # type: ignore[assignment]
        if self.engine.policy.scope == "turn":
            turn = _turn_from_state(request.state)
            if turn is not None:
                config["configurable"] = {TURN_CONFIG_KEY: turn, **config.get("configurable", {})}
        try:
            info = call_info(
                tool=call["name"],
                schema=model_schema(request.tool),
                tool_input=call["args"],
                tool_call_id=call.get("id"),
                config=config,
                namespace=self.engine.policy.namespace,
            )
        except ValidationError:
            return None  # the tool reports invalid arguments itself
        return _Pending(derive_key(info, self.engine.policy.scope), call, call.get("id"))

    def wrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], _Result],
    ) -> _Result:
        pending = self._prepare(request)
        if pending is None:
            return handler(request)
        try:
            result = self.engine.run(
                pending.derived.key,
                fingerprint=pending.derived.fingerprint,
                action=lambda: _checked(handler(request)),
                tool=request.tool_call["name"],
                meta=pending.derived.meta,
                observer=pending.observe,
            )
        except _HandledToolError as handled:
            return handled.message
        return _replayed(result, pending, request) if pending.replayed else result

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[_Result]],
    ) -> _Result:
        pending = self._prepare(request)
        if pending is None:
            return await handler(request)

        async def action() -> Any:
            return _checked(await handler(request))

        try:
            result = await self.engine.arun(
                pending.derived.key,
                fingerprint=pending.derived.fingerprint,
                action=action,
                tool=request.tool_call["name"],
                meta=pending.derived.meta,
                observer=pending.observe,
            )
        except _HandledToolError as handled:
            return handled.message
        return _replayed(result, pending, request) if pending.replayed else result


def _replayed(result: Any, pending: _Pending, request: ToolCallRequest) -> _Result:
    """A stored result as the answer to this call: a ``ToolMessage`` / ``Command`` stored
    by the middleware is re-stamped; what :class:`IdempotentTool` stored from the tool's own
    ``_run`` (its content, or ``(content, artifact)``) is formatted as LangChain formats a
    tool's output, so one thread can move from the wrapper to the middleware."""
    from langchain_core.tools.base import _format_output

    tool = request.tool
    if tool is not None and tool.response_format == "content_and_artifact":
        if isinstance(result, tuple) and len(result) == 2:
            content, artifact = result
            result = _format_output(content, artifact, pending.tool_call_id, tool.name, "success")
    elif tool is not None:
        result = _format_output(result, None, pending.tool_call_id, tool.name, "success")
    return cast(_Result, _restamp(result, pending))


def _turn_from_state(state: Any) -> str | None:
    messages = (
        state.get("messages") if isinstance(state, dict) else getattr(state, "messages", None)
    )
    return turn_from_messages(messages)
