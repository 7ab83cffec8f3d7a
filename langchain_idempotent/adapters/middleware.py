"""``IdempotencyMiddleware``: the same call path as :class:`IdempotentTool`, as a LangChain
v1 agent middleware for ``create_agent`` (needs ``pip install 'langchain-idempotent[agents]'``).

    agent = create_agent(model, tools=[lookup_invoice, issue_refund],
                         middleware=[IdempotencyMiddleware(store, tools=["issue_refund"])],
                         checkpointer=InMemorySaver())

It wraps the tool calls it names (``wrap_tool_call`` and ``awrap_tool_call``, so the
agent works under ``invoke`` and ``ainvoke``); other tools run untouched. The key is
derived exactly as the wrapper derives it (:mod:`._call`), and the same decisions are
dispatched as ``idempotency.<kind>`` callback events. Results returned by middleware skip
ToolNode's validation, so a replayed ``ToolMessage`` / ``Command`` is re-stamped with the
current ``tool_call_id``, and a result the wrapper stored (the tool's own return value)
is formatted as the ``ToolMessage`` LangChain would make of it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Unpack, cast

try:
    from langchain.agents.middleware import AgentMiddleware
except ImportError as exc:  # `langchain` is the optional `agents` extra
    raise ImportError(
        "IdempotencyMiddleware needs LangChain's agents package (`langchain`); install it "
        "with: pip install 'langchain-idempotent[agents]'"
    ) from exc
from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.errors import GraphBubbleUp
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command
from pydantic import ConfigDict

from ..core.engine import Engine
from ..core.events import EventHook
from ..core.policy import Policy, PolicyOptions
from ..core.reads import current_reads
from ..core.store import BaseIdempotencyStore
from ._asking import Steps
from ._call import PendingCall, build_engine, unmemoized_if_error
from ._calling import watch_calling_tools
from ._compat import NO_INJECTIONS, InjectedParams, format_tool_output, injected_params, loud
from ._handoff import Handoff, check_handoff, is_handoff, stored_handoff
from ._hints import engine_for
from ._identical import has_twin
from ._opening import Opening, aopen_call, open_call, opening
from ._reads import seeing_request, view_config
from ._siblings import Sibling, StepCalls, step_calls
from .keys import TURN_CONFIG_KEY, graph_path, model_schema, turn_from_messages

__all__ = ["IdempotencyMiddleware"]

_Result = ToolMessage | Command[Any]


class IdempotencyMiddleware(AgentMiddleware):  # type: ignore[type-arg]
    """Make the named tools of a ``create_agent`` agent idempotent.

    ``store`` is required (as for :func:`~langchain_idempotent.idempotent`); ``tools`` names
    the tools with side effects (names or the tools themselves). ``policy`` is a whole
    :class:`~langchain_idempotent.Policy`; the keyword ``options`` are its fields and win
    over it (``reconcile={"issue_refund": refund_status}`` gives a reconcile hook per tool,
    a single function is asked for every named tool). Nothing is read from the
    environment here.

    ``approval=True`` (or a predicate of the call, or a dict of tool names to those) asks
    a human before each new effect of the named tools, once per key, in the format
    ``interrupt_mode`` names as ``HumanInTheLoopMiddleware`` does: ``"batched"`` (a
    ``HITLRequest``) or ``"per_call"`` (a ``ToolApprovalRequest`` with a
    ``response_schema``); see :mod:`langchain_idempotent.adapters.approval`. Use it instead of
    ``HumanInTheLoopMiddleware`` for effectful tools; that one stays fine for the others.

    A named tool that reads the graph state and returns a ``Command`` (a handoff) runs on
    every call with no record, as under :func:`~langchain_idempotent.idempotent`, unless
    ``handoff=`` (``"rerun"`` or ``"replay"``, or a dict of tool names to those) says
    otherwise. What a named tool reads of the state and the config is noted while it runs
    (docs/keys.md).
    """

    def __init__(
        self,
        store: BaseIdempotencyStore | None = None,
        *,
        tools: Iterable[str | BaseTool],
        policy: Policy | None = None,
        on_event: EventHook | None = None,
        handoff: Handoff | Mapping[str, Handoff] | None = None,
        **options: Unpack[PolicyOptions],
    ) -> None:
        super().__init__()
        tools = list(tools)
        names = {t.name if isinstance(t, BaseTool) else t for t in tools}
        if not names or not all(isinstance(n, str) and n for n in names):
            raise ValueError("IdempotencyMiddleware(tools=...) needs the names of the tools")
        self.tool_names = frozenset(names)
        for option in ("reconcile", "effect"):
            per_tool = options.get(option)
            unknown = (
                sorted(set(per_tool) - self.tool_names) if isinstance(per_tool, Mapping) else []
            )
            if unknown:
                raise ValueError(
                    f"{option}= names {', '.join(unknown)}, which tools= does not: it only "
                    "applies to the tools this middleware makes idempotent"
                )
        self.engine = build_engine(
            store, policy=policy, options=options, on_event=on_event, who="IdempotencyMiddleware"
        )
        if isinstance(handoff, Mapping):
            for value in handoff.values():
                check_handoff(None, value)
        else:
            check_handoff(None, handoff)
        self.handoff = handoff
        self._known: dict[str, _Known] = {}
        watch_calling_tools()  # a sub-agent run from an unwrapped tool knows its caller
        for t in tools:  # the tools given as objects: their classes inferred (and said) now
            if isinstance(t, BaseTool):
                engine_for(self.engine, t)

    def wrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], _Result],
    ) -> _Result:
        config, engine = _config(request), self._engine(request)
        if engine is None:  # not a tool this middleware wraps
            return handler(request)
        opened = open_call(self._opening(request, config, engine), engine.store)
        if opened.pending is None:
            with opened.untouched(request.tool_call["name"]):
                return handler(request)
        if opened.rejection is not None:
            return opened.rejection
        call = _Call.of(self, _edited(request, opened), opened.pending, engine, config)
        if call.twinned:  # the effect is claimed where the tool runs
            return handler(_AtTheTool.over(call, self))
        params = self._params(call.request)

        def action() -> Any:
            return handler(seeing_request(call.request, params, current_reads()))

        return call.run(action)

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[_Result]],
    ) -> _Result:
        config, engine = _config(request), self._engine(request)
        if engine is None:
            return await handler(request)
        opened = await aopen_call(self._opening(request, config, engine), engine.store)
        if opened.pending is None:
            with opened.untouched(request.tool_call["name"]):
                return await handler(request)
        if opened.rejection is not None:
            return opened.rejection
        call = _Call.of(self, _edited(request, opened), opened.pending, engine, config)
        if call.twinned:
            return await handler(_AtTheTool.over(call, self))
        params = self._params(call.request)

        async def action() -> Any:
            return await handler(seeing_request(call.request, params, current_reads()))

        return await call.arun(action)

    def _opening(
        self, request: ToolCallRequest, config: RunnableConfig, engine: Engine
    ) -> Opening | Steps:
        """The call's opening (:mod:`._opening`): as it is, rejected, or under its key."""
        return opening(
            engine, lambda: self._handoff(request), lambda: self._pending(request, config), config
        )

    def _handoff(self, request: ToolCallRequest) -> Handoff | None:
        """What replay means for the call's tool if it is a handoff (the rule of
        :func:`~langchain_idempotent.idempotent`: ``"rerun"`` unless ``handoff=`` says);
        ``None`` for any other tool, and for a tool this middleware does not wrap."""
        if request.tool is None or request.tool_call["name"] not in self.tool_names:
            return None
        try:
            return self._handoff_of(request.tool)
        except ValueError as exc:
            raise loud(exc) from None

    def _handoff_of(self, tool: BaseTool) -> Handoff | None:
        if not self._known_of(tool).handoff:
            return None
        handoff = self.handoff.get(tool.name) if isinstance(self.handoff, Mapping) else self.handoff
        return check_handoff(tool, handoff)

    def _known_of(self, tool: BaseTool) -> _Known:
        """What is read once per tool object: its injected parameters, whether it is a
        handoff."""
        known = self._known.get(tool.name)
        if known is None or known.tool is not tool:
            known = _Known(tool, injected_params(tool), is_handoff(tool))
            self._known[tool.name] = known
        return known

    def _params(self, request: ToolCallRequest) -> InjectedParams:
        tool = request.tool
        return self._known_of(tool).params if tool is not None else NO_INJECTIONS

    def _engine(self, request: ToolCallRequest) -> Engine | None:
        """The engine of a tool this middleware wraps (its effect class applied)."""
        name = request.tool_call["name"]
        if name not in self.tool_names:
            return None
        tool = request.tool
        return self.engine.for_tool(name) if tool is None else engine_for(self.engine, tool)

    def _step(
        self, request: ToolCallRequest, config: RunnableConfig, engine: Engine, pending: PendingCall
    ) -> StepCalls | None:
        """The other calls of this call's model message (the state every call of the step
        is given), to claim with it in one round trip; the tools from the call's runtime."""
        if engine.policy.approval:
            return None

        def siblings(calls: list[dict[str, Any]]) -> list[Sibling]:
            tools = {t.name: t for t in getattr(request.runtime, "tools", None) or ()}
            out = []
            for call in calls:
                tool = tools.get(call.get("name"))
                if call.get("id") == pending.tool_call_id or tool is None:
                    continue
                other = request.override(tool_call=cast(Any, call), tool=tool)
                theirs = self._engine(other)
                if theirs is None or theirs.policy.effect_class == "read":
                    continue
                try:
                    if self._handoff(other) == "rerun":
                        continue
                except GraphBubbleUp:  # refused: it says so at its own call
                    continue
                derived = self._pending(other, config)
                if derived is not None:
                    out.append(derived.sibling(theirs))
            return out

        return step_calls(_messages(request.state), pending.tool_call_id, siblings)

    def _pending(self, request: ToolCallRequest, config: RunnableConfig) -> PendingCall | None:
        call = request.tool_call
        if call["name"] not in self.tool_names or request.tool is None:
            return None
        policy = engine_for(self.engine, request.tool).policy
        if policy.scope == "turn" and not _nested(config):  # nested: the outermost turn
            turn = _turn_from_state(request.state)
            if turn is not None:
                config = {
                    **config,
                    "configurable": {TURN_CONFIG_KEY: turn, **config.get("configurable", {})},
                }
        return PendingCall.derive(
            tool=call["name"],
            schema=model_schema(request.tool),
            tool_input=call,
            args=call["args"],
            tool_call_id=call.get("id"),
            config=config,
            policy=policy,
            params=self._known_of(request.tool).params,
            state=request.state,
        )


