"""Human approval bound to the exact call: ask once per effect, run once, never memoize a "no".

A call that needs approval (``approval=True``, or a predicate over its
:class:`~langchain_idempotent.keys.CallInfo` that returns true) is decided *before* it
claims its key:

1. its effect already completed (or failed terminally) → replay, no question;
2. a decision for its key is already stored (a node re-run after a sibling's resume, a
   retry, a crash after approval) → that decision, no question;
3. otherwise LangGraph's ``interrupt()`` with LangChain's HITL request (the
   ``action_requests`` / ``review_configs`` shape ``HumanInTheLoopMiddleware`` emits; the
   action carries the tool name, the canonical arguments, a description and the
   ``idempotency_key``), resumed with ``{"decisions": [decision]}``:

   * ``approve`` → the decision is stored write-once under the key, the call runs once;
   * ``edit`` → the edited arguments are validated through the tool's schema, the decision
     is stored, and the edited call runs once under the key its own arguments give;
   * ``reject`` → an error ``ToolMessage`` with the reviewer's message; nothing runs and
     nothing is stored, so the same call asks again later.

The decision record is a record of its own (key ``<key>:approval``, meta ``kind:
approval``), written through the ordinary claim / complete protocol, so every store keeps
it without new operations. The effect's record carries ``approval`` (``approve`` /
``edit``), ``reviewer`` and, after an edit, ``approval_of`` (the key that was asked) in
its meta; ``langchain-idempotent show`` prints them.

Each call's question is an ``interrupt()`` bound to its key (:mod:`._asking`): LangGraph
matches answers to the interrupts *of one task* by position, so the gated calls of one
task (a hand-built ``ToolNode``) are asked one at a time, and which call a question asks
about is recorded (a record of kind ``approval_question``) before it is raised.
``create_agent`` (and a graph that routes tool calls with ``Send``) runs each call as its
own task, so each question has its own interrupt id and is answered with
``Command(resume={interrupt_id: {"decisions": [...]}})``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from langchain_core.messages import ToolMessage

from .keys import CallInfo
from .record import ClaimOutcome, Record

if TYPE_CHECKING:
    from .stores.base import BaseIdempotencyStore

__all__ = [
    "ApprovalPredicate",
    "ApprovalSetting",
    "Decision",
    "approval_request",
    "needs_approval",
    "parse_decision",
    "rejection_message",
]

#: Decides per call whether a human is asked (``lambda call: call.args["amount"] > 500``).
ApprovalPredicate = Callable[[CallInfo], bool]
#: ``True`` (every new effect asks), ``False`` (never), a predicate, or one of those per
#: tool name (``{"issue_refund": True}``; a tool not named never asks).
ApprovalSetting = bool | ApprovalPredicate | Mapping[str, bool | ApprovalPredicate]

ALLOWED: list[Literal["approve", "edit", "reject"]] = ["approve", "edit", "reject"]
_APPROVAL_SUFFIX = ":approval"


def needs_approval(setting: ApprovalSetting, info: CallInfo) -> bool:
    """Whether ``info`` asks a human under ``setting``."""
    if isinstance(setting, Mapping):
        setting = setting.get(info.tool, False)
    if isinstance(setting, bool):
        return setting
    return bool(setting(info))


def check_setting(setting: object) -> None:
    """A clear error for an approval setting that is not a bool, a function or a mapping
    of tool names to those."""
    values = setting.items() if isinstance(setting, Mapping) else [("approval", setting)]
    for name, value in values:
        if not isinstance(name, str) or (not isinstance(value, bool) and not callable(value)):
            raise TypeError(
                "approval must be True, False, a function of the call (CallInfo -> bool), or "
                f"a dict of tool names to those; got {setting!r}"
            )


@dataclass(frozen=True, slots=True)
class Decision:
    """A reviewer's answer to one call."""

    type: Literal["approve", "edit", "reject"]
    #: For ``edit``: the arguments to run with instead.
    args: Mapping[str, Any] | None = None
    #: For ``reject``: the reviewer's message for the model.
    message: str | None = None
    #: Who decided, if the resume says (``"reviewer"`` in the decision or the resume).
    reviewer: str | None = None

    def to_json(self) -> bytes:
        doc = {"type": self.type, "args": self.args, "reviewer": self.reviewer}
        return json.dumps(doc, sort_keys=True).encode()

    @classmethod
    def from_json(cls, payload: bytes) -> Decision:
        doc = json.loads(payload)
        return cls(doc["type"], args=doc.get("args"), reviewer=doc.get("reviewer"))

    def meta(self) -> dict[str, str]:
        """What the effect's record carries about this decision."""
        meta: dict[str, str] = {"approval": self.type}
        if self.reviewer:
            meta["reviewer"] = self.reviewer
        return meta


