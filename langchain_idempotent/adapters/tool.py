"""``IdempotentTool``: any LangChain tool, run at most once per idempotency key.

The wrapper is a :class:`~langchain_core.tools.BaseTool` that shows the model exactly the
inner tool (name, description, ``args_schema``, ``tool_call_schema``) and parses a call's
arguments as the inner tool does (``InjectedState``, ``InjectedStore``,
``InjectedToolCallId`` and ``ToolRuntime`` pass through). Its own tool run is the one in
the trace: it calls the inner tool's ``_run`` / ``_arun`` directly (:mod:`._compat`), and
LangChain formats the result (``ToolMessage``, ``content_and_artifact``) and handles errors
as the inner tool is configured to. A tool whose class overrides ``invoke`` or ``run`` is
invoked with the full ``ToolCall`` envelope instead. The wrapper holds no storage code: it
hands the call to :mod:`._call` (shared with the middleware), which derives the key and
lets the :class:`~langchain_idempotent.core.engine.Engine` run it.

What is stored is what the tool returned (its content, ``(content, artifact)``, or its
own ``ToolMessage`` / ``Command``), so a replay is formatted for the current call; a
stored ``ToolMessage`` / ``Command`` is re-stamped with the current ``tool_call_id`` and
stale message ids are dropped. Replays, waits, takeovers and lost leases are dispatched
as custom callback events named ``idempotency.<kind>`` and logged; the tool run carries
``idempotency_key`` in its metadata (visible in LangSmith).

A tool error that the tool's ``handle_tool_error`` turns into an error ``ToolMessage`` is
returned as such and not memoized, so a retry runs again.
"""

from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Unpack, overload

from langchain_core.callbacks import AsyncCallbackManagerForToolRun, CallbackManagerForToolRun
from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig, ensure_config, patch_config
from langchain_core.tools import BaseTool
from pydantic import (
    ConfigDict,
    Field,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    model_serializer,
)

from ..core.engine import Engine
from ..core.events import EventHook
from ..core.policy import Policy, PolicyOptions
from ..core.reads import current_reads
from ..core.store import BaseIdempotencyStore
from ._asking import Steps
from ._call import PendingCall, build_engine, unmemoized_if_error
from ._calling import calling_tools_tracker, watch_calling_tools
from ._compat import (
    DirectCall,
    InjectedParams,
    graph_state_messages,
    injected_args_keys,
    injected_params,
    prep_run_args,
    to_args_and_kwargs,
)
from ._functions import FunctionCall, tool_from_function
from ._handoff import Handoff, check_handoff, is_handoff, stored_handoff
from ._hints import engine_for
from ._opening import Opening, aopen_call, open_call, opening
from ._reads import config_context, handed, view_config
from ._replay import direct_call_id
from ._siblings import Sibling, StepCalls, step_calls
from .keys import by_field_name, model_schema

__all__ = ["IdempotentFunction", "IdempotentTool", "idempotent"]

#: The call between ``invoke`` (which derives the key) and ``_run`` (which runs it):
#: ``BaseTool.run`` does not pass the original input on.
_pending: ContextVar[PendingCall | None] = ContextVar("langchain_idempotent_pending", default=None)


