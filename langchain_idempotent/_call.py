"""Handling one tool call, for both entry points (:mod:`.tool` and :mod:`.middleware`).

A :class:`PendingCall` is built from what a call is (tool name, model-visible schema,
input, ``tool_call_id``, config and policy): it derives the key, runs the call through
the :class:`~langchain_idempotent.engine.Engine` (sync or async), watches the engine's
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
from langchain_core.messages.tool import ToolOutputMixin
from pydantic import ValidationError

from . import _asking, _batch
from . import approval as _approval
from ._compat import NEVER_TERMINAL, forked_from, graph_state_messages, loud
from .engine import Engine, Unmemoized
from .errors import MissingScopeError
from .events import SURFACED_KINDS, EventHook, IdempotencyEvent
from .keys import CallInfo, DerivedKey, call_info, derive_key, visible_arguments
from .policy import Policy, PolicyOptions
from .stores.base import BaseIdempotencyStore

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig

__all__ = [
    "PendingCall",
    "Verdict",
    "adecide",
    "build_engine",
    "decide",
    "restamp",
    "unmemoized_if_error",
]


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

    @property
    def args(self) -> Mapping[str, Any]:
        """The validated model-visible arguments (for a reconcile hook)."""
        return {} if self.info is None else self.info.args

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
    ) -> PendingCall | None:
        """The call's key, or ``None`` when ``args`` do not fit ``schema`` (the tool then
        reports them as it always does). A missing scope is raised as
        :class:`~langchain_idempotent._compat.GraphMissingScopeError`: a programming
        error that no tool-error handling may hand to the model."""
        try:
            info = call_info(
                tool=tool,
                schema=schema,
                tool_input=args,
                tool_call_id=tool_call_id,
                config=config,
                namespace=policy.namespace,
            )
            derived = derive_key(info, policy.scope)
        except ValidationError:
            return None
        except MissingScopeError as exc:
            raise loud(exc) from None
        k = 0
        if policy.identical_calls != "share" and tool_call_id is not None:
            k = _batch.position(graph_state_messages(config), tool_call_id, tool, args)
            if k and policy.identical_calls == "run":
                derived = _batch.separate(derived, f"identical:{k}")
        branch = forked_from(config) if policy.on_fork == "run" else None
        if branch is not None:  # a time-travel branch: its calls are new effects
            derived = _batch.separate(derived, f"fork:{branch}")
        pending = cls(derived, tool, tool_input, tool_call_id, info=info, schema=schema)
        pending.duplicate = k
        return pending

    def observe(self, event: IdempotencyEvent) -> None:
        if event.kind in ("replay", "stale_completion") or (
            event.kind == "reconcile" and event.detail.get("outcome") == "found"
        ):
            self.replayed = True  # the answer did not come from this run of the tool
        if event.kind in SURFACED_KINDS:
            self.events.append(event)

    def run(self, engine: Engine, action: Callable[[], Any], config: RunnableConfig) -> Any:
        """Run ``action`` once for this call's key; dispatch events against ``config``."""
        if self.duplicate and engine.policy.identical_calls == "reject":
            return _batch.rejection(self.tool, self.tool_call_id, self.duplicate)
        try:
            result = engine.run(
                self.derived.key,
                fingerprint=self.derived.fingerprint,
                action=action,
                tool=self.tool,
                meta=self.derived.meta,
                observer=self.observe,
                args=self.args,
                thread_id=self.thread_id,
            )
        finally:
            for event in self.events:
                # No parent run (a bare call without callbacks): the log line still says it.
                with contextlib.suppress(RuntimeError):
                    dispatch_custom_event(_event_name(event), _event_data(event), config=config)
        return restamp(result, self.tool_call_id) if self.replayed else result

    async def arun(
        self, engine: Engine, action: Callable[[], Awaitable[Any]], config: RunnableConfig
    ) -> Any:
        """The async twin of :meth:`run`."""
        if self.duplicate and engine.policy.identical_calls == "reject":
            return _batch.rejection(self.tool, self.tool_call_id, self.duplicate)
        try:
            result = await engine.arun(
                self.derived.key,
                fingerprint=self.derived.fingerprint,
                action=action,
                tool=self.tool,
                meta=self.derived.meta,
                observer=self.observe,
                args=self.args,
                thread_id=self.thread_id,
            )
        finally:
            for event in self.events:
                with contextlib.suppress(RuntimeError):
                    await adispatch_custom_event(
                        _event_name(event), _event_data(event), config=config
                    )
        return restamp(result, self.tool_call_id) if self.replayed else result


# -- human approval (see :mod:`.approval`) -------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """What approval decided for a call: run ``pending`` (with ``tool_input``, edited when
    the reviewer edited it), or answer with ``rejection`` and run nothing."""

    pending: PendingCall
    tool_input: Any
    edited: Mapping[str, Any] | None = None
    rejection: ToolMessage | None = None


def _question(pending: PendingCall, engine: Engine) -> CallInfo | None:
    """The call's info when it must be decided by a human (before any store read)."""
    info = pending.info
    if info is None or not _approval.needs_approval(engine.policy.approval, info):
        return None
    return info


def _ask(
    pending: PendingCall, info: CallInfo, engine: Engine, config: RunnableConfig
) -> _approval.Decision:
    """Interrupt the graph with the HITL request; the reviewer's decision on resume. The
    answer is bound to this call's key, not to its position (see :mod:`._asking`)."""
    store, options = engine.store, _decision_options(pending, engine)
    answer = _asking.ask(
        config,
        **_asking_call(pending, info),
        record=lambda qkey, key: _approval.store_question(store, qkey, key, **options),
        lookup=lambda qkey: _approval.asked_about(store.get(qkey)),
    )
    return _checked(pending, _approval.parse_decision(answer, pending.tool))


