"""Human approval bound to the exact call: ask once per effect, run once, never memoize a "no".

A call that needs approval (``approval=True``, or a predicate over its
:class:`~langchain_idempotent.adapters.keys.CallInfo` that returns true; see
:func:`~langchain_idempotent.core.policy.needs_approval`) is decided *before* it claims its key,
by one flow (:func:`flow`), a step of every call's opening (:mod:`._opening`):

1. its effect already completed (or failed terminally) → replay, no question — unless the
   call is a *twin* (an identical call of the same message under
   ``identical_calls="share"``): twins share one effect, never a decision, so each is asked;
2. a decision for its key and arguments is already stored (a node re-run after a
   sibling's resume, a retry, a crash after approval) and younger than ``approval_ttl``
   → that decision, no question (an older one is dropped and asked again);
3. otherwise LangGraph's ``interrupt()``, in the format ``interrupt_mode`` names (the two
   formats of LangChain's ``HumanInTheLoopMiddleware``):

   * ``"batched"`` (default): a ``HITLRequest`` with this one call in ``action_requests``
     / ``review_configs`` (the action names its ``tool_call_id``), answered with
     ``{"decisions": [decision]}``;
   * ``"per_call"``: a ``ToolApprovalRequest`` (``{"type": "tool_approval",
     "tool_call_id", "name", "args", "description"}``), answered with one bare decision.

   Both carry the call's ``idempotency_key`` and ``args_hash``, and both pass a
   ``response_schema`` (the decisions allowed, and for an edit the tool's own argument
   schema), so LangGraph checks an answer *before it saves it*: an invalid answer (or one
   that names another ``tool_call_id``) is refused with nothing saved (neither by
   LangGraph nor here) and nothing cancelled (the calls answered validly in the same
   resume finish), and can be answered again.

   * ``approve`` → the decision is stored write-once under the key, the call runs once;
   * ``edit`` → the decision is stored, and the edited call runs once under the key its
     own arguments give;
   * ``reject`` → an error ``ToolMessage`` with the reviewer's message; nothing runs and
     nothing is stored, so the same call asks again later.

4. before a new effect, ``authorize(call_info, decision)`` (if given; sync or async): a
   false answer or an exception denies the call like a rejection (the exception named in
   the answer: it fails closed), nothing runs, nothing is stored, the decision is dropped.

The decision record is a record of its own (key ``<key>:approval``, for a twin
``<key>:approval:<hash of its tool call id>``; meta ``kind: approval``), written through
the ordinary claim / complete protocol, so every store keeps it without new operations. It
carries the arguments' hash, and a decision is only reused for the arguments it was given
for. The effect's record carries ``approval`` (``approve``
/ ``edit``), ``reviewer`` and, after an edit, ``approval_of`` (the key that was asked) in
its meta; ``langchain-idempotent show`` prints them.

Each question is an ``interrupt()`` bound to its call's key, never to its position
(:mod:`._asking`): ``create_agent`` runs each call as its own task, so each question has
its own interrupt id; the gated calls of one hand-built ``ToolNode`` task are asked one
at a time, and which call a question asks about is recorded (a record of kind
``approval_question``) before it is raised.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import (
    TYPE_CHECKING,
    Annotated,
    Any,
    Literal,
    NotRequired,  # pydantic needs these before 3.12
    Union,
)

from langchain_core.messages import ToolMessage
from pydantic import (
    BaseModel,
    Discriminator,
    ValidationError,
    WithJsonSchema,
    WrapValidator,
    create_model,
)
from typing_extensions import TypedDict

from ..core.policy import InterruptMode, Policy, needs_approval
from ..core.record import Record
from ._asking import (
    Hook,
    NotInGraphError,
    Op,
    Steps,
    StoreOp,
    task_of,
    turns,
    write_once,
)
from ._compat import graph_state_messages
from ._identical import has_twin
from .keys import CallInfo, visible_arguments

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig

    from ._call import PendingCall

__all__ = [
    "Decision",
    "NotInGraphError",
    "Verdict",
    "decision_key",
    "denial_message",
    "flow",
    "parse_decision",
    "rejection_message",
]

ALLOWED: list[Literal["approve", "edit", "reject"]] = ["approve", "edit", "reject"]
_APPROVAL_SUFFIX = ":approval"
log = logging.getLogger("langchain_idempotent.approval")


@dataclass(frozen=True, slots=True)
class Decision:
    """A reviewer's answer to one call."""

    type: Literal["approve", "edit", "reject"]
    #: For ``edit``: the arguments to run with instead.
    args: Mapping[str, Any] | None = None
    #: For ``reject``: the reviewer's message for the model.
    message: str | None = None
    #: Who decided, if the answer says (``"reviewer"`` in the decision or the resume).
    reviewer: str | None = None

    def meta(self) -> dict[str, str]:
        """What the effect's record carries about this decision."""
        meta: dict[str, str] = {"approval": self.type}
        if self.reviewer:
            meta["reviewer"] = self.reviewer
        return meta


