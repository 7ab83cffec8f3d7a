"""``IdempotentTool``: any LangChain tool, run at most once per idempotency key.

The wrapper is a :class:`~langchain_core.tools.BaseTool` that shows the model exactly the
inner tool (name, description, ``args_schema``, ``tool_call_schema``) and parses a call's
arguments as the inner tool does (``InjectedState``, ``InjectedStore``,
``InjectedToolCallId`` and ``ToolRuntime`` pass through). Its own tool run is the one in
the trace: it calls the inner tool's ``_run`` / ``_arun`` directly (:mod:`.direct`), and
LangChain formats the result (``ToolMessage``, ``content_and_artifact``) and handles errors
as the inner tool is configured to. A tool whose class overrides ``invoke`` or ``run`` is
invoked with the full ``ToolCall`` envelope instead. The wrapper holds no storage code: it
derives the key (:mod:`.keys`) and lets the :class:`~langchain_idempotent.engine.Engine`
run the call.

What is stored is what the tool returned (its content, ``(content, artifact)``, or its
own ``ToolMessage`` / ``Command``), so a replay is formatted for the current call; a
stored ``ToolMessage`` / ``Command`` is re-stamped with the current ``tool_call_id`` and
stale message ids are dropped. Replays, waits, takeovers and lost leases are dispatched
as custom callback events named ``idempotency.<kind>`` and logged; the tool run carries
``idempotency_key`` in its metadata (visible in LangSmith).

A tool error that the tool's ``handle_tool_error`` turns into an error ``ToolMessage`` is
returned as such and not memoized, so a retry runs again.
"""

import contextlib
import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from typing import Any, overload

from langchain_core.callbacks import (
    AsyncCallbackManagerForToolRun,
    CallbackManagerForToolRun,
    adispatch_custom_event,
    dispatch_custom_event,
)
from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig, ensure_config, patch_config
from langchain_core.tools import BaseTool
from langchain_core.tools import tool as as_tool
from pydantic import ConfigDict, Field, PrivateAttr, ValidationError

from .direct import DirectCall
from .engine import Engine
from .events import EventHook, IdempotencyEvent
from .keys import DerivedKey, call_info, derive_key, model_schema
from .policy import Policy
from .stores.base import BaseIdempotencyStore

__all__ = ["IdempotentTool", "idempotent"]

#: Events worth surfacing as callback events (claims and completions are the quiet path).
_SURFACED = frozenset(
    {
        "replay",
        "wait",
        "takeover",
        "lease_lost",
        "stale_completion",
        "payload_mismatch",
        "outcome_unknown",
        "store_error",
        "fail_open",
    }
)


@dataclasses.dataclass(slots=True)
class _Pending:
    """One call between ``invoke`` (which derives the key) and ``_run`` (which runs it)."""

    derived: DerivedKey
    tool_input: Any  # the original input: a ToolCall envelope, a dict or a str
    tool_call_id: str | None
    events: list[IdempotencyEvent] = dataclasses.field(default_factory=list)
    replayed: bool = False

    def observe(self, event: IdempotencyEvent) -> None:
        if event.kind in ("replay", "stale_completion"):
            self.replayed = True
        if event.kind in _SURFACED:
            self.events.append(event)


_pending: ContextVar[_Pending | None] = ContextVar("langchain_idempotent_pending", default=None)


class _HandledToolError(BaseException):
    """The inner tool turned its error into a ToolMessage: release, don't memoize."""

    def __init__(self, message: ToolMessage) -> None:
        super().__init__(message.content)
        self.message = message