class IdempotentTool(BaseTool):
    """A tool whose calls run at most once per idempotency key. Build with :func:`idempotent`."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    inner: BaseTool
    """The wrapped tool."""
    engine: Engine = Field(exclude=True)
    """The engine (store + policy) the calls go through."""
    if TYPE_CHECKING:
        # Fixed per tool and read on every call: plain instance attributes (set in
        # ``__init__``), not pydantic private ones, whose every read is a Python-level
        # ``__getattr__`` (about a microsecond each).
        _runner: BaseTool
        _direct: DirectCall | None
        _handoff: Handoff | None
        _peers: dict[str, "IdempotentTool"]
        _params: InjectedParams
        _schema: tuple[Any, Any] | None

    def __init__(
        self, inner: BaseTool, *, engine: Engine, handoff: Handoff | None = None, **kwargs: Any
    ) -> None:
        if isinstance(inner, IdempotentTool):
            raise ValueError(f"tool {inner.name!r} is already idempotent; wrap it once")
        handoff = check_handoff(inner, handoff)  # a handoff given none: "rerun"
        watch_calling_tools()  # a sub-agent run from an unwrapped tool knows its caller
        params = injected_params(inner)
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
        self._handoff = handoff
        self._params = params
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
        # The tools of this one's step whose calls a batch may claim with its own: the
        # list it was wrapped in (:func:`idempotent`), else itself.
        self._peers = {self.name: self}
        self._schema = None

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
        return injected_args_keys(self.inner)

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

    @model_serializer(mode="wrap")
    def _dump_as_inner(
        self, handler: SerializerFunctionWrapHandler, info: SerializationInfo
    ) -> Any:
        """Dumped as the inner tool is (``model_dump(mode="json")`` included: its JSON
        forms of ``func`` and ``args_schema``); the engine and its store are not data."""
        return self.inner.model_dump(
            mode=info.mode,
            include=info.include,  # type: ignore[arg-type]
            exclude=info.exclude,  # type: ignore[arg-type]
            by_alias=bool(info.by_alias),
            exclude_unset=info.exclude_unset,
            exclude_defaults=info.exclude_defaults,
            exclude_none=info.exclude_none,
            round_trip=info.round_trip,
        )

    def _to_args_and_kwargs(
        self, tool_input: str | dict[str, Any], tool_call_id: str | None
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Parse the input as the inner tool does (its schema, its single-input rules)."""
        return to_args_and_kwargs(self.inner, tool_input, tool_call_id)

    def _call_schema(self) -> Any:
        """:attr:`tool_call_schema` as each call's key reads it: made again only when the
        inner tool's ``args_schema`` is another object (LangChain builds it anew on every
        read) or its class computes the schema itself."""
        inner = self.inner
        if type(inner).tool_call_schema is not BaseTool.tool_call_schema:
            return model_schema(inner)
        basis = inner.args_schema
        made = self._schema
        if made is None or made[0] is not basis:
            made = self._schema = (basis, model_schema(inner))
        return made[1]

    # -- invoke: derive the key, then let BaseTool open the tool run -----------------------

    def _derive(
        self, tool_input: Any, config: RunnableConfig, tool_call_id: str | None = None
    ) -> PendingCall | None:
        if isinstance(tool_input, dict) and tool_input.get("type") == "tool_call":
            args, tool_call_id = tool_input.get("args", {}), tool_input.get("id")
        else:
            args = tool_input
            tool_call_id = tool_call_id or direct_call_id(self.inner, tool_input)
        args = by_field_name(self.inner.args_schema, args)
        return PendingCall.derive(
            tool=self.name,
            schema=self._call_schema(),
            tool_input=tool_input,
            args=args,
            tool_call_id=tool_call_id,
            config=config,
            policy=self.engine.policy,
            params=self._params,
        )

    def _opening(
        self, tool_input: Any, config: RunnableConfig, tool_call_id: str | None = None
    ) -> Opening | Steps:
        """The call's opening (:mod:`._opening`): as it is, rejected, or under its key."""
        return opening(
            self.engine,
            lambda: self._handoff,
            lambda: self._derive(tool_input, config, tool_call_id),
            config,
            tool_input,
        )

    # BaseTool.invoke is prep_run_args, then run: done here in two, so the key is derived
    # from the config BaseTool's run gets and a call ensures its config once (a copy of
    # every part of it, the costliest step of an invoke after the tool itself).

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        tool_input, run_kwargs = prep_run_args(input, config, **kwargs)
        opened = open_call(self._opening(input, run_kwargs["config"]), self.engine.store)
        if opened.as_is:
            with opened.untouched(self.name):
                return self.inner.invoke(input, config, **kwargs)
        if opened.rejection is not None:
            return self._rejected(opened)
        if opened.tool_input is not input:  # a reviewer's edit: the tool runs with it
            tool_input, run_kwargs = prep_run_args(opened.tool_input, config, **kwargs)
        token = _pending.set(opened.pending)
        try:
            return self.run(tool_input, **_keyed(run_kwargs, opened.pending))
        finally:
            _pending.reset(token)

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        tool_input, run_kwargs = prep_run_args(input, config, **kwargs)
        opened = await aopen_call(self._opening(input, run_kwargs["config"]), self.engine.store)
        if opened.as_is:
            with opened.untouched(self.name):
                return await self.inner.ainvoke(input, config, **kwargs)
        if opened.rejection is not None:
            return self._rejected(opened)
        if opened.tool_input is not input:
            tool_input, run_kwargs = prep_run_args(opened.tool_input, config, **kwargs)
        token = _pending.set(opened.pending)
        try:
            return await self.arun(tool_input, **_keyed(run_kwargs, opened.pending))
        finally:
            _pending.reset(token)

    # -- run / arun called directly (legacy executors, user code): the same key ----------

    def _run_opening(self, tool_input: Any, kwargs: dict[str, Any]) -> Opening | Steps:
        """The opening of a direct ``run`` call (its ``config``, metadata, call id)."""
        config = ensure_config(kwargs.get("config"))
        if kwargs.get("metadata"):
            config["metadata"] = {**config.get("metadata", {}), **kwargs["metadata"]}
        return self._opening(tool_input, config, kwargs.get("tool_call_id"))

    @staticmethod
    def _run_kwargs(kwargs: dict[str, Any], pending: PendingCall | None) -> dict[str, Any]:
        if pending is None:
            return kwargs
        metadata = {**(kwargs.get("metadata") or {}), "idempotency_key": pending.derived.key}
        return {**kwargs, "metadata": metadata}

    def run(self, tool_input: Any, *args: Any, **kwargs: Any) -> Any:
        if _pending.get() is not None:  # from invoke: the call is opened
            return super().run(tool_input, *args, **kwargs)
        opened = open_call(self._run_opening(tool_input, kwargs), self.engine.store)
        if opened.as_is:
            with opened.untouched(self.name):
                return self.inner.run(tool_input, *args, **kwargs)
        if opened.rejection is not None:
            return self._rejected(opened)
        token = _pending.set(opened.pending)
        try:
            return super().run(opened.tool_input, *args, **self._run_kwargs(kwargs, opened.pending))
        finally:
            _pending.reset(token)

    async def arun(self, tool_input: Any, *args: Any, **kwargs: Any) -> Any:
        if _pending.get() is not None:
            return await super().arun(tool_input, *args, **kwargs)
        opened = await aopen_call(self._run_opening(tool_input, kwargs), self.engine.store)
        if opened.as_is:
            with opened.untouched(self.name):
                return await self.inner.arun(tool_input, *args, **kwargs)
        if opened.rejection is not None:
            return self._rejected(opened)
        token = _pending.set(opened.pending)
        try:
            run_kwargs = self._run_kwargs(kwargs, opened.pending)
            return await super().arun(opened.tool_input, *args, **run_kwargs)
        finally:
            _pending.reset(token)

    @staticmethod
    def _rejected(opened: Opening) -> Any:
        """A rejected call's answer: the error ToolMessage for a ToolCall, else its text."""
        message, pending = opened.rejection, opened.pending
        assert message is not None and pending is not None
        return message if pending.tool_call_id is not None else message.content

    # -- run: the engine around the inner tool ------------------------------------------

    def _run(
        self,
        *args: Any,
        config: RunnableConfig,
        run_manager: CallbackManagerForToolRun | None = None,
        **kwargs: Any,
    ) -> Any:
        pending = self._take_pending()
        child = _child_config(config, run_manager)
        direct = self._direct

        def action() -> Any:
            seen, given, envelope = self._handed(config, kwargs, pending)
            with config_context(current_reads()):  # get_config() / get_runtime(): noted
                if direct is not None:
                    result = direct.run(args, given, config=seen, run_manager=run_manager)
                    return self._kept(unmemoized_if_error(result), pending)
                result = self._runner.invoke(envelope, self._seen_child(child(), seen))
                return self._kept(self._shape(result), pending)

        events = child if _listened(run_manager) else None
        return pending.run(self.engine, action, events, self._step(pending, config))

    async def _arun(
        self,
        *args: Any,
        config: RunnableConfig,
        run_manager: AsyncCallbackManagerForToolRun | None = None,
        **kwargs: Any,
    ) -> Any:
        pending = self._take_pending()
        child = _child_config(config, run_manager)
        direct = self._direct

        async def action() -> Any:
            seen, given, envelope = self._handed(config, kwargs, pending)
            with config_context(current_reads()):
                if direct is not None:
                    result = await direct.arun(args, given, config=seen, run_manager=run_manager)
                    return self._kept(unmemoized_if_error(result), pending)
                result = await self._runner.ainvoke(envelope, self._seen_child(child(), seen))
                return self._kept(self._shape(result), pending)

        events = child if _listened(run_manager) else None
        return await pending.arun(self.engine, action, events, self._step(pending, config))

    def _handed(
        self, config: RunnableConfig, kwargs: dict[str, Any], pending: PendingCall
    ) -> tuple[RunnableConfig, dict[str, Any], Any]:
        """What the tool is handed, as views that note what it reads (:mod:`._reads`):
        the config, its injected arguments and (through ``invoke``) its envelope (``None``
        for a tool whose ``_run`` is called directly, which takes no envelope)."""
        reads = current_reads()
        direct = self._direct
        envelope = self._envelope(pending) if direct is None else None
        if reads is None:
            return config, kwargs, envelope
        given = handed(kwargs, self._params, reads) or kwargs
        if isinstance(envelope, dict):
            call = envelope.get("type") == "tool_call"
            args = envelope.get("args") if call else envelope
            viewed = handed(args, self._params, reads) if isinstance(args, dict) else None
            if viewed is not None:
                envelope = {**envelope, "args": viewed} if call else viewed
        seen = view_config(config, reads) if direct is None or direct.hands_config else config
        return seen, given, envelope

    @staticmethod
    def _seen_child(child: RunnableConfig, seen: RunnableConfig) -> RunnableConfig:
        """The child config (its callbacks) with the noting ``configurable`` of ``seen``."""
        if child is seen or not isinstance(seen, dict):
            return child
        return {**child, "configurable": seen["configurable"]}  # type: ignore[typeddict-item]

    def _step(self, pending: PendingCall, config: RunnableConfig) -> StepCalls | None:
        """The other calls of this call's model message in the graph state, to claim with
        it in one round trip: those of the tools wrapped with it (:mod:`._siblings`)."""
        if pending.tool_call_id is None or self.engine.policy.approval:
            return None
        peers = self._peers

        def siblings(calls: list[dict[str, Any]]) -> list[Sibling]:
            out = []
            for call in calls:
                tool = peers.get(call.get("name", ""))
                if call.get("id") == pending.tool_call_id or tool is None:
                    continue
                derived = tool._derive({**call, "type": "tool_call"}, config)
                if derived is not None:
                    out.append(derived.sibling(tool.engine))
            return out

        return step_calls(graph_state_messages(config), pending.tool_call_id, siblings)

    def _kept(self, result: Any, pending: PendingCall) -> Any:
        """A handoff's Command that carries a copy of the state is not stored."""
        if self._handoff != "replay":
            return result
        return stored_handoff(result, self.name, pending.tool_call_id)

    def _envelope(self, pending: PendingCall) -> Any:
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
        result = unmemoized_if_error(result)
        if self.response_format == "content_and_artifact" and isinstance(result, ToolMessage):
            return (result.content, result.artifact)
        return result

    def _take_pending(self) -> PendingCall:
        pending = _pending.get()
        # Taken once: a tool this run calls directly (``other.run(...)``) derives its own.
        # (BaseTool runs ``_run`` in a copy of the context, so the caller's is untouched.)
        _pending.set(None)
        if pending is None:
            # Only reachable if the arguments failed our validation but not the tool's.
            raise RuntimeError(
                f"refusing to run tool {self.name!r} without an idempotency key: its "
                "arguments did not validate against its model-visible schema"
            )
        return pending


