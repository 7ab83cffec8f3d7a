"""A scripted chat model that plans refunds the way an LLM would, with seeded faults.

:class:`ScriptedRefundModel` reads the ticket (the first human message) and the tool
results so far, and emits the next tool call of the workflow::

    lookup_invoice(invoice_id) → issue_refund(invoice_id, amount, reason)
        → notify_customer(customer_id, ticket_id, message) → final answer

A tool result with ``status="error"`` makes it emit the same call again (an agent that
retries a failed tool), up to ``max_tool_retries`` times, then it gives up and escalates.

Faults, both seeded by ``seed``, the ticket and the position in the conversation:

- ``error_rate``: the call raises :class:`UpstreamGatewayError` (a 502 from the LLM
  gateway) instead of answering;
- ``drift_rate``: an ``issue_refund`` call drifts in form, not meaning — ``140`` becomes
  ``140.0`` (or back) and the argument order is reversed — as a re-sampled LLM does.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import ConfigDict, PrivateAttr

from .faults import chance

__all__ = ["ScriptedRefundModel", "UpstreamGatewayError", "escalated", "parse_ticket"]

_TICKET = re.compile(r"\bT-\d+\b")
_CUSTOMER = re.compile(r"\bC-\d+\b")
_INVOICE = re.compile(r"\bINV-\d+\b")
_AMOUNT = re.compile(r"\$(\d+(?:\.\d{1,2})?)")


_ESCALATING = "; escalating "


def _escalation(tool: str, failures: int, ticket_id: str) -> str:
    return f"{tool} failed {failures} times{_ESCALATING}{ticket_id} to a human."


def escalated(messages: Sequence[BaseMessage]) -> bool:
    """Whether a model here gave the ticket up to a human after a tool kept failing."""
    return any(m.type == "ai" and _ESCALATING in str(m.content) for m in messages)


class UpstreamGatewayError(Exception):
    """The LLM gateway answered 502 Bad Gateway (injected)."""


def parse_ticket(text: str) -> dict[str, str]:
    """``ticket_id``, ``customer_id``, ``invoice_id`` and ``amount`` (as written) of a ticket."""
    found = {}
    for name, pattern in (
        ("ticket_id", _TICKET),
        ("customer_id", _CUSTOMER),
        ("invoice_id", _INVOICE),
    ):
        match = pattern.search(text)
        if match is None:
            raise ValueError(f"ticket text has no {name}: {text!r}")
        found[name] = match.group(0)
    amount = _AMOUNT.search(text)
    if amount is None:
        raise ValueError(f"ticket text has no $amount: {text!r}")
    found["amount"] = amount.group(1)
    return found


def _number(written: str) -> int | float:
    """``"140"`` → ``140``; ``"140.50"`` → ``140.5`` (what a model puts in JSON)."""
    return int(written) if "." not in written else float(written)


class ScriptedRefundModel(BaseChatModel):
    """Deterministic refund planner; see the module docstring."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    seed: int = 0
    error_rate: float = 0.0
    drift_rate: float = 0.0
    max_tool_retries: int = 3
    #: Called with ``"llm_502"`` or ``"arg_drift"`` each time a fault fires.
    on_fault: Callable[[str], None] | None = None

    _calls: Counter[tuple[str, int]] = PrivateAttr(default_factory=Counter)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @property
    def _llm_type(self) -> str:
        return "scripted-refund-planner"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"seed": self.seed, "error_rate": self.error_rate, "drift_rate": self.drift_rate}

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        schemas = [convert_to_openai_tool(t) for t in tools]
        return self.bind(tools=schemas, **kwargs)

    def _fault(self, kind: str) -> None:
        if self.on_fault is not None:
            self.on_fault(kind)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        human = next((m for m in messages if isinstance(m, HumanMessage)), None)
        if human is None:
            raise ValueError("no ticket: the conversation has no human message")
        ticket = parse_ticket(str(human.content))
        position = sum(1 for m in messages if m.type != "system")
        with self._lock:
            self._calls[(ticket["ticket_id"], position)] += 1
            nth = self._calls[(ticket["ticket_id"], position)]
        where = self._where(ticket["ticket_id"], position, nth)
        if chance(self.seed, "llm", *where) < self.error_rate:
            self._fault("llm_502")
            raise UpstreamGatewayError("502 Bad Gateway: the LLM gateway reset the connection")
        drift = chance(self.seed, "drift", *where) < self.drift_rate
        message = self._next_step(ticket, messages, drift)
        tools = kwargs.get("tools")
        if tools is not None:
            offered = {t["function"]["name"] for t in tools}
            for call in message.tool_calls:
                if call["name"] not in offered:
                    raise ValueError(f"planned {call['name']!r}, but only {offered} are bound")
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _where(self, ticket_id: str, position: int, nth: int) -> tuple[object, ...]:
        """What a fault decision is seeded on, besides the seed and the fault kind."""
        return (ticket_id, position, nth)

    def _next_step(
        self, ticket: dict[str, str], messages: list[BaseMessage], drift: bool
    ) -> AIMessage:
        done: dict[str, dict[str, Any]] = {}
        failures: Counter[str] = Counter()
        for m in messages:
            if isinstance(m, ToolMessage) and m.name:
                if m.status == "error":
                    failures[m.name] += 1
                else:
                    done[m.name] = json.loads(str(m.content))
                    failures[m.name] = 0
        amount = ticket["amount"]
        steps: list[tuple[str, dict[str, Any]]] = [
            ("lookup_invoice", {"invoice_id": ticket["invoice_id"]}),
            (
                "issue_refund",
                {
                    "invoice_id": ticket["invoice_id"],
                    "amount": _number(amount),
                    "reason": f"Support ticket {ticket['ticket_id']}",
                },
            ),
            ("notify_customer", {}),
        ]
        for name, args in steps:
            if name in done:
                continue
            if failures[name] >= self.max_tool_retries:
                return AIMessage(content=_escalation(name, failures[name], ticket["ticket_id"]))
            if name == "issue_refund" and drift:
                self._fault("arg_drift")
                if isinstance(args["amount"], int):
                    args["amount"] = float(args["amount"])  # 140 -> 140.0
                args = dict(reversed(list(args.items())))  # key order changes too
            if name == "notify_customer":
                refund = done["issue_refund"]
                args = {
                    "customer_id": ticket["customer_id"],
                    "ticket_id": ticket["ticket_id"],
                    "message": f"We refunded ${amount} for invoice {ticket['invoice_id']} "
                    f"(refund {refund['id']}).",
                }
            call_id = "call_" + uuid.uuid4().hex[:16]
            return AIMessage(
                content="",
                tool_calls=[{"name": name, "args": args, "id": call_id, "type": "tool_call"}],
            )
        refund_id = done["issue_refund"]["id"]
        return AIMessage(
            content=f"Refunded ${amount} for {ticket['invoice_id']} ({refund_id}); "
            f"{ticket['customer_id']} notified."
        )
