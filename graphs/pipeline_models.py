"""Scripted chat models for the multi-agent pipeline (:mod:`graphs.pipeline`).

:class:`ScriptedSupervisor` calls the specialists (its tools) in order::

    triage(request) → billing(request) → notifications(request) → final answer

each ``request`` being the ticket (and, for notifications, the billing agent's answer).
:class:`ScriptedSpecialist` is one specialist's model: it calls its one tool, retries it
after an error tool message (up to ``max_tool_retries``, then escalates), and answers with
what the tool returned, which its supervisor tool hands back:

- ``triage``: ``lookup_invoice(invoice_id)``; answers with the invoice;
- ``billing``: ``issue_refund(invoice_id, amount, reason)``; answers with the refund (JSON);
- ``notifications``: ``notify_customer(customer_id, ticket_id, message)`` naming the
  refund id from the billing agent's answer (in its request).

Both are :class:`~graphs.fake_model.ScriptedRefundModel` s with another script; their
faults are seeded the same way, on the role too (seed, ticket, role, position in the
conversation, how many times that position was asked): ``error_rate`` raises
:class:`~graphs.fake_model.UpstreamGatewayError` (an LLM gateway 502), ``drift_rate``
changes the form of ``issue_refund``'s arguments (``140`` ↔ ``140.0``, key order).
``on_call`` runs on every call (the demo counts LLM calls); ``fail_once_after_tool``
makes a specialist fail once per ticket right after its tool succeeded (the supervisor's
``ToolRetryMiddleware`` then invokes it again from the start).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatResult
from pydantic import PrivateAttr

from .fake_model import ScriptedRefundModel, UpstreamGatewayError, _escalation

__all__ = ["AGENTS", "ScriptedSpecialist", "ScriptedSupervisor"]

#: The specialists, in the order the supervisor hands a ticket to them.
AGENTS = ("triage", "billing", "notifications")

#: Each specialist's one tool.
TOOL_OF = {
    "triage": "lookup_invoice",
    "billing": "issue_refund",
    "notifications": "notify_customer",
}


def _number(written: str) -> int | float:
    return int(written) if "." not in written else float(written)


class _Scripted(ScriptedRefundModel):
    """What both scripted roles share with :class:`~graphs.fake_model.ScriptedRefundModel`
    (tool binding, the seeded faults, here also seeded on the role), plus call counting."""

    role: str
    #: Called on every call (before a fault can fire).
    on_call: Callable[[], None] | None = None
    #: Fail (an LLM 502) once per ticket right after the tool succeeded, before answering:
    #: the specialist's node is retried after its effect (the notebook and tests use it).
    fail_once_after_tool: bool = False

    _failed_after_tool: set[str] = PrivateAttr(default_factory=set)

    @property
    def _llm_type(self) -> str:
        return f"scripted-pipeline-{self.role}"

    def _where(self, ticket_id: str, position: int, nth: int) -> tuple[object, ...]:
        return (ticket_id, self.role, position, nth)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        if self.on_call is not None:
            self.on_call()
        return super()._generate(messages, stop, run_manager, **kwargs)


def _call(name: str, args: dict[str, Any]) -> AIMessage:
    call_id = "call_" + uuid.uuid4().hex[:16]
    return AIMessage(
        content="", tool_calls=[{"name": name, "args": args, "id": call_id, "type": "tool_call"}]
    )


#: Where the notifications agent's request carries the billing agent's answer.
BILLING_SAID = "\nThe billing agent refunded: "


def answers(messages: Sequence[BaseMessage]) -> dict[str, str]:
    """Each specialist's answer in the supervisor's conversation (its tool's result), by
    agent name."""
    return {
        str(m.name): str(m.content)
        for m in messages
        if isinstance(m, ToolMessage) and m.name in AGENTS and m.status != "error"
    }


class ScriptedSupervisor(_Scripted):
    """Hands the ticket to each specialist in turn, then answers; stops at an escalation."""

    role: str = "supervisor"

    def _next_step(
        self, ticket: dict[str, str], messages: list[BaseMessage], drift: bool
    ) -> AIMessage:
        done = answers(messages)
        text = str(next(m for m in messages if isinstance(m, HumanMessage)).content)
        for agent in AGENTS:
            if agent not in done:
                request = text + (
                    BILLING_SAID + done["billing"] if agent == "notifications" else ""
                )
                return _call(agent, {"request": request})
            if "escalating" in done[agent]:
                return AIMessage(
                    content=f"{ticket['ticket_id']} escalated by {agent}: {done[agent]}"
                )
        refund = json.loads(done["billing"])
        return AIMessage(
            content=f"Refunded ${ticket['amount']} for {ticket['invoice_id']} ({refund['id']}); "
            f"{ticket['customer_id']} notified."
        )


class ScriptedSpecialist(_Scripted):
    """One specialist (``role`` in :data:`AGENTS`): its one tool, then its answer."""

    def _next_step(
        self, ticket: dict[str, str], messages: list[BaseMessage], drift: bool
    ) -> AIMessage:
        tool = TOOL_OF[self.role]
        failures = 0
        for m in messages:
            if isinstance(m, ToolMessage) and m.name == tool:
                if m.status == "error":
                    failures += 1
                    continue
                if self.fail_once_after_tool and ticket["ticket_id"] not in self._failed_after_tool:
                    self._failed_after_tool.add(ticket["ticket_id"])
                    self._fault("llm_502")
                    raise UpstreamGatewayError("502 Bad Gateway (after the tool ran)")
                return AIMessage(content=str(m.content))
        if failures >= self.max_tool_retries:
            return AIMessage(content=_escalation(tool, failures, ticket["ticket_id"]))
        if self.role == "triage":
            return _call(tool, {"invoice_id": ticket["invoice_id"]})
        if self.role == "billing":
            args: dict[str, Any] = {
                "invoice_id": ticket["invoice_id"],
                "amount": _number(ticket["amount"]),
                "reason": f"Support ticket {ticket['ticket_id']}",
            }
            if drift:
                self._fault("arg_drift")
                if isinstance(args["amount"], int):
                    args["amount"] = float(args["amount"])  # 140 -> 140.0
                args = dict(reversed(list(args.items())))  # key order changes too
            return _call(tool, args)
        request = str(next(m for m in messages if isinstance(m, HumanMessage)).content)
        refund = json.loads(request.split(BILLING_SAID, 1)[1])
        return _call(
            tool,
            {
                "customer_id": ticket["customer_id"],
                "ticket_id": ticket["ticket_id"],
                "message": f"We refunded ${ticket['amount']} for invoice {ticket['invoice_id']} "
                f"(refund {refund['id']}).",
            },
        )