def _keyed(run_kwargs: dict[str, Any], pending: PendingCall | None) -> dict[str, Any]:
    """``BaseTool.run``'s keyword arguments (:func:`prep_run_args`) with the call's key in
    the tool run's metadata, its config's too (shallow copies: no second
    ``ensure_config``)."""
    if pending is None:
        return run_kwargs
    metadata = {**(run_kwargs["metadata"] or {}), "idempotency_key": pending.derived.key}
    config = {**run_kwargs["config"], "metadata": metadata}
    return {**run_kwargs, "metadata": metadata, "config": config}


def _listened(
    run_manager: CallbackManagerForToolRun | AsyncCallbackManagerForToolRun | None,
) -> bool:
    """Whether a callback event dispatched in this tool run reaches any handler: not when
    its manager (configured with the environment's tracers) has none to pass it to but
    the library's own tracker of calling tools, which ignores custom events."""
    if run_manager is None:
        return True
    tracker = calling_tools_tracker()
    for handlers in (run_manager.handlers, run_manager.inheritable_handlers):
        for handler in handlers:
            if handler is not tracker:
                return True
    return False


def _child_config(
    config: RunnableConfig,
    run_manager: CallbackManagerForToolRun | AsyncCallbackManagerForToolRun | None,
) -> Callable[[], RunnableConfig]:
    """The config of what runs inside this tool run (the inner tool invoked, the events
    dispatched), made on first use: a call that dispatches nothing and runs the inner
    tool's ``_run`` directly opens no child callback manager."""

    made: list[RunnableConfig] = []  # a plain memo: ``functools.cache`` costs more to make

    def child() -> RunnableConfig:
        if run_manager is None:
            return config
        if not made:
            made.append(patch_config(config, callbacks=run_manager.get_child()))
        return made[0]

    return child