@dataclass(slots=True)
class _Call:
    """A call of a wrapped tool past its opening, to run under its key: its request (as a
    reviewer edited it), its engine and config, the other calls of its step (claimed with
    it) and what replay means for it if it is a handoff."""

    request: ToolCallRequest
    pending: PendingCall
    engine: Engine
    config: RunnableConfig
    step: StepCalls | None
    handoff: Handoff | None

    @classmethod
    def of(
        cls,
        middleware: IdempotencyMiddleware,
        request: ToolCallRequest,
        pending: PendingCall,
        engine: Engine,
        config: RunnableConfig,
    ) -> _Call:
        step = middleware._step(request, config, engine, pending)
        return cls(request, pending, engine, config, step, middleware._handoff(request))

    @property
    def twinned(self) -> bool:
        """Whether the call has an identical twin in its message that shares its effect."""
        return (
            self.engine.policy.identical_calls == "share"
            and self.request.tool is not None
            and has_twin(_messages(self.request.state), self.request.tool_call.get("id"))
        )

    def run(self, action: Callable[[], Any]) -> _Result:
        """``action`` (the handler) run once for the call's key; the answer as a message."""
        result = self.pending.run(self.engine, lambda: self._kept(action()), self.config, self.step)
        return self._answer(result)

    async def arun(self, action: Callable[[], Awaitable[Any]]) -> _Result:
        """The async twin of :meth:`run`."""

        async def kept() -> Any:
            return self._kept(await action())

        return self._answer(await self.pending.arun(self.engine, kept, self.config, self.step))

    def _kept(self, result: Any) -> Any:
        """What is stored of ``result``: not a handled tool error, nor under
        ``handoff="replay"`` a Command that carries a copy of the state."""
        result = unmemoized_if_error(result)
        if self.handoff != "replay":
            return result
        return stored_handoff(result, self.pending.tool, self.pending.tool_call_id)

    def _answer(self, result: Any) -> _Result:
        if not self.pending.replayed:
            return cast(_Result, result)
        return _as_message(result, self.request, self.pending)

    def edited(self, middleware: IdempotencyMiddleware, tool_input: Any) -> _Call:
        """The call as it reaches the tool (a middleware inside ours may have edited its
        arguments: then under their key, claimed on its own)."""
        args = tool_input.get("args") if isinstance(tool_input, Mapping) else None
        if args is None or args == self.request.tool_call["args"]:
            return self
        edited = self.request.override(tool_call={**self.request.tool_call, "args": dict(args)})
        pending = middleware._pending(edited, self.config) or self.pending
        return dataclasses.replace(self, request=edited, pending=pending, step=None)


