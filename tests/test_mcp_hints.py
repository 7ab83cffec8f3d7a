"""Effect classes from MCP tool annotations, against a real FastMCP server.

A FastMCP server (the MCP SDK's, in this process, spoken to over the MCP protocol on
in-memory streams) serves one tool per row of the annotation table; its tools are loaded
with ``langchain-mcp-adapters`` (``load_mcp_tools``) and, where it is installed (fastmcp
>= 4, ``.ci/mcp2``), LangChain's own ``langchain.mcp``. Each is wrapped with
``idempotent()`` or named by ``IdempotencyMiddleware``, and the class each one gets is
checked, with the ``effect_inferred`` events, and what the class does: a read-only tool
runs on every call with no record, the others run once per key.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

pytest.importorskip("langchain_mcp_adapters")

from langchain_core.tools import BaseTool
from mcp.server.fastmcp import FastMCP
from mcp.shared.memory import create_connected_server_and_client_session
from mcp.types import ToolAnnotations

from langchain_idempotent import (
    IdempotencyMiddleware,
    InMemoryIdempotencyStore,
    idempotency_scope,
    idempotent,
)
from langchain_idempotent.adapters._hints import hinted_effect, mcp_hints
from langchain_idempotent.core.events import IdempotencyEvent

#: tool name -> (its annotations, the class it gets; None: today's default, no class)
TABLE: dict[str, tuple[dict[str, bool], str | None]] = {
    "lookup_order": ({"readOnlyHint": True}, "read"),
    "set_address": ({"readOnlyHint": False, "idempotentHint": True}, "keyed"),
    "delete_order": ({"destructiveHint": True}, "unsafe"),
    "purge_order": ({"destructiveHint": True, "idempotentHint": True}, "unsafe"),
    "refund": ({}, None),  # no annotations: today's default
    "refund_marked_false": ({"readOnlyHint": False, "destructiveHint": False}, None),
    "send_note": ({"idempotentHint": False}, None),
}


def annotated_server(calls: Counter[str]) -> FastMCP:
    server = FastMCP("hints")

    def tool_named(name: str) -> Callable[[str], str]:
        def run(order_id: str) -> str:
            calls[name] += 1
            return f"{name} {order_id} #{calls[name]}"

        run.__name__ = name
        run.__doc__ = f"{name} an order."
        return run

    for name, (hints, _) in TABLE.items():
        annotations = ToolAnnotations(**hints) if hints else None  # type: ignore[arg-type]
        server.tool(annotations=annotations)(tool_named(name))
    return server


@asynccontextmanager
async def adapters_tools(calls: Counter[str]) -> AsyncIterator[list[BaseTool]]:
    """The server's tools as ``langchain-mcp-adapters`` loads them, on a live session."""
    from langchain_mcp_adapters.tools import load_mcp_tools

    server = annotated_server(calls)
    async with create_connected_server_and_client_session(server._mcp_server) as session:
        yield await load_mcp_tools(session)


class Events(list[IdempotencyEvent]):
    def __call__(self, event: IdempotencyEvent) -> None:
        self.append(event)

    def inferred(self) -> dict[str, str]:
        return {e.tool or "": e.detail["effect"] for e in self if e.kind == "effect_inferred"}


async def test_adapters_tools_get_the_class_their_annotations_choose() -> None:
    calls: Counter[str] = Counter()
    async with adapters_tools(calls) as tools:
        events = Events()
        wrapped = idempotent(tools, store=InMemoryIdempotencyStore(), on_event=events)
        got = {t.name: t.policy.effect_class for t in wrapped}
        assert got == {name: cls for name, (_, cls) in TABLE.items()}
        # An event for each class inferred, none for a tool left to the default.
        assert events.inferred() == {n: c for n, (_, c) in TABLE.items() if c is not None}
        hints = {e.tool: e.detail["hints"] for e in events}
        assert hints["purge_order"] == {"destructiveHint": True, "idempotentHint": True}
        assert got["delete_order"] == "unsafe"
        assert wrapped[2].policy.on_expired == "raise"  # unsafe's preset, no reconcile hook

        # What the classes do, through the server: a read runs every time, with no
        # record; the rest run once per key and replay.
        by_name = {t.name: t for t in wrapped}
        with idempotency_scope("hints-1"):
            for _ in range(2):
                for name in ("lookup_order", "set_address", "refund"):
                    await by_name[name].ainvoke({"order_id": "A-1"})
        assert calls == Counter({"lookup_order": 2, "set_address": 1, "refund": 1})
        store = by_name["refund"].engine.store
        assert sorted(r.meta.get("tool", "") for r in store.list()) == ["refund", "set_address"]


async def test_an_explicit_effect_always_wins_over_the_annotations() -> None:
    async with adapters_tools(Counter()) as tools:
        events = Events()
        explicit = {"lookup_order": "unsafe", "delete_order": "keyed"}
        wrapped = idempotent(
            tools, store=InMemoryIdempotencyStore(), effect=explicit, on_event=events
        )
        got = {t.name: t.policy.effect_class for t in wrapped}
        assert got["lookup_order"] == "unsafe" and got["delete_order"] == "keyed"
        assert got["set_address"] == "keyed"  # not named: its annotations still choose
        assert "lookup_order" not in events.inferred()
        one = idempotent(tools[0], store=InMemoryIdempotencyStore(), effect="keyed")
        assert one.policy.effect_class == "keyed"


async def test_the_middleware_reads_the_annotations_of_the_tools_it_names() -> None:
    async with adapters_tools(Counter()) as tools:
        events = Events()
        middleware = IdempotencyMiddleware(InMemoryIdempotencyStore(), tools=tools, on_event=events)
        assert events.inferred() == {n: c for n, (_, c) in TABLE.items() if c is not None}
        by_name = {t.name: t for t in tools}
        from langchain_idempotent.adapters._hints import engine_for

        assert engine_for(middleware.engine, by_name["lookup_order"]).policy.effect == "read"


async def test_langchain_mcp_tools_get_the_same_classes() -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            from langchain.mcp import as_langchain_tool
        except ImportError:
            pytest.skip("langchain.mcp needs fastmcp>=4 (.ci/mcp2 runs it)")
    from fastmcp import Client

    server = annotated_server(Counter())
    async with Client(server) as client:
        tools = [await as_langchain_tool(t, client) for t in await client.list_tools()]
    wrapped = idempotent(tools, store=InMemoryIdempotencyStore())
    assert {t.name: t.policy.effect_class for t in wrapped} == {
        name: cls for name, (_, cls) in TABLE.items()
    }


@pytest.mark.parametrize(
    ("metadata", "effect"),
    [
        ({"readOnlyHint": None, "destructiveHint": None, "idempotentHint": None}, None),
        ({"mcp": {"tool": {"annotations": {"read_only_hint": True}}}}, "read"),
        ({"mcp": {"server": {"name": "bank"}}}, None),
        ({"destructive_hint": True}, "unsafe"),
        ({"readOnlyHint": "yes"}, None),  # not a boolean: no statement
        (None, None),
    ],
)
def test_hints_are_read_in_both_loaders_shapes_and_only_true_chooses(
    metadata: Any, effect: str | None
) -> None:
    from langchain_core.tools import tool

    @tool
    def anything(order_id: str) -> str:
        """Do anything."""
        return order_id

    anything.metadata = metadata
    assert hinted_effect(mcp_hints(anything)) == effect