class IdempotentFunction(IdempotentTool):
    """An :class:`IdempotentTool` made from a plain function, and still callable as it.

    ``refund("INV-7", amount=140)`` called from a graph node runs at most once per key, as
    a tool call does: the key is derived from the config LangGraph runs the node with (its
    thread, graph path and node), this tool's name and the arguments. Outside a graph it
    needs a scope as ``invoke`` does (``idempotency_scope(...)``, else
    ``MissingScopeError``). A ``RunnableConfig`` argument passed by the caller is the run's
    config; the arguments are validated through the tool's schema. Calling the wrapper of
    an ``async def`` returns an awaitable.
    """

    if TYPE_CHECKING:
        _call: FunctionCall

    def __init__(self, inner: BaseTool, **kwargs: Any) -> None:
        super().__init__(inner, **kwargs)
        fn = self.func or self.coroutine
        assert fn is not None  # built by tool_from_function
        self._call = FunctionCall.of(fn, self.name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        tool_input, config = self._call.tool_input(args, kwargs)
        if self.func is None:  # an async def: an awaitable, as calling it gives
            return self.ainvoke(tool_input, config)
        return self.invoke(tool_input, config)


#: What ``idempotent(store=...)`` returns: a decorator, on a function or above ``@tool``.
_Decorator = Callable[[BaseTool | Callable[..., Any]], IdempotentTool]


@overload
def idempotent(
    tool_or_tools: BaseTool | Callable[..., Any],
    store: BaseIdempotencyStore,
    *,
    policy: Policy | None = None,
    on_event: EventHook | None = None,
    handoff: Handoff | None = None,
    **options: Unpack[PolicyOptions],
) -> IdempotentTool: ...


@overload
def idempotent(
    tool_or_tools: Sequence[BaseTool | Callable[..., Any]],
    store: BaseIdempotencyStore,
    *,
    policy: Policy | None = None,
    on_event: EventHook | None = None,
    handoff: Handoff | None = None,
    **options: Unpack[PolicyOptions],
) -> list[IdempotentTool]: ...


@overload
def idempotent(
    *,
    store: BaseIdempotencyStore,
    policy: Policy | None = None,
    on_event: EventHook | None = None,
    handoff: Handoff | None = None,
    **options: Unpack[PolicyOptions],
) -> _Decorator: ...


def idempotent(
    tool_or_tools: BaseTool
    | Callable[..., Any]
    | Sequence[BaseTool | Callable[..., Any]]
    | None = None,
    store: BaseIdempotencyStore | None = None,
    *,
    policy: Policy | None = None,
    on_event: EventHook | None = None,
    handoff: Handoff | None = None,
    **options: Unpack[PolicyOptions],
) -> IdempotentTool | list[IdempotentTool] | _Decorator:
    """Wrap a tool (or a list of tools) so each call runs at most once per key.

    ``store`` is required: where leases and results live
    (``SqliteIdempotencyStore("records.db")``, ``RedisIdempotencyStore.from_url(url)``,
    ``InMemoryIdempotencyStore()`` in tests, or ``store_from_env()`` for the one the
    ``IDEMPOTENCY_*`` variables configure). ``policy`` is a whole
    :class:`~langchain_idempotent.core.policy.Policy` (e.g. ``Policy.from_env()``); the keyword
    ``options`` are its fields (``lease``, ``ttl``, ``wait_timeout``, ``on_expired``,
    ``fail_open``, ``terminal_exceptions``, ``allowed_types``, ``namespace``, ``scope``,
    ``approval``, ``reconcile``, ...) and win over ``policy``; an unknown name is a
    ``TypeError``. Nothing is read from the environment here.

    A plain function becomes the tool ``model.bind_tools([fn])`` describes (its Google
    docstring's summary and ``Args:``; see :mod:`langchain_idempotent.adapters._functions`)
    and stays callable as the function (:class:`IdempotentFunction`). Without a tool,
    ``idempotent(store=..., **options)`` is a decorator, above ``@tool`` or on a function.

    ``approval=True`` (or a predicate of the call, e.g. ``lambda call:
    call.args["amount"] > 500``) asks a human through LangGraph's ``interrupt()`` before
    each new effect, once per key, in the format ``interrupt_mode`` names (``"batched"``
    or ``"per_call"``; see :mod:`langchain_idempotent.adapters.approval`).
    ``reconcile=fn`` is asked on every takeover of a call whose outcome is unknown (see
    :mod:`langchain_idempotent.core.reconcile`).

    A tool that reads the graph state and returns a ``Command`` (a handoff; deepagents'
    ``task``) runs on every call, with no record (``handoff="rerun"``, the default), unless
    ``handoff="replay"`` (memoize a Command that carries only its own answer) says
    otherwise (see :mod:`langchain_idempotent.adapters._handoff`).
    """
    if isinstance(tool_or_tools, BaseIdempotencyStore):
        raise TypeError(
            "idempotent() got a store where the tool goes: as a decorator, pass the store "
            "by keyword, @idempotent(store=...)"
        )
    engine = build_engine(
        store, policy=policy, options=options, on_event=on_event, who="idempotent()"
    )
    if tool_or_tools is None:
        return lambda t: _wrap_all(t, engine, handoff)  # type: ignore[return-value]
    return _wrap_all(tool_or_tools, engine, handoff)


def _wrap_all(
    tool_or_tools: BaseTool | Callable[..., Any] | Sequence[BaseTool | Callable[..., Any]],
    engine: Engine,
    handoff: Handoff | None,
) -> IdempotentTool | list[IdempotentTool]:
    single = isinstance(tool_or_tools, BaseTool) or callable(tool_or_tools)

    def wrap(t: BaseTool | Callable[..., Any], handoff: Handoff | None) -> IdempotentTool:
        kind = IdempotentTool
        if not isinstance(t, BaseTool):
            if not callable(t):
                raise TypeError(f"idempotent() wraps tools or functions, got {t!r}")
            t, kind = tool_from_function(t), IdempotentFunction
        if not single and not is_handoff(t):
            handoff = None
        return kind(t, engine=engine_for(engine, t), handoff=handoff)

    if isinstance(tool_or_tools, BaseTool) or callable(tool_or_tools):
        return wrap(tool_or_tools, handoff)  # type: ignore[arg-type]
    # In a list, handoff= is for the handoffs in it: every other tool stays memoized.
    wrapped = [wrap(t, handoff) for t in tool_or_tools]
    # The list is a step's tools (a ToolNode's): a batch claims their calls together. A
    # name given twice is left to claim on its own.
    names = [t.name for t in wrapped]
    peers = {t.name: t for t in wrapped if names.count(t.name) == 1}
    for t in wrapped:
        t._peers = peers if t.name in peers else {t.name: t}
    return wrapped