@dataclass(frozen=True, slots=True)
class Verdict:
    """What approval decided for a call: run ``pending`` (with ``tool_input``, edited when
    the reviewer edited it), or answer with ``rejection`` and run nothing."""

    pending: PendingCall
    tool_input: Any
    edited: Mapping[str, Any] | None = None
    rejection: ToolMessage | None = None


# -- the question, in either format ------------------------------------------------------


def _description(tool: str, args: Mapping[str, Any], key: str) -> str:
    return (
        f"Tool execution requires approval\n\nTool: {tool}\nArgs: "
        f"{json.dumps(dict(args), sort_keys=True, default=str)}\nIdempotency key: {key}"
    )


def approval_request(pending: PendingCall, mode: InterruptMode) -> dict[str, Any]:
    """The interrupt value: LangChain's ``HITLRequest`` for this one call (``"batched"``)
    or its ``ToolApprovalRequest`` (``"per_call"``), with the call's key and args hash."""
    tool, args, key = pending.tool, dict(pending.args), pending.derived.key
    binding = {"idempotency_key": key, "args_hash": pending.derived.fingerprint}
    if mode == "per_call":
        if pending.tool_call_id is None:
            raise ValueError(
                f"tool {tool!r} was called without a tool call id, which "
                "interrupt_mode='per_call' names in its question; call it with a ToolCall "
                "(as ToolNode and create_agent do) or use interrupt_mode='batched'"
            )
        return {
            "type": "tool_approval",
            "tool_call_id": pending.tool_call_id,
            "name": tool,
            "args": args,
            "description": _description(tool, args, key),
            **binding,
        }
    action = {
        "name": tool,
        "args": args,
        "description": _description(tool, args, key),
        # what tells identical calls of one message apart (LangChain's own batched
        # request has no id: its decisions go by position in one request)
        "tool_call_id": pending.tool_call_id,
        **binding,
    }
    review = {"action_name": tool, "allowed_decisions": list(ALLOWED)}
    return {"action_requests": [action], "review_configs": [review]}


class _Approve(TypedDict):
    type: Literal["approve"]
    reviewer: NotRequired[str]


class _Reject(TypedDict):
    type: Literal["reject"]
    message: NotRequired[str]
    reviewer: NotRequired[str]


def response_schema(
    tool: str, schema: Any, mode: InterruptMode, tool_call_id: str | None = None
) -> Any:
    """The ``response_schema`` of a question about ``tool``: its JSON schema shows the
    decisions allowed (an edit's ``args`` as the tool's own argument ``schema``), and
    LangGraph checks an answer with :func:`parse_decision` before it saves it. Built once
    per tool schema (a JSON-schema dict is not cached)."""
    if isinstance(schema, dict):
        return _response_schema(tool, schema, mode, tool_call_id)
    return _cached_response_schema(tool, schema, mode, tool_call_id)


