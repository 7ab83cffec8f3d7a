"""Handling one tool call, for both entry points (:mod:`.tool` and :mod:`.middleware`).

A :class:`PendingCall` is built from what a call is (tool name, model-visible schema,
input, ``tool_call_id``, config and policy): it derives the key, runs the call through
the :class:`~langchain_idempotent.core.engine.Engine` (sync or async), watches the engine's
events, points a replayed ``ToolMessage`` / ``Command`` at the current call, and
dispatches the decisions worth seeing (replay, wait, takeover, ...) as callback events
named ``idempotency.<kind>``.

A tool error that the tool (or ToolNode) already turned into an error ``ToolMessage`` is
an answer, not a result: :func:`unmemoized_if_error` marks it so the engine releases the
key and a retry runs again.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from langchain_core.callbacks import adispatch_custom_event, dispatch_custom_event
from langchain_core.messages import ToolMessage
from pydantic import ValidationError

from ..core.engine import Claimed, Engine, Unmemoized
from ..core.events import SURFACED_KINDS, EventHook, IdempotencyEvent, surfaced_only
from ..core.policy import Policy, PolicyOptions, needs_approval
from ..core.reads import (
    MAX_DIVERGENCES,
    Reads,
    ReadsDivergedError,
    answered,
    opened,
    reads_key,
    recording,
)
from ..core.store import BaseIdempotencyStore
from ..errors import MissingScopeError
from . import _identical, _siblings
from ._calling import calling
from ._compat import (
    NEVER_TERMINAL,
    NO_INJECTIONS,
    InjectedParams,
    forked_from,
    graph_state_messages,
    loud,
)
from ._reads import current_digests
from ._replay import mark_answer, restamp
from ._siblings import Sibling, StepCalls
from .keys import (
    CallInfo,
    DerivedKey,
    InjectedInputError,
    call_info,
    call_inputs,
    derive_key,
    given_state,
)

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig

__all__ = ["PendingCall", "build_engine", "restamp", "unmemoized_if_error"]


def build_engine(
    store: BaseIdempotencyStore | None,
    *,
    policy: Policy | None,
    options: PolicyOptions,
    on_event: EventHook | None,
    who: str,
) -> Engine:
    """The engine of one wrapper or middleware: ``policy`` with ``options`` on top."""
    if store is None:
        raise TypeError(
            f"{who} needs a store: pass store=SqliteIdempotencyStore('records.db') (or "
            "RedisIdempotencyStore.from_url(url), InMemoryIdempotencyStore() in tests), or "
            "store=store_from_env() to use the one IDEMPOTENCY_STORE_URL configures"
        )
    if policy is not None and not isinstance(policy, Policy):
        raise TypeError(f"policy must be a Policy, got {type(policy).__name__}")
    resolved = (policy or Policy()).with_options(**options)
    return Engine(store, resolved, on_event=on_event, never_terminal=NEVER_TERMINAL)


@dataclasses.dataclass(slots=True)
class PendingCall:
    """One call: its key, what it was called with, and what the engine reported."""

    derived: DerivedKey
    tool: str
    tool_input: Any  # the original input: a ToolCall envelope, a dict or a str
    tool_call_id: str | None
    events: list[IdempotencyEvent] = dataclasses.field(default_factory=list)
    replayed: bool = False
    #: What the key was derived from (validated arguments, thread id, ...), and the
    #: model-visible schema (to validate a reviewer's edit).
    info: CallInfo | None = None
    schema: Any = None
    #: How many identical calls precede this one in its batch (``identical_calls``).
    duplicate: int = 0
    #: The tool's injected parameters (a reviewer's edit keeps the call's inputs).
    params: InjectedParams | None = None
    #: The graph state the call is given (whole), to compare a stored answer's reads with.
    state: Any = None
    #: Paths kept out of the reads (``key_exclude``).
    exclude: tuple[str, ...] = ()

    @property
    def args(self) -> Mapping[str, Any]:
        """The validated model-visible arguments (for a reconcile hook)."""
        return {} if self.info is None else self.info.args

    @property
    def _checkpoint_ns(self) -> str:
        return "" if self.info is None else self.info.checkpoint_ns

    @property
    def thread_id(self) -> str | None:
        return None if self.info is None else self.info.thread_id

    @classmethod
    def derive(
        cls,
        *,
        tool: str,
        schema: Any,
        tool_input: Any,
        args: str | Mapping[str, Any],
        tool_call_id: str | None,
        config: RunnableConfig,
        policy: Policy,
        params: InjectedParams | None = None,
        state: Any = None,
        inputs: Mapping[str, Any] | None = None,
    ) -> PendingCall | None:
        """The call's key, or ``None`` when ``args`` do not fit ``schema`` (the tool then
        reports them as it always does). ``params`` are the tool's injected parameters,
        whose inputs enter the key (:func:`~langchain_idempotent.adapters.keys.key_inputs`; the
        graph ``state`` they are read from, when the arguments do not carry them). A
        missing scope, a whole-state tool with no ``key_state`` and an injected input with
        no canonical form are raised loud (:func:`~langchain_idempotent.adapters._compat.loud`):
        programming errors that no tool-error handling may hand to the model."""
        params = params or NO_INJECTIONS
        try:
            if inputs is None:
                inputs = call_inputs(
                    params,
                    args,
                    config,
                    state=state,
                    key_state=policy.key_state,
                    exclude=policy.key_exclude,
                )
            info = call_info(
                tool=tool,
                schema=schema,
                tool_input=args,
                tool_call_id=tool_call_id,
                config=config,
                namespace=policy.namespace,
                inputs=inputs,
                hidden=params.hidden,
                exclude=policy.key_exclude,
            )
            derived = derive_key(info, policy.scope)
        except ValidationError:
            return None
        except (MissingScopeError, InjectedInputError) as exc:
            raise loud(exc) from None
        k = 0
        if policy.identical_calls != "share" and tool_call_id is not None:
            k = _identical.position(graph_state_messages(config), tool_call_id, tool, args)
            if k and policy.identical_calls == "run":
                derived = _identical.separate(derived, f"identical:{k}")
        branch = forked_from(config) if policy.on_fork == "run" else None
        if branch is not None:  # a time-travel branch: its calls are new effects
            derived = _identical.separate(derived, f"fork:{branch}")
        pending = cls(
            derived, tool, tool_input, tool_call_id, info=info, schema=schema, params=params
        )
        pending.duplicate = k
        pending.state = state if state is not None else given_state(params, args)
        # key_state= names the state fields the effect depends on: the rest is not noted.
        pending.exclude = (*policy.key_exclude, *(() if policy.key_state is None else ["state"]))
        return pending

    def with_meta(self, meta: Mapping[str, str]) -> PendingCall:
        """This call, its record carrying ``meta`` too (an approval's decision)."""
        derived = dataclasses.replace(self.derived, meta={**self.derived.meta, **meta})
        return dataclasses.replace(self, derived=derived)

    def with_args(
        self, tool_input: Any, args: Mapping[str, Any], config: RunnableConfig, policy: Policy
    ) -> PendingCall | None:
        """The same call with other arguments (a reviewer's edit), under their own key
        and with the same injected inputs; ``None`` when they do not fit the schema."""
        return PendingCall.derive(
            tool=self.tool,
            schema=self.schema,
            tool_input=tool_input,
            args=args,
            tool_call_id=self.tool_call_id,
            config=config,
            policy=policy,
            params=self.params,
            inputs=None if self.info is None else self.info.inputs,
        )

    @surfaced_only  # claims, completions and releases change nothing here
    def observe(self, event: IdempotencyEvent) -> None:
        if event.kind in ("replay", "stale_completion") or (
            event.kind == "reconcile" and event.detail.get("outcome") == "found"
        ):
            self.replayed = True  # the answer did not come from this run of the tool
        if event.kind in SURFACED_KINDS:
            self.events.append(event)

    def sibling(self, engine: Engine) -> Sibling:
        """This call as a batch of its step sees it (:mod:`._siblings`): its claim under
        ``engine``, or none for a read-only tool or an identical call it rejects."""
        policy, derived = engine.policy, self.derived
        rejected = bool(self.duplicate) and policy.identical_calls == "reject"
        request = (
            None
            if policy.effect_class == "read" or rejected
            else engine.claim_request(derived.key, derived.fingerprint, derived.meta)
        )
        return Sibling(engine, self.tool_call_id, self.thread_id, request)

    def _engine_kwargs(self, claimed: Claimed | None) -> dict[str, Any]:
        """What :meth:`Engine.run` / :meth:`Engine.arun` are told about this call."""
        return {
            "fingerprint": self.derived.fingerprint,
            "tool": self.tool,
            "meta": self.derived.meta,
            "observer": self.observe,
            "args": self.args,
            "thread_id": self.thread_id,
            "claimed": claimed,
            "call_id": self.tool_call_id,
        }

    def _previous_kwargs(self) -> dict[str, Any] | None:
        """What the engine is told of this call under the honoured earlier key format."""
        previous = self.derived.previous
        if previous is None:
            return None
        told = self._engine_kwargs(None)
        told.update(fingerprint=previous.fingerprint, meta=previous.meta)
        return {"key": previous.key, **told}

    def _honouring(self, engine: Engine, action: Callable[[], Any]) -> Callable[[], Any]:
        """``action``, run once under the call's key in the honoured earlier format too
        (:data:`~langchain_idempotent.core.keys.HONOURED_VERSION`): a worker of the previous
        release holds or has answered that key, so an effect it ran (or is running) is
        replayed (or waited for), and one run here is seen by it. No earlier format: as is."""
        previous = self._previous_kwargs()
        if previous is None:
            return action
        return lambda: engine.run(action=action, **previous)

    def _ahonouring(
        self, engine: Engine, action: Callable[[], Awaitable[Any]]
    ) -> Callable[[], Awaitable[Any]]:
        """The async twin of :meth:`_honouring`."""
        previous = self._previous_kwargs()
        if previous is None:
            return action
        return lambda: engine.arun(action=action, **previous)

    def run(
        self,
        engine: Engine,
        action: Callable[[], Any],
        config: RunnableConfig | Callable[[], RunnableConfig] | None,
        step: StepCalls | None = None,
    ) -> Any:
        """Run ``action`` once for this call's key; dispatch events against ``config`` (or
        the config it makes, asked only when there is an event; ``None``: no callback
        handler listens, the events are only logged). The answer is stored marked (see
        :mod:`._replay`) and returned as the current call's. ``step``: the other calls of
        its model message, claimed with it (:mod:`._siblings`)."""
        if self.duplicate and engine.policy.identical_calls == "reject":
            return _identical.rejection(self.tool, self.tool_call_id, self.duplicate)
        call_id, ns = self.tool_call_id, self._checkpoint_ns
        run = _Run(self)

        def marked() -> Any:
            reads = run.start()
            with calling(run.key, ns), recording(reads):  # what the tool reads is noted
                return run.answered(mark_answer(action(), call_id))

        try:
            claimed = _siblings.take(self.sibling(engine), step) if step else None
            first = self._honouring(engine, marked)
            result = engine.run(run.key, action=first, **self._engine_kwargs(claimed))
            while (diverged := run.diverged(result, engine)) is not None:
                result = engine.run(diverged, action=marked, **self._engine_kwargs(None))
            result = run.value
        except InjectedInputError as exc:  # a value the tool read has no canonical form
            raise loud(exc) from None
        finally:
            for event in self.events if config is not None else ():
                # No parent run (a bare call without callbacks): the log line still says it.
                with contextlib.suppress(RuntimeError):
                    dispatch_custom_event(
                        _event_name(event), _event_data(event), config=_made(config)
                    )
        return restamp(result, call_id, replayed=self.replayed)

    async def arun(
        self,
        engine: Engine,
        action: Callable[[], Awaitable[Any]],
        config: RunnableConfig | Callable[[], RunnableConfig] | None,
        step: StepCalls | None = None,
    ) -> Any:
        """The async twin of :meth:`run`."""
        if self.duplicate and engine.policy.identical_calls == "reject":
            return _identical.rejection(self.tool, self.tool_call_id, self.duplicate)
        call_id, ns = self.tool_call_id, self._checkpoint_ns
        run = _Run(self)

        async def marked() -> Any:
            reads = run.start()
            with calling(run.key, ns), recording(reads):
                return run.answered(mark_answer(await action(), call_id))

        try:
            claimed = await _siblings.atake(self.sibling(engine), step) if step else None
            first = self._ahonouring(engine, marked)
            result = await engine.arun(run.key, action=first, **self._engine_kwargs(claimed))
            while (diverged := run.diverged(result, engine)) is not None:
                result = await engine.arun(diverged, action=marked, **self._engine_kwargs(None))
            result = run.value
        except InjectedInputError as exc:
            raise loud(exc) from None
        finally:
            for event in self.events if config is not None else ():
                with contextlib.suppress(RuntimeError):
                    await adispatch_custom_event(
                        _event_name(event), _event_data(event), config=_made(config)
                    )
        return restamp(result, call_id, replayed=self.replayed)


class _Run:
    """One call's runs through the engine: the reads of each run of its tool, and the
    key it moves to when a stored answer's reads differ from what it would read
    (:mod:`langchain_idempotent.core.reads`)."""

    __slots__ = ("call", "key", "mine", "tries", "value")

    def __init__(self, call: PendingCall) -> None:
        self.call = call
        self.key = call.derived.key
        self.mine: Reads | None = None  # the reads of this call's own run of the tool
        self.tries = 0
        self.value: Any = None

    def start(self) -> Reads:
        self.mine = Reads(self.call.tool, self.call.exclude)
        return self.mine

    def answered(self, result: Any) -> Any:
        """``result`` as it is stored: with the run's reads (not an unmemoized one)."""
        if isinstance(result, Unmemoized):
            return result
        return answered(result, self.mine)

    def diverged(self, result: Any, engine: Engine) -> str | None:
        """The key to run under next when ``result`` (the engine's answer) was stored by a
        call whose reads differ from this one's; ``None`` when it is this call's answer.
        Under approval such a call is refused: its approval was asked for the stored call's
        key, so running it under another key would be an effect nobody approved."""
        self.value, stored = opened(result)
        if not stored or (self.mine is not None and self.mine.seen == stored):
            return None
        call = self.call
        config = call.info.config if call.info is not None else {}
        current = current_digests(stored, config, call.state)
        if current == stored:
            return None
        if call.info is not None and needs_approval(engine.policy.approval, call.info):
            raise ReadsDivergedError(
                f"tool {call.tool!r}: this call reads other values ({', '.join(sorted(stored))}) "
                "than the approved call stored under its key, so it is another effect that "
                "nobody approved; it is not run. Give the values it depends on as arguments, "
                "or a key function, so each gets its own approval",
                key=self.key,
            )
        self.tries += 1
        if self.tries > MAX_DIVERGENCES:
            raise ReadsDivergedError(
                f"tool {call.tool!r}: {self.tries} stored answers in a row read other values "
                "than this call would; giving up",
                key=self.key,
            )
        self.key = reads_key(self.key, current)
        self.mine = None
        call.replayed = False
        return self.key


#: The error type an abandon names for a tool error handled into an error ``ToolMessage``
#: (the exception itself is gone by then).
HANDLED_TOOL_ERROR = "langchain_core.messages.ToolMessage[status=error]"


def unmemoized_if_error(result: Any) -> Any:
    """An error ``ToolMessage`` (a handled tool error) is returned but never stored."""
    if isinstance(result, ToolMessage) and result.status == "error":
        return Unmemoized(result, error=HANDLED_TOOL_ERROR)
    return result


def _made(config: RunnableConfig | Callable[[], RunnableConfig] | None) -> RunnableConfig:
    assert config is not None
    return config() if callable(config) else config


def _event_name(event: IdempotencyEvent) -> str:
    return f"idempotency.{event.kind}"


def _event_data(event: IdempotencyEvent) -> dict[str, Any]:
    return {
        "key": event.key,
        "tool": event.tool,
        "fence": event.fence,
        "attempt": event.attempt,
        **event.detail,
    }