class _AtTheTool(BaseTool):
    """A twin's tool, its effect claimed where the tool runs, inside every middleware
    after this one: what those decide stays per call. Identical calls of one message
    share one effect, but a middleware inside ours (LangChain's per-call
    ``HumanInTheLoopMiddleware``) may reject one twin and approve the other; claimed
    around the handler, the rejected twin would wait for the approved one's effect and
    be answered with its success."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    inner: BaseTool
    call: Any  # _Call
    middleware: Any  # IdempotencyMiddleware

    @classmethod
    def over(cls, call: _Call, middleware: IdempotencyMiddleware) -> ToolCallRequest:
        """``call``'s request with its tool replaced by one that claims the effect."""
        tool = call.request.tool
        assert tool is not None
        at_tool = cls(
            name=tool.name,
            description=tool.description,
            args_schema=tool.args_schema,
            response_format=tool.response_format,
            inner=tool,
            call=call,
            middleware=middleware,
        )
        return call.request.override(tool=at_tool)

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        call = self.call.edited(self.middleware, input)
        return call.run(lambda: self.inner.invoke(input, _viewed(config), **kwargs))

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        call = self.call.edited(self.middleware, input)
        return await call.arun(lambda: self.inner.ainvoke(input, _viewed(config), **kwargs))

    def _run(self, *args: Any, **kwargs: Any) -> Any:  # invoke is the one way in
        raise NotImplementedError