def _response_schema(
    tool: str, schema: Any, mode: InterruptMode, tool_call_id: str | None = None
) -> Any:
    args_type: Any = (
        schema
        if isinstance(schema, type) and issubclass(schema, BaseModel)
        else Annotated[dict[str, Any], WithJsonSchema(schema or {"type": "object"})]
    )
    name: Any = Literal[tool]  # type: ignore[valid-type]
    action = create_model("EditedAction", name=(name, tool), args=(args_type, ...))
    # Typed Any: mypy 2 with pydantic >= 2.13 reads create_model's fields as TypeForms and
    # refuses a Literal written in place ([arg-type], [maybe-unrecognized-str-typeform]).
    edit_type: Any = Literal["edit"]
    edit = create_model(
        "EditDecision",
        type=(edit_type, ...),
        edited_action=(action, ...),
        reviewer=(str | None, None),
    )
    decision: Any = Annotated[Union[_Approve, edit, _Reject], Discriminator("type")]  # noqa: UP007
    shape: Any = (
        decision
        if mode == "per_call"
        else create_model(
            "HITLResponse", decisions=(list[decision], ...), reviewer=(str | None, None)
        )
    )

    def check(answer: Any, _: Any) -> Any:
        parse_decision(answer, tool, schema, tool_call_id)
        return answer  # as sent: the flow reads it with parse_decision again

    return Annotated[shape, WrapValidator(check)]


_cached_response_schema = lru_cache(maxsize=1024)(_response_schema)


def parse_decision(
    answer: Any, tool: str, schema: Any = None, tool_call_id: str | None = None
) -> Decision:
    """The decision in an answer: ``{"decisions": [decision]}`` (LangChain's
    ``HITLResponse``) or one bare decision (a per-call answer). An edit must fit
    ``schema`` and keep the tool; a decision that names a ``tool_call_id`` must name the
    call it answers (``tool_call_id``). Raises ``ValueError`` naming the problem."""
    reviewer = None
    decision = answer
    if isinstance(answer, Mapping) and "decisions" in answer:
        decisions = answer["decisions"]
        if not isinstance(decisions, list) or len(decisions) != 1:
            raise ValueError(
                f"the approval of tool {tool!r} asks about one call, so the resume needs "
                f"exactly one decision: {{'decisions': [{{'type': 'approve'}}]}}, got {answer!r}"
            )
        reviewer = answer.get("reviewer")
        decision = decisions[0]
    if not isinstance(decision, Mapping) or decision.get("type") not in ALLOWED:
        raise ValueError(
            f"the approval of tool {tool!r} needs a decision of type 'approve', 'edit' or "
            f"'reject', got {decision!r}"
        )
    named = decision.get("tool_call_id")
    if named is not None and named != tool_call_id:
        raise ValueError(
            f"this decision names tool call {named!r}, but the question it answers is about "
            f"call {tool_call_id!r} of tool {tool!r}: there is no such call to apply it to; "
            "answer each question with its own call's decision (nothing ran)"
        )
    reviewer = _str(decision.get("reviewer", reviewer))
    kind = decision["type"]
    if kind == "reject":
        return Decision("reject", message=_str(decision.get("message")), reviewer=reviewer)
    if kind == "approve":
        return Decision("approve", reviewer=reviewer)
    action = decision.get("edited_action")
    if not isinstance(action, Mapping) or not isinstance(action.get("args"), Mapping):
        raise ValueError(
            f"an 'edit' decision needs edited_action={{'name': ..., 'args': {{...}}}}, got "
            f"{decision!r}"
        )
    if action.get("name", tool) != tool:
        raise ValueError(
            f"an edit cannot switch tools: the call is to {tool!r}, the edit names "
            f"{action.get('name')!r}"
        )
    args = dict(action["args"])
    if schema is not None:
        try:
            visible_arguments(schema, args)
        except ValidationError as exc:
            raise ValueError(
                f"the reviewer's edit of tool {tool!r} does not fit its arguments: "
                f"{exc.errors()[0]['msg']} ({args!r}); nothing ran"
            ) from None
    return Decision("edit", args=args, reviewer=reviewer)


def _str(value: Any) -> str | None:
    return None if value is None else str(value)


