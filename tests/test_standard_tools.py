"""LangChain's standard tool tests (``langchain-tests``) against ``IdempotentTool``.

Wrapped tools of several shapes, each through ``ToolsUnitTests`` and
``ToolsIntegrationTests``: a plain one, a ``content_and_artifact`` one, one with an
``InjectedToolArg`` the caller fills in (it enters the key), one whose ``runtime`` is
injected by name and stays in ``tool_call_schema`` (as in LangChain's
``ShellToolMiddleware``), and one that answers with a message's text (a ``TextAccessor``).
The standard tests call ``tool.invoke(...)`` outside any graph, with no thread id, so
an autouse fixture enters ``idempotency_scope(...)`` around every test, as a user outside
LangGraph would. Each test
gets a fresh tool with its own in-memory store (``tool_constructor`` is the class, built
from ``tool_constructor_params`` per test).

This suite cannot see a dropped schema or a wrong replay: ``test_tool_wrapper.py`` checks
those.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any

import pytest
from langchain_core.messages import AIMessage
from langchain_core.tools import BaseTool, InjectedToolArg, tool
from langchain_tests.integration_tests import ToolsIntegrationTests
from langchain_tests.unit_tests import ToolsUnitTests
from pydantic.json_schema import SkipJsonSchema

from langchain_idempotent import IdempotentTool, InMemoryIdempotencyStore, Policy, idempotency_scope
from langchain_idempotent.core.engine import Engine


@tool
def issue_refund(invoice_id: str, amount: float, reason: str = "customer request") -> str:
    """Refund part or all of an invoice."""
    return f"refunded {amount:g} on {invoice_id} ({reason})"


@tool(response_format="content_and_artifact")
def search_orders(customer_id: str, limit: int = 10) -> tuple[str, list[dict[str, Any]]]:
    """Search a customer's orders; the artifact is the raw rows."""
    rows = [{"id": f"O-{i}", "customer": customer_id} for i in range(min(limit, 2))]
    return f"{len(rows)} orders for {customer_id}", rows


class _Scoped:
    """Gives every standard test a scope: they invoke the tool with no thread id."""

    @pytest.fixture(autouse=True)
    def _idempotency_scope(self) -> Iterator[None]:
        with idempotency_scope("langchain-tests"):
            yield

    inner: BaseTool
    example: dict[str, Any]
    policy: Policy = Policy()

    @property
    def tool_constructor(self) -> type[BaseTool]:
        return IdempotentTool

    @property
    def tool_constructor_params(self) -> dict[str, Any]:
        return {"inner": self.inner, "engine": Engine(InMemoryIdempotencyStore(), self.policy)}

    @property
    def tool_invoke_params_example(self) -> dict[str, Any]:
        return self.example


class TestPlainToolUnit(_Scoped, ToolsUnitTests):
    inner = issue_refund
    example = {"invoice_id": "INV-7", "amount": 140}


class TestPlainToolIntegration(_Scoped, ToolsIntegrationTests):
    inner = issue_refund
    example = {"invoice_id": "INV-7", "amount": 140}


class TestArtifactToolUnit(_Scoped, ToolsUnitTests):
    inner = search_orders
    example = {"customer_id": "C-1"}


class TestArtifactToolIntegration(_Scoped, ToolsIntegrationTests):
    inner = search_orders
    example = {"customer_id": "C-1", "limit": 2}


@tool
def refund_late_fee(amount: float, user_id: Annotated[str, InjectedToolArg]) -> str:
    """Refund a customer's late fee; the application fills in the customer."""
    return f"refunded {amount:g} to {user_id}"


@tool
def run_command(command: str, runtime: Annotated[Any, SkipJsonSchema()] = None) -> str:
    """Run a shell command (the runtime is injected by name, as ShellToolMiddleware's)."""
    return f"ran {command}"


@tool
def ask_billing(question: str) -> str:
    """Ask the billing agent; its answer is its last message's text."""
    return AIMessage(f"billing says: {question}").text


class TestInjectedArgToolUnit(_Scoped, ToolsUnitTests):
    inner = refund_late_fee
    example = {"amount": 15, "user_id": "C-42"}


class TestInjectedArgToolIntegration(_Scoped, ToolsIntegrationTests):
    inner = refund_late_fee
    example = {"amount": 15, "user_id": "C-42"}


class TestRuntimeByNameToolUnit(_Scoped, ToolsUnitTests):
    inner = run_command
    example = {"command": "ls"}
    policy = Policy(key_state=())  # it is given the runtime: the whole state


class TestRuntimeByNameToolIntegration(_Scoped, ToolsIntegrationTests):
    inner = run_command
    example = {"command": "ls"}
    policy = Policy(key_state=())


class TestMessageTextToolUnit(_Scoped, ToolsUnitTests):
    inner = ask_billing
    example = {"question": "refund?"}


class TestMessageTextToolIntegration(_Scoped, ToolsIntegrationTests):
    inner = ask_billing
    example = {"question": "refund?"}