class IdempotentTool(BaseTool):
    """A tool whose calls run at most once per idempotency key. Build with :func:`idempotent`."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    inner: BaseTool
    """The wrapped tool."""
    engine: Engine = Field(exclude=True)
    """The engine (store + policy) the calls go through."""
    _runner: BaseTool = PrivateAttr()
    _direct: DirectCall | None = PrivateAttr()

    def __init__(self, inner: BaseTool, *, engine: Engine, **kwargs: Any) -> None:
        if isinstance(inner, IdempotentTool):
            raise ValueError(f"tool {inner.name!r} is already idempotent; wrap it once")
        direct = DirectCall.of(inner)
        if direct is not None:
            # This wrapper's tool run is the only one: it carries the inner tool's callbacks.
            kwargs.setdefault("callbacks", inner.callbacks)
        super().__init__(
            name=inner.name,
            description=inner.description,
            args_schema=inner.args_schema,
            return_direct=inner.return_direct,
            # Arguments that fail the schema are rejected before the engine runs; report
            # them exactly as the inner tool would (its flag, its message).
            handle_validation_error=inner.handle_validation_error,
            handle_tool_error=inner.handle_tool_error,
            response_format=inner.response_format,
            verbose=inner.verbose,
            tags=inner.tags,
            metadata=inner.metadata,
            extras=getattr(inner, "extras", None),
            inner=inner,
            engine=engine,
            **kwargs,
        )
        self._direct = direct
        # Through invoke (a tool that overrides it), the inner tool runs with its error
        # handling switched off: a ToolException then releases the key (a handled error must
        # not be memoized) and this wrapper, which copied ``handle_tool_error``, turns it
        # into the same answer the inner tool gives. (Its ``_run``, called directly, handles
        # nothing itself.)
        self._runner = (
            inner.model_copy(update={"handle_tool_error": False})
            if inner.handle_tool_error and direct is None
            else inner
        )

    # -- what the model and ToolNode see: exactly the inner tool ------------------------

    @property
    def tool_call_schema(self) -> Any:
        return model_schema(self.inner)

    @property
    def args(self) -> dict[str, Any]:
        return self.inner.args

    def get_input_schema(self, config: RunnableConfig | None = None) -> Any:
        return self.inner.get_input_schema(config)

    @property
    def _injected_args_keys(self) -> frozenset[str]:  # type: ignore[override]
        return self.inner._injected_args_keys

    @property
    def func(self) -> Callable[..., Any] | None:
        """The inner tool's function, so ToolNode finds its injected parameters."""
        return getattr(self.inner, "func", None)

    @property
    def coroutine(self) -> Callable[..., Awaitable[Any]] | None:
        return getattr(self.inner, "coroutine", None)

    @property
    def policy(self) -> Policy:
        return self.engine.policy

    def _to_args_and_kwargs(
        self, tool_input: str | dict[str, Any], tool_call_id: str | None
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Parse the input as the inner tool does (its schema, its single-input rules)."""
        return self.inner._to_args_and_kwargs(tool_input, tool_call_id)

    # -- invoke: derive the key, then let BaseTool open the tool run -----------------------

    def _derive(self, tool_input: Any, config: RunnableConfig) -> _Pending | None:
        if isinstance(tool_input, dict) and tool_input.get("type") == "tool_call":
            args, tool_call_id = tool_input.get("args", {}), tool_input.get("id")
        else:
            args, tool_call_id = tool_input, None
        try:
            info = call_info(
                tool=self.name,
                schema=self.tool_call_schema,
                tool_input=args,
                tool_call_id=tool_call_id,
                config=config,
                namespace=self.policy.namespace,
            )
        except ValidationError:
            return None  # invalid arguments: the tool reports them as it always does
        return _Pending(derive_key(info, self.policy.scope), tool_input, tool_call_id)

    def _start(self, input: Any, config: RunnableConfig | None) -> tuple[RunnableConfig, Any]:
        config = ensure_config(config)
        pending = self._derive(input, config)
        if pending is not None:
            config = patch_config(config)
            config["metadata"] = {
                **config.get("metadata", {}),
                "idempotency_key": pending.derived.key,
            }
        return config, _pending.set(pending)

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        config, token = self._start(input, config)
        try:
            return super().invoke(input, config, **kwargs)
        finally:
            _pending.reset(token)

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        config, token = self._start(input, config)
        try:
            return await super().ainvoke(input, config, **kwargs)
        finally:
            _pending.reset(token)

    # -- run: the engine around the inner tool ------------------------------------------

    def _run(
        self,
        *args: Any,
        config: RunnableConfig,
        run_manager: CallbackManagerForToolRun | None = None,
        **kwargs: Any,
    ) -> Any:
        pending = self._take_pending()
        child = (
            config
            if run_manager is None
            else patch_config(config, callbacks=run_manager.get_child())
        )

        direct = self._direct

        def action() -> Any:
            if direct is not None:
                return _checked(direct.run(args, kwargs, config=config, run_manager=run_manager))
            return self._shape(self._runner.invoke(self._envelope(pending), child))

        try:
            result = self.engine.run(
                pending.derived.key,
                fingerprint=pending.derived.fingerprint,
                action=action,
                tool=self.name,
                meta=pending.derived.meta,
                observer=pending.observe,
            )
        except _HandledToolError as handled:
            return handled.message
        finally:
            for event in pending.events:
                _dispatch(event, child)
        return _restamp(result, pending) if pending.replayed else result

    async def _arun(
        self,
        *args: Any,
        config: RunnableConfig,
        run_manager: AsyncCallbackManagerForToolRun | None = None,
        **kwargs: Any,
    ) -> Any:
        pending = self._take_pending()
        child = (
            config
            if run_manager is None
            else patch_config(config, callbacks=run_manager.get_child())
        )

        direct = self._direct

        async def action() -> Any:
            if direct is not None:
                return _checked(
                    await direct.arun(args, kwargs, config=config, run_manager=run_manager)
                )
            return self._shape(await self._runner.ainvoke(self._envelope(pending), child))

        try:
            result = await self.engine.arun(
                pending.derived.key,
                fingerprint=pending.derived.fingerprint,
                action=action,
                tool=self.name,
                meta=pending.derived.meta,
                observer=pending.observe,
            )
        except _HandledToolError as handled:
            return handled.message
        finally:
            for event in pending.events:
                await _adispatch(event, child)
        return _restamp(result, pending) if pending.replayed else result

    def _envelope(self, pending: _Pending) -> Any:
        """What the inner tool is invoked with: the caller's input, or for an artifact tool
        invoked with plain arguments a ToolCall, so the artifact is produced and stored."""
        if (
            pending.tool_call_id is None
            and self.response_format == "content_and_artifact"
            and isinstance(pending.tool_input, dict)
        ):
            call_id = "idempotency-" + pending.derived.key[:16]
            return {
                "name": self.name,
                "args": pending.tool_input,
                "id": call_id,
                "type": "tool_call",
            }
        return pending.tool_input

    def _shape(self, result: Any) -> Any:
        """An artifact tool's ToolMessage is stored as ``(content, artifact)``, so a replay
        gives every caller what BaseTool would (a message for a ToolCall, else the content)."""
        result = _checked(result)
        if self.response_format == "content_and_artifact" and isinstance(result, ToolMessage):
            return (result.content, result.artifact)
        return result

    def _take_pending(self) -> _Pending:
        pending = _pending.get()
        if pending is None:
            # Only reachable if the arguments failed our validation but not the tool's.
            raise RuntimeError(
                f"refusing to run tool {self.name!r} without an idempotency key: its "
                "arguments did not validate against its model-visible schema"
            )
        return pending


def _checked(result: Any) -> Any:
    if isinstance(result, ToolMessage) and result.status == "error":
        raise _HandledToolError(result)
    return result


def _restamp(result: Any, pending: _Pending) -> Any:
    """Point a replayed ToolMessage / Command at the current call; drop stale ids."""
    call_id = pending.tool_call_id
    if call_id is None:
        return result
    if isinstance(result, ToolMessage):
        return result.model_copy(update={"tool_call_id": call_id, "id": None})
    if isinstance(result, list) and result and all(_is_output(r) for r in result):
        return [_restamp(r, pending) for r in result]
    from langgraph.types import Command

    if isinstance(result, Command) and isinstance(result.update, dict):
        messages = result.update.get("messages")
        if isinstance(messages, list):
            update = {**result.update, "messages": [_restamp(m, pending) for m in messages]}
            return dataclasses.replace(result, update=update)
    return result


def _is_output(value: Any) -> bool:
    from langchain_core.messages.tool import ToolOutputMixin

    return isinstance(value, ToolOutputMixin)


def _event_data(event: IdempotencyEvent) -> dict[str, Any]:
    return {
        "key": event.key,
        "tool": event.tool,
        "fence": event.fence,
        "attempt": event.attempt,
        **event.detail,
    }


def _dispatch(event: IdempotencyEvent, config: RunnableConfig) -> None:
    # No parent run (a bare call without callbacks): the log line still says it.
    with contextlib.suppress(RuntimeError):
        dispatch_custom_event(f"idempotency.{event.kind}", _event_data(event), config=config)


async def _adispatch(event: IdempotencyEvent, config: RunnableConfig) -> None:
    with contextlib.suppress(RuntimeError):
        await adispatch_custom_event(f"idempotency.{event.kind}", _event_data(event), config=config)


@overload
def idempotent(
    tool_or_tools: BaseTool | Callable[..., Any],
    store: BaseIdempotencyStore | None = None,
    *,
    on_event: EventHook | None = None,
    **policy: Any,
) -> IdempotentTool: ...


@overload
def idempotent(
    tool_or_tools: Sequence[BaseTool | Callable[..., Any]],
    store: BaseIdempotencyStore | None = None,
    *,
    on_event: EventHook | None = None,
    **policy: Any,
) -> list[IdempotentTool]: ...


def idempotent(
    tool_or_tools: BaseTool | Callable[..., Any] | Sequence[BaseTool | Callable[..., Any]],
    store: BaseIdempotencyStore | None = None,
    *,
    on_event: EventHook | None = None,
    **policy: Any,
) -> IdempotentTool | list[IdempotentTool]:
    """Wrap a tool (or a list of tools) so each call runs at most once per key.

    ``store`` defaults to the one configured by ``IDEMPOTENCY_*`` environment variables
    (:class:`~langchain_idempotent.settings.IdempotencySettings`). ``policy`` takes the
    fields of :class:`~langchain_idempotent.policy.Policy` (``lease``, ``ttl``,
    ``wait_timeout``, ``on_expired``, ``fail_open``, ``terminal_exceptions``,
    ``allowed_types``, ``namespace``, ``scope``, ...); unknown names are an error.
    """
    from .settings import IdempotencySettings

    settings = IdempotencySettings()
    base = settings.policy()
    resolved = Policy.from_kwargs(base, **policy)
    if store is None:
        store = settings.store()
    engine = Engine(store, resolved, on_event=on_event)

    def wrap(t: BaseTool | Callable[..., Any]) -> IdempotentTool:
        if not isinstance(t, BaseTool):
            if not callable(t):
                raise TypeError(f"idempotent() wraps tools or functions, got {t!r}")
            t = as_tool(t)
        return IdempotentTool(t, engine=engine)

    if isinstance(tool_or_tools, BaseTool) or callable(tool_or_tools):
        return wrap(tool_or_tools)  # type: ignore[arg-type]
    return [wrap(t) for t in tool_or_tools]