def rejection_message(tool: str, tool_call_id: str | None, decision: Decision) -> ToolMessage:
    """The answer the model gets for a rejected call (LangChain's wording)."""
    if decision.message:
        content = f"User rejected the tool call for `{tool}` with reason: {decision.message}"
    else:
        content = (
            f"User rejected the tool call for `{tool}` with id {tool_call_id}. The tool was "
            "not executed. Do not retry this tool call unless the user explicitly requests it."
        )
    return ToolMessage(content=content, name=tool, tool_call_id=tool_call_id or "", status="error")


# -- the flow: steps a driver carries out (:mod:`._asking`) ---------------------------------


def flow(pending: PendingCall, policy: Policy, config: RunnableConfig) -> Steps:
    """Approval before the claim: a completed effect replays unasked (unless the call is a
    twin, :func:`._identical.has_twin`, which is asked for its own answer), a stored
    decision of this call for these arguments is reused while it is younger than
    ``approval_ttl``, otherwise the human is asked (taking turns with the task's other
    calls, :func:`._asking.turns`) and an approve / edit stored; then ``authorize`` is
    asked before a new effect. Returns the :class:`Verdict`."""
    info = pending.info
    if info is None:
        return Verdict(pending, pending.tool_input)
    asks = needs_approval(policy.approval, info)
    if not asks and policy.authorize is None:
        return Verdict(pending, pending.tool_input)
    effect: Record | None = yield Op(StoreOp.GET, pending.derived.key)
    done = effect is not None and effect.done
    twin = asks and _twin(pending, policy, config)
    if done and not twin:
        return Verdict(pending, pending.tool_input)  # a replay never asks
    # A twin's decision is its own call's; any other call's is its key's (so a retry that
    # the model re-sent under a new tool call id, after a crash, is not asked again).
    dkey = decision_key(pending.derived.key, pending.tool_call_id if twin else None)
    decision = (yield from _decision(pending, policy, config, dkey, done)) if asks else None
    if decision is not None and decision.type == "reject":
        message = rejection_message(pending.tool, pending.tool_call_id, decision)
        return Verdict(pending, pending.tool_input, rejection=message)
    if not done and policy.authorize is not None:
        denial = yield from _authorized(pending, policy, info, decision)
        if denial is not None:
            if asks:  # the approval is spent: the call asks again next time
                yield Op(StoreOp.DELETE, dkey)
            return Verdict(pending, pending.tool_input, rejection=denial)
    if decision is None:
        return Verdict(pending, pending.tool_input)
    return _verdict(pending, decision, config, policy)


def _twin(pending: PendingCall, policy: Policy, config: RunnableConfig) -> bool:
    """Whether the call shares its effect with an identical call of its message."""
    return policy.identical_calls == "share" and has_twin(
        graph_state_messages(config), pending.tool_call_id
    )


def _decision(
    pending: PendingCall, policy: Policy, config: RunnableConfig, dkey: str, done: bool
) -> Steps:
    """This call's decision: the one stored under ``dkey`` for its arguments' hash while
    fresh (``approval_ttl``; an effect already ``done`` runs nothing, so any age will do),
    else the human's answer (an approve / edit is stored there)."""
    info = pending.info
    assert info is not None
    key, fingerprint = pending.derived.key, pending.derived.fingerprint
    record: Record | None = yield Op(StoreOp.GET, dkey)
    decision = _stored(record, fingerprint)
    ttl = policy.approval_ttl_ms
    if decision is not None and record is not None and ttl is not None and not done:
        now: int = yield Op(StoreOp.NOW, None)
        if now - record.updated_at > ttl:  # too old for the effect about to run: ask again
            log.info(
                "the approval of %s (key %s) is %d ms old, older than approval_ttl (%d ms): "
                "asking again",
                pending.tool,
                key,
                now - record.updated_at,
                ttl,
            )
            yield Op(StoreOp.DELETE, dkey)
            decision = None
    if decision is not None:
        return decision
    answer = yield from turns(
        task_of(config, info.thread_id or "", pending.tool, key),
        key=dkey,
        request=approval_request(pending, policy.interrupt_mode),
        schema=response_schema(
            pending.tool, pending.schema, policy.interrupt_mode, pending.tool_call_id
        ),
        meta=pending.derived.meta,
        lease_ms=policy.lease_ms,
        ttl_ms=policy.ttl_ms,
    )
    decision = parse_decision(answer, pending.tool, pending.schema, pending.tool_call_id)
    if decision.type != "reject":
        meta = {**pending.derived.meta, "kind": "approval", "approval_for": key}
        payload = _decision_json(decision, fingerprint)
        kept = yield from write_once(dkey, payload, meta, policy.lease_ms, policy.ttl_ms)
        decision = _stored_payload(kept, fingerprint) or decision
    return decision