def _viewed(config: RunnableConfig | None) -> RunnableConfig | None:
    """The config a twin's tool runs with: a view that notes its reads (inside the claim)."""
    reads = current_reads()
    return config if reads is None else cast(RunnableConfig, view_config(config or {}, reads))


@dataclass(frozen=True, slots=True)
class _Known:
    tool: BaseTool
    params: InjectedParams
    handoff: bool


def _edited(request: ToolCallRequest, opened: Opening) -> ToolCallRequest:
    """The request with the reviewer's arguments, when they edited the call."""
    if opened.edited is None:
        return request
    return request.override(tool_call={**request.tool_call, "args": dict(opened.edited)})


def _config(request: ToolCallRequest) -> RunnableConfig:
    return cast(RunnableConfig, dict(getattr(request.runtime, "config", None) or {}))


def _as_message(result: Any, request: ToolCallRequest, pending: PendingCall) -> _Result:
    """A replayed result as the answer to this call: what :class:`IdempotentTool` stored
    from the tool's own ``_run`` (its content, or ``(content, artifact)``) is formatted as
    LangChain formats a tool's output, so one thread can move from the wrapper to the
    middleware; a stored ``ToolMessage`` / ``Command`` is already re-stamped."""
    tool = request.tool
    if tool is None:
        return cast(_Result, result)
    if tool.response_format == "content_and_artifact":
        if isinstance(result, tuple) and len(result) == 2:
            content, artifact = result
            result = format_tool_output(content, artifact, pending.tool_call_id, tool.name)
    else:
        result = format_tool_output(result, None, pending.tool_call_id, tool.name)
    return cast(_Result, result)


def _messages(state: Any) -> Any:
    return state.get("messages") if isinstance(state, dict) else getattr(state, "messages", None)


def _nested(config: RunnableConfig) -> bool:
    ns = (config.get("configurable") or {}).get("checkpoint_ns")
    return "|" in graph_path(ns if isinstance(ns, str) else None)


def _turn_from_state(state: Any) -> str | None:
    return turn_from_messages(_messages(state))
