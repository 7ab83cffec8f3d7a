"""Pieces for the multi-agent tests: a refund ledger, a chat model that answers from a
function of the conversation (and may fail once, as a gateway does), and tools.

:class:`ReplyModel` is the tests' scripted ``BaseChatModel``: ``create_agent``,
``create_react_agent``, ``langgraph-supervisor``, ``langgraph-swarm`` and ``deepagents``
drive it exactly as they would a provider's model; ``bind_tools`` returns it unchanged.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from langchain.agents import create_agent
from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatResult
from langchain_core.tools import BaseTool, tool
from pydantic import PrivateAttr

from tests.support.graphs import Effects, ScriptedChatModel

Reply = Callable[[Sequence[BaseMessage]], AIMessage]


class GatewayError(ConnectionError):
    """The model gateway dropped the connection (injected)."""


class ReplyModel(ScriptedChatModel):
    """The scripted model answering every call with ``reply(messages)``; while
    ``failures`` are left, a call for which ``fail_when(messages)`` is true raises
    :class:`GatewayError` instead (before the reply is drawn, so the script goes on)."""

    reply: Any = None
    fail_when: Any = None
    failures: int = 1
    _fail_lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    def model_post_init(self, context: Any) -> None:
        self.then = self.reply
        super().model_post_init(context)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        with self._fail_lock:
            if self.failures and self.fail_when is not None and self.fail_when(messages):
                self.failures -= 1
                raise GatewayError("502 from the model gateway")
        return super()._generate(messages, stop, run_manager, **kwargs)


def tool_call(name: str, **args: Any) -> AIMessage:
    """One tool call with a fresh id, as a model emits it."""
    return AIMessage(
        "",
        tool_calls=[{"name": name, "args": args, "id": f"call_{uuid.uuid4().hex[:10]}"}],
    )


def last_tool_result(messages: Sequence[BaseMessage]) -> ToolMessage | None:
    return messages[-1] if messages and isinstance(messages[-1], ToolMessage) else None


def first_human(messages: Sequence[BaseMessage]) -> str:
    return next(str(m.content) for m in messages if m.type == "human")


#: The provider's books: every effect a tool performed, counted by name.
Ledger = Effects


def refund_tool(ledger: Ledger) -> BaseTool:
    @tool
    def issue_refund(invoice_id: str, amount: float) -> str:
        """Refund ``amount`` on ``invoice_id``."""
        n = ledger.record("refund", invoice_id=invoice_id, amount=amount)
        return f"refund #{n}: {amount} on {invoice_id}"

    return issue_refund


def email_tool(ledger: Ledger) -> BaseTool:
    @tool
    def send_email(customer_id: str, subject: str) -> str:
        """E-mail a customer."""
        ledger.record("email", customer_id=customer_id, subject=subject)
        return f"e-mailed {customer_id}"

    return send_email


def last_is(messages: list[BaseMessage], kind: str, name: str | None = None) -> bool:
    m = messages[-1] if messages else None
    return m is not None and m.type == kind and (name is None or m.name == name)


def swarm_agents(
    refund: Any, to_bob: Any, to_alice: Any, middleware: Callable[[], list[Any]] = list
) -> list[Any]:
    """alice (triage) hands over to bob; bob refunds and hands back; alice answers. Each
    agent gets the middleware ``middleware()`` makes."""

    def alice(messages: list[BaseMessage]) -> AIMessage:
        if last_is(messages, "human"):
            return tool_call("transfer_to_bob")
        return AIMessage("bob has refunded you")

    def bob(messages: list[BaseMessage]) -> AIMessage:
        answer = last_tool_result(messages)
        if answer is not None and answer.name == "issue_refund":
            return tool_call("transfer_to_alice")
        return tool_call("issue_refund", invoice_id="INV-7", amount=140)

    return [
        create_agent(ReplyModel(reply=alice), [to_bob], name="alice", middleware=middleware()),
        create_agent(
            ReplyModel(reply=bob), [refund, to_alice], name="bob", middleware=middleware()
        ),
    ]