async def _aask(
    pending: PendingCall, info: CallInfo, engine: Engine, config: RunnableConfig
) -> _approval.Decision:
    """The async twin of :func:`_ask`."""
    store, options = engine.store, _decision_options(pending, engine)

    async def record(qkey: str, key: str) -> None:
        await _approval.astore_question(store, qkey, key, **options)

    async def lookup(qkey: str) -> str | None:
        return _approval.asked_about(await store.aget(qkey))

    answer = await _asking.aask(config, **_asking_call(pending, info), record=record, lookup=lookup)
    return _checked(pending, _approval.parse_decision(answer, pending.tool))


def _asking_call(pending: PendingCall, info: CallInfo) -> dict[str, Any]:
    key = pending.derived.key
    return {
        "key": key,
        "thread_id": info.thread_id or "",
        "tool": pending.tool,
        "request": _approval.approval_request(info, key),
    }


def _checked(pending: PendingCall, decision: _approval.Decision) -> _approval.Decision:
    """An edit whose arguments do not fit the tool's schema is refused."""
    if decision.type == "edit":
        try:
            visible_arguments(pending.schema, decision.args or {})
        except ValidationError as exc:
            raise ValueError(
                f"the reviewer's edit of tool {pending.tool!r} does not fit its arguments: "
                f"{exc.errors()[0]['msg']} ({decision.args!r}); nothing ran"
            ) from None
    return decision


def _verdict(
    pending: PendingCall, decision: _approval.Decision, config: RunnableConfig, policy: Policy
) -> Verdict:
    meta = decision.meta()
    if decision.type == "reject":
        message = _approval.rejection_message(pending.tool, pending.tool_call_id, decision)
        return Verdict(pending, pending.tool_input, rejection=message)
    if decision.type == "approve":
        derived = dataclasses.replace(pending.derived, meta={**pending.derived.meta, **meta})
        return Verdict(dataclasses.replace(pending, derived=derived), pending.tool_input)
    args = dict(decision.args or {})
    original = pending.tool_input
    tool_input = (
        {**original, "args": args}
        if isinstance(original, Mapping) and original.get("type") == "tool_call"
        else args
    )
    edited = PendingCall.derive(
        tool=pending.tool,
        schema=pending.schema,
        tool_input=tool_input,
        args=args,
        tool_call_id=pending.tool_call_id,
        config=config,
        policy=policy,
    )
    if edited is None:  # validated in _checked; a stored decision is re-checked here
        raise ValueError(f"the stored edit of tool {pending.tool!r} no longer fits: {args!r}")
    meta["approval_of"] = pending.derived.key
    derived = dataclasses.replace(edited.derived, meta={**edited.derived.meta, **meta})
    return Verdict(dataclasses.replace(edited, derived=derived), tool_input, edited=args)


def decide(pending: PendingCall, engine: Engine, config: RunnableConfig) -> Verdict:
    """Approval before the claim: a completed effect replays unasked, a stored decision is
    reused, otherwise the human is asked (``interrupt()``) and an approve / edit stored."""
    info = _question(pending, engine)
    if info is None:
        return Verdict(pending, pending.tool_input)
    store, key = engine.store, pending.derived.key
    if _approval.effect_done(store.get(key)):
        return Verdict(pending, pending.tool_input)
    decision = _approval.stored_decision(store.get(_approval.decision_key(key)))
    if decision is None:
        decision = _ask(pending, info, engine, config)
        if decision.type != "reject":
            decision = _approval.store_decision(
                store, key, decision, **_decision_options(pending, engine)
            )
    return _verdict(pending, decision, config, engine.policy)


async def adecide(pending: PendingCall, engine: Engine, config: RunnableConfig) -> Verdict:
    """The async twin of :func:`decide`."""
    info = _question(pending, engine)
    if info is None:
        return Verdict(pending, pending.tool_input)
    store, key = engine.store, pending.derived.key
    if _approval.effect_done(await store.aget(key)):
        return Verdict(pending, pending.tool_input)
    decision = _approval.stored_decision(await store.aget(_approval.decision_key(key)))
    if decision is None:
        decision = await _aask(pending, info, engine, config)
        if decision.type != "reject":
            decision = await _approval.astore_decision(
                store, key, decision, **_decision_options(pending, engine)
            )
    return _verdict(pending, decision, config, engine.policy)


def _decision_options(pending: PendingCall, engine: Engine) -> dict[str, Any]:
    policy = engine.policy
    return {"meta": pending.derived.meta, "lease_ms": policy.lease_ms, "ttl_ms": policy.ttl_ms}


def unmemoized_if_error(result: Any) -> Any:
    """An error ``ToolMessage`` (a handled tool error) is returned but never stored."""
    if isinstance(result, ToolMessage) and result.status == "error":
        return Unmemoized(result)
    return result


def restamp(result: Any, tool_call_id: str | None) -> Any:
    """Point a replayed ToolMessage / Command at the current call; drop stale ids."""
    if tool_call_id is None:
        return result
    if isinstance(result, ToolMessage):
        return result.model_copy(update={"tool_call_id": tool_call_id, "id": None})
    if isinstance(result, list) and result and all(isinstance(r, ToolOutputMixin) for r in result):
        return [restamp(r, tool_call_id) for r in result]
    from langgraph.types import Command

    if isinstance(result, Command) and isinstance(result.update, dict):
        messages = result.update.get("messages")
        if isinstance(messages, list):
            update = {**result.update, "messages": [restamp(m, tool_call_id) for m in messages]}
            return dataclasses.replace(result, update=update)
    return result


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