def approval_request(info: CallInfo, key: str, description: str | None = None) -> dict[str, Any]:
    """The interrupt value: LangChain's ``HITLRequest`` for this one call."""
    text = description or (
        f"Tool execution requires approval\n\nTool: {info.tool}\nArgs: "
        f"{json.dumps(dict(info.args), sort_keys=True, default=str)}\nIdempotency key: {key}"
    )
    action = {
        "name": info.tool,
        "args": dict(info.args),
        "description": text,
        "idempotency_key": key,
    }
    review = {"action_name": info.tool, "allowed_decisions": list(ALLOWED)}
    return {"action_requests": [action], "review_configs": [review]}


def parse_decision(resume: Any, tool: str) -> Decision:
    """The decision in a resume value: ``{"decisions": [decision]}`` (LangChain's
    ``HITLResponse``) or one bare decision. Raises ``ValueError`` naming the problem."""
    reviewer = None
    decision = resume
    if isinstance(resume, Mapping) and "decisions" in resume:
        decisions = resume["decisions"]
        if not isinstance(decisions, list) or len(decisions) != 1:
            raise ValueError(
                f"the approval of tool {tool!r} asks about one call, so the resume needs "
                f"exactly one decision: {{'decisions': [{{'type': 'approve'}}]}}, got {resume!r}"
            )
        reviewer = resume.get("reviewer")
        decision = decisions[0]
    if not isinstance(decision, Mapping) or decision.get("type") not in ALLOWED:
        raise ValueError(
            f"the approval of tool {tool!r} needs a decision of type 'approve', 'edit' or "
            f"'reject', got {decision!r}"
        )
    reviewer = decision.get("reviewer", reviewer)
    kind = decision["type"]
    if kind == "edit":
        action = decision.get("edited_action")
        if not isinstance(action, Mapping) or not isinstance(action.get("args"), Mapping):
            raise ValueError(
                "an 'edit' decision needs edited_action={'name': ..., 'args': {...}}, got "
                f"{decision!r}"
            )
        if action.get("name", tool) != tool:
            raise ValueError(
                f"an edit cannot switch tools: the call is to {tool!r}, the edit names "
                f"{action.get('name')!r}"
            )
        return Decision("edit", args=dict(action["args"]), reviewer=_str(reviewer))
    if kind == "reject":
        return Decision("reject", message=_str(decision.get("message")), reviewer=_str(reviewer))
    return Decision("approve", reviewer=_str(reviewer))


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


# -- the decision record -----------------------------------------------------------------


def decision_key(key: str) -> str:
    return key + _APPROVAL_SUFFIX


def effect_done(record: Record | None) -> bool:
    return record is not None and record.done


def stored_decision(record: Record | None) -> Decision | None:
    if record is None or not record.done or record.payload is None:
        return None
    return Decision.from_json(record.payload)


def _decision_meta(meta: Mapping[str, str], key: str) -> dict[str, str]:
    return {**meta, "kind": "approval", "approval_for": key}


def store_decision(
    store: BaseIdempotencyStore,
    key: str,
    decision: Decision,
    *,
    meta: Mapping[str, str],
    lease_ms: int,
    ttl_ms: int,
) -> Decision:
    """Store ``decision`` write-once; the decision already stored wins."""
    full = _decision_meta(meta, key)
    stored = _write_once(store, decision_key(key), decision.to_json(), full, lease_ms, ttl_ms)
    return decision if stored is None else Decision.from_json(stored)