def _authorized(
    pending: PendingCall, policy: Policy, info: CallInfo, decision: Decision | None
) -> Steps:
    """``None`` when ``authorize`` allows the effect, else the answer that denies it (a
    false answer, or an exception: it fails closed and says why)."""
    try:
        allowed = yield Hook(policy.authorize, (info, decision))  # type: ignore[arg-type]
    except Exception as exc:
        log.warning(
            "authorize raised for %s (key %s); the call is denied",
            pending.tool,
            pending.derived.key,
            exc_info=True,
        )
        why = f"authorize raised {type(exc).__name__}: {exc}"
        return denial_message(pending.tool, pending.tool_call_id, why)
    if allowed:
        return None
    return denial_message(pending.tool, pending.tool_call_id, "authorize denied it")


def denial_message(tool: str, tool_call_id: str | None, why: str) -> ToolMessage:
    """The answer the model gets for a call ``authorize`` denied (like a rejection)."""
    content = (
        f"The tool call for `{tool}` was not authorized when it was about to run ({why}). "
        "The tool was not executed."
    )
    return ToolMessage(content=content, name=tool, tool_call_id=tool_call_id or "", status="error")


def _verdict(
    pending: PendingCall, decision: Decision, config: RunnableConfig, policy: Policy
) -> Verdict:
    """An approved (or edited) call, its record carrying the decision."""
    meta = decision.meta()
    if decision.type == "approve":
        return Verdict(pending.with_meta(meta), pending.tool_input)
    args = dict(decision.args or {})
    original = pending.tool_input
    tool_input = (
        {**original, "args": args}
        if isinstance(original, Mapping) and original.get("type") == "tool_call"
        else args
    )
    edited = pending.with_args(tool_input, args, config, policy)
    if edited is None:  # checked when answered; a stored decision is re-checked here
        raise ValueError(f"the stored edit of tool {pending.tool!r} no longer fits: {args!r}")
    meta["approval_of"] = pending.derived.key
    return Verdict(edited.with_meta(meta), tool_input, edited=args)


# -- the decision and question records ------------------------------------------------------


def decision_key(key: str, tool_call_id: str | None = None) -> str:
    """The record of a decision: its effect's key, and for one of identical calls of one
    message (twins: they share the effect, never a decision) its tool call id."""
    if tool_call_id is None:
        return key + _APPROVAL_SUFFIX
    call = hashlib.sha256(tool_call_id.encode()).hexdigest()[:32]
    return f"{key}{_APPROVAL_SUFFIX}:{call}"


def _decision_json(decision: Decision, fingerprint: str) -> bytes:
    doc = {
        "type": decision.type,
        "args": decision.args,
        "reviewer": decision.reviewer,
        "args_hash": fingerprint,
    }
    return json.dumps(doc, sort_keys=True).encode()


def _stored_payload(payload: bytes | None, fingerprint: str) -> Decision | None:
    """The decision in ``payload`` when it was given for these arguments."""
    if payload is None:
        return None
    doc = json.loads(payload)
    if doc.get("args_hash", fingerprint) != fingerprint:
        return None
    return Decision(doc["type"], args=doc.get("args"), reviewer=doc.get("reviewer"))


def _stored(record: Record | None, fingerprint: str) -> Decision | None:
    if record is None or not record.done:
        return None
    return _stored_payload(record.payload, fingerprint)