async def astore_decision(
    store: BaseIdempotencyStore,
    key: str,
    decision: Decision,
    *,
    meta: Mapping[str, str],
    lease_ms: int,
    ttl_ms: int,
) -> Decision:
    """The async twin of :func:`store_decision`."""
    full = _decision_meta(meta, key)
    payload = decision.to_json()
    stored = await _awrite_once(store, decision_key(key), payload, full, lease_ms, ttl_ms)
    return decision if stored is None else Decision.from_json(stored)


# -- which call a question asked about (see :mod:`._asking`) -------------------------------


def _question_payload(key: str) -> bytes:
    return json.dumps({"key": key}).encode()


def asked_about(record: Record | None) -> str | None:
    """The call key a question record names, or ``None``."""
    if record is None or not record.done or record.payload is None:
        return None
    key = json.loads(record.payload).get("key")
    return key if isinstance(key, str) else None


def store_question(
    store: BaseIdempotencyStore,
    qkey: str,
    key: str,
    *,
    meta: Mapping[str, str],
    lease_ms: int,
    ttl_ms: int,
) -> None:
    """Record that the question ``qkey`` asks about the call ``key``. The latest question
    at a position is the one the human sees, so an older record there is replaced."""
    full = {**meta, "kind": "approval_question", "approval_for": key}
    if asked_about(store.get(qkey)) not in (None, key):
        store.delete(qkey)
    _write_once(store, qkey, _question_payload(key), full, lease_ms, ttl_ms)


async def astore_question(
    store: BaseIdempotencyStore,
    qkey: str,
    key: str,
    *,
    meta: Mapping[str, str],
    lease_ms: int,
    ttl_ms: int,
) -> None:
    """The async twin of :func:`store_question`."""
    full = {**meta, "kind": "approval_question", "approval_for": key}
    if asked_about(await store.aget(qkey)) not in (None, key):
        await store.adelete(qkey)
    await _awrite_once(store, qkey, _question_payload(key), full, lease_ms, ttl_ms)


# -- write-once through the ordinary claim / complete protocol -----------------------------


def _write_once(
    store: BaseIdempotencyStore,
    rkey: str,
    payload: bytes,
    meta: Mapping[str, str],
    lease_ms: int,
    ttl_ms: int,
) -> bytes | None:
    """Store ``payload`` under ``rkey`` unless a payload is there; the stored one (``None``
    when another writer holds the key for an instant: its payload is the same answer)."""
    owner = f"{random.getrandbits(96):024x}"
    claim = store.claim(
        rkey, owner=owner, fingerprint="approval", lease_ms=lease_ms, ttl_ms=ttl_ms, meta=meta
    )
    if claim.outcome is ClaimOutcome.REPLAY and claim.payload is not None:
        return claim.payload
    if not claim.outcome.runs:
        return None
    done = store.complete(
        rkey,
        owner=owner,
        fence=claim.fence,
        fingerprint="approval",
        payload=payload,
        failed=False,
        ttl_ms=ttl_ms,
        meta=meta,
    )
    return done.payload


async def _awrite_once(
    store: BaseIdempotencyStore,
    rkey: str,
    payload: bytes,
    meta: Mapping[str, str],
    lease_ms: int,
    ttl_ms: int,
) -> bytes | None:
    """The async twin of :func:`_write_once`."""
    owner = f"{random.getrandbits(96):024x}"
    claim = await store.aclaim(
        rkey, owner=owner, fingerprint="approval", lease_ms=lease_ms, ttl_ms=ttl_ms, meta=meta
    )
    if claim.outcome is ClaimOutcome.REPLAY and claim.payload is not None:
        return claim.payload
    if not claim.outcome.runs:
        return None
    done = await store.acomplete(
        rkey,
        owner=owner,
        fence=claim.fence,
        fingerprint="approval",
        payload=payload,
        failed=False,
        ttl_ms=ttl_ms,
        meta=meta,
    )
    return done.payload
