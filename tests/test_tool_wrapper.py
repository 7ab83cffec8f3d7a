"""``IdempotentTool`` is the inner tool as far as the model and ToolNode can tell.

The model sees the same name, description and schema; the caller gets back exactly what
the inner tool returns (strings, ``(content, artifact)``, ``ToolMessage``, ``Command``)
with injected arguments passed through; a replay is the stored result pointed at the
current call; and every decision (replay, wait, takeover, ...) is visible to callbacks.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Annotated, Any, Literal

import pytest
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import (
    BaseTool,
    InjectedToolCallId,
    StructuredTool,
    Tool,
    ToolException,
    tool,
)
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.errors import GraphBubbleUp
from langgraph.prebuilt import InjectedState, InjectedStore, ToolRuntime
from langgraph.store.base import BaseStore
from langgraph.store.memory import InMemoryStore
from langgraph.types import Command
from pydantic import BaseModel, Field, ValidationError

from langchain_idempotent import (
    IdempotencyContext,
    IdempotencyEvent,
    IdempotentTool,
    InMemoryIdempotencyStore,
    MissingScopeError,
    PayloadMismatchError,
    get_idempotency_context,
    idempotency_scope,
    idempotent,
)
from tests.support.graphs import (
    Effects,
    EventRecorder,
    ScriptedChatModel,
    call,
    calls,
    on_each_turn,
    thread,
    tool_graph,
)

# -- tools of every kind ----------------------------------------------------------------


@tool
def lookup_invoice(invoice_id: str) -> str:
    """Look up an invoice by id."""
    return f"invoice {invoice_id}: $140"


@tool(parse_docstring=True)
def issue_refund(invoice_id: str, amount: float, reason: str = "customer request") -> str:
    """Refund part or all of an invoice.

    Args:
        invoice_id: The invoice to refund.
        amount: How much to refund, in dollars.
        reason: Why, for the audit log.
    """
    return f"refunded {amount} on {invoice_id}"


class Address(BaseModel):
    street: str
    city: str = Field(description="City name")


class ShipInput(BaseModel):
    """Ship a parcel."""

    parcel_id: str = Field(description="Parcel id", min_length=3)
    to: Address
    speed: Literal["standard", "express"] = "standard"
    tags: list[str] = Field(default_factory=list)


def _ship(
    parcel_id: str, to: Address, speed: str = "standard", tags: list[str] | None = None
) -> str:
    return f"shipped {parcel_id} to {to.city} ({speed})"


ship = StructuredTool.from_function(
    _ship, name="ship", description="Ship a parcel.", args_schema=ShipInput
)


class SendEmailInput(BaseModel):
    to: str = Field(description="Recipient address")
    body: str


class SendEmail(BaseTool):
    """A hand-written ``BaseTool`` subclass."""

    name: str = "send_email"
    description: str = "Send an e-mail to a customer."
    args_schema: type[BaseModel] = SendEmailInput

    def _run(self, to: str, body: str) -> str:
        return f"sent to {to}"


@tool
def with_injections(
    customer_id: str,
    state: Annotated[dict[str, Any], InjectedState],
    store: Annotated[BaseStore, InjectedStore()],
    tool_call_id: Annotated[str, InjectedToolCallId],
) -> str:
    """Look up a customer, with state, store and the call id injected."""
    return customer_id


@tool
def with_runtime(customer_id: str, runtime: ToolRuntime) -> str:
    """Look up a customer, with the tool runtime injected."""
    return customer_id


async def _notify(customer_id: str, message: str) -> str:
    return f"notified {customer_id}"


notify_async_only = StructuredTool.from_function(
    coroutine=_notify, name="notify", description="Notify a customer (async only)."
)


@tool(response_format="content_and_artifact")
def search_orders(customer_id: str, limit: int = 10) -> tuple[str, list[dict[str, Any]]]:
    """Search a customer's orders."""
    return f"2 orders for {customer_id}", [{"id": "O-1"}, {"id": "O-2"}]


json_schema_tool = StructuredTool(
    name="close_ticket",
    description="Close a ticket.",
    args_schema={
        "type": "object",
        "properties": {"ticket_id": {"type": "string"}, "note": {"type": "string"}},
        "required": ["ticket_id"],
    },
    func=lambda ticket_id, note="": f"closed {ticket_id}",
)

KINDS: list[BaseTool] = [
    lookup_invoice,
    issue_refund,
    ship,
    SendEmail(),
    with_injections,
    with_runtime,
    notify_async_only,
    search_orders,
    json_schema_tool,
]


@pytest.fixture
def store() -> InMemoryIdempotencyStore:
    return InMemoryIdempotencyStore()


# -- what the model sees ------------------------------------------------------------------


@pytest.mark.parametrize("inner", KINDS, ids=lambda t: t.name)
def test_the_model_sees_exactly_the_inner_tool(inner: BaseTool) -> None:
    # key_state=(): the tools given the whole state declare that it never changes the
    # effect (without it they are refused: docs/keys.md).
    wrapped = idempotent(inner, InMemoryIdempotencyStore(), key_state=())
    assert isinstance(wrapped, IdempotentTool) and isinstance(wrapped, BaseTool)
    assert wrapped.name == inner.name
    assert wrapped.description == inner.description
    assert wrapped.args_schema is inner.args_schema
    assert wrapped.args == inner.args
    assert wrapped.return_direct == inner.return_direct
    visible: Any = wrapped.tool_call_schema
    inner_visible: Any = inner.tool_call_schema
    if isinstance(inner_visible, dict):
        assert visible == inner_visible
    else:
        assert visible.model_json_schema() == inner_visible.model_json_schema()
    # The full input schema (with the injected arguments) is what ToolNode inspects.
    full: Any = wrapped.get_input_schema()
    inner_full: Any = inner.get_input_schema()
    assert full.model_fields == inner_full.model_fields
    # What bind_tools sends to a provider (OpenAI format; the others derive from it).
    assert convert_to_openai_tool(wrapped) == convert_to_openai_tool(inner)
    assert convert_to_openai_tool(wrapped, strict=True) == convert_to_openai_tool(
        inner, strict=True
    )


def test_a_legacy_single_input_tool_shows_the_model_its_one_string_and_keys_by_it(
    store: InMemoryIdempotencyStore,
) -> None:
    runs: list[str] = []

    def echo(text: str) -> str:
        runs.append(text)
        return f"echo {text}"

    inner = Tool(name="echo", description="Echo text.", func=echo)
    wrapped = idempotent(inner, store)
    sent, expected = convert_to_openai_tool(wrapped), convert_to_openai_tool(inner)
    # The same payload but for the property's title, which LangChain hard-codes only for
    # Tool itself (a JSON schema's titles are dropped when it is converted).
    expected["function"]["parameters"]["properties"]["__arg1"].pop("title")
    assert sent == expected
    with idempotency_scope("s"):
        results = [
            wrapped.invoke("hi"),
            wrapped.invoke({"__arg1": "hi"}),  # what a model sends
            wrapped.invoke({"text": "hi"}),  # any single value, as Tool accepts it
            wrapped.invoke("bye"),
        ]
        message = wrapped.invoke(call("echo", {"__arg1": "bye"}, "c9"))
    assert results == ["echo hi", "echo hi", "echo hi", "echo bye"]
    assert message.content == "echo bye" and message.tool_call_id == "c9"
    assert runs == ["hi", "bye"]


def test_injected_arguments_are_hidden_from_the_model_as_in_the_inner_tool() -> None:
    wrapped = idempotent([with_injections, with_runtime], InMemoryIdempotencyStore(), key_state=())
    for w in wrapped:
        params = convert_to_openai_tool(w)["function"]["parameters"]["properties"]
        assert set(params) == {"customer_id"}


def test_a_list_of_tools_is_wrapped_one_by_one_sharing_one_store(
    store: InMemoryIdempotencyStore,
) -> None:
    wrapped = idempotent([lookup_invoice, issue_refund], store)
    assert [w.name for w in wrapped] == ["lookup_invoice", "issue_refund"]
    assert all(w.engine is wrapped[0].engine and w.engine.store is store for w in wrapped)


def test_wrapping_twice_is_refused(store: InMemoryIdempotencyStore) -> None:
    with pytest.raises(ValueError, match="already idempotent"):
        idempotent(idempotent(lookup_invoice, store), store)


def test_return_direct_is_kept(store: InMemoryIdempotencyStore) -> None:
    @tool(return_direct=True)
    def answer(question: str) -> str:
        """Answer directly."""
        return "42"

    assert idempotent(answer, store).return_direct is True


# -- what the caller gets back -------------------------------------------------------------


def test_a_string_result_is_returned_and_replayed_as_is(store: InMemoryIdempotencyStore) -> None:
    effects = Effects()

    @tool
    def refund(invoice_id: str, amount: float) -> str:
        """Refund."""
        n = effects.record("refund")
        return f"refund #{n}"

    wrapped = idempotent(refund, store)
    with idempotency_scope("order-1"):
        assert wrapped.invoke({"invoice_id": "I-1", "amount": 140}) == "refund #1"
        assert wrapped.invoke({"invoice_id": "I-1", "amount": 140.0}) == "refund #1"
        first = wrapped.invoke(call("refund", {"invoice_id": "I-1", "amount": 140}, "c1"))
    assert effects.count() == 1
    assert isinstance(first, ToolMessage)
    assert (first.content, first.tool_call_id, first.name) == ("refund #1", "c1", "refund")


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_content_and_artifact_comes_back_with_its_artifact_first_time_and_on_replay(
    store: InMemoryIdempotencyStore, kind: str
) -> None:
    wrapped = idempotent(search_orders, store)
    expected = search_orders.invoke(call("search_orders", {"customer_id": "C-1"}, "c0"))
    assert expected.artifact == [{"id": "O-1"}, {"id": "O-2"}]
    with idempotency_scope(f"artifact-{kind}"):
        results = []
        for call_id in ("c1", "c2"):
            tc = call("search_orders", {"customer_id": "C-1"}, call_id)
            results.append(wrapped.invoke(tc) if kind == "sync" else await wrapped.ainvoke(tc))
    for result, call_id in zip(results, ("c1", "c2"), strict=True):
        assert isinstance(result, ToolMessage)
        assert result.content == expected.content
        assert result.artifact == expected.artifact
        assert result.tool_call_id == call_id
    with idempotency_scope(f"artifact-plain-{kind}"):
        plain = wrapped.invoke({"customer_id": "C-1"})
    assert plain == search_orders.invoke({"customer_id": "C-1"})


def test_the_wrapper_reports_the_inner_response_format(store: InMemoryIdempotencyStore) -> None:
    assert idempotent(search_orders, store).response_format == "content_and_artifact"


def test_a_plain_invoke_after_a_tool_call_invoke_gets_what_the_inner_tool_returns(
    store: InMemoryIdempotencyStore,
) -> None:
    wrapped = idempotent(search_orders, store)
    with idempotency_scope("mixed"):
        wrapped.invoke(call("search_orders", {"customer_id": "C-1"}, "c1"))
        assert wrapped.invoke({"customer_id": "C-1"}) == search_orders.invoke(
            {"customer_id": "C-1"}
        )


def test_a_tool_message_result_is_replayed_re_stamped_to_the_current_call_without_its_id(
    store: InMemoryIdempotencyStore,
) -> None:
    @tool
    def charge(card: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> ToolMessage:
        """Charge a card."""
        return ToolMessage("charged", tool_call_id=tool_call_id, id="msg-1", artifact={"ok": 1})

    wrapped = idempotent(charge, store)
    with idempotency_scope("s"):
        first = wrapped.invoke(call("charge", {"card": "4242"}, "first"))
        again = wrapped.invoke(call("charge", {"card": "4242"}, "second"))
    assert (first.tool_call_id, first.id) == ("first", "msg-1")
    assert (again.tool_call_id, again.id) == ("second", None)
    assert (again.content, again.artifact) == ("charged", {"ok": 1})


def test_a_command_result_is_replayed_with_its_tool_message_re_stamped(
    store: InMemoryIdempotencyStore,
) -> None:
    @tool
    def set_status(status: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> Command[Any]:
        """Set the ticket status."""
        return Command(
            update={
                "status": status,
                "messages": [ToolMessage(f"status={status}", tool_call_id=tool_call_id, id="m1")],
            }
        )

    wrapped = idempotent(set_status, store)
    with idempotency_scope("s"):
        first = wrapped.invoke(call("set_status", {"status": "closed"}, "a"))
        again = wrapped.invoke(call("set_status", {"status": "closed"}, "b"))
    assert isinstance(again, Command) and isinstance(again.update, dict)
    assert isinstance(first, Command) and isinstance(first.update, dict)
    assert again.update["status"] == "closed"
    [message] = again.update["messages"]
    assert (message.tool_call_id, message.id, message.content) == ("b", None, "status=closed")
    assert first.update["messages"][0].tool_call_id == "a"


def test_a_handled_tool_error_is_returned_not_memoized_and_a_retry_runs_again(
    store: InMemoryIdempotencyStore,
) -> None:
    effects = Effects()

    def flaky(invoice_id: str) -> str:
        n = effects.record("flaky")
        if n == 1:
            raise ToolException("gateway timeout")
        return f"ok after {n}"

    inner = StructuredTool.from_function(
        flaky, name="flaky", description="Flaky.", handle_tool_error=True
    )
    wrapped = idempotent(inner, store)
    with idempotency_scope("s"):
        err = wrapped.invoke(call("flaky", {"invoice_id": "I-1"}, "c1"))
        ok = wrapped.invoke(call("flaky", {"invoice_id": "I-1"}, "c2"))
        replay = wrapped.invoke(call("flaky", {"invoice_id": "I-1"}, "c3"))
    assert isinstance(err, ToolMessage) and err.status == "error"
    assert (err.content, err.tool_call_id) == ("gateway timeout", "c1")
    assert (ok.content, ok.status) == ("ok after 2", "success")
    assert (replay.content, replay.tool_call_id) == ("ok after 2", "c3")
    assert effects.count() == 2


def test_a_handled_tool_error_under_a_plain_invoke_is_not_memoized(
    store: InMemoryIdempotencyStore,
) -> None:
    effects = Effects()

    def flaky(invoice_id: str) -> str:
        if effects.record("flaky") == 1:
            raise ToolException("gateway timeout")
        return "ok"

    inner = StructuredTool.from_function(
        flaky, name="flaky", description="Flaky.", handle_tool_error=True
    )
    wrapped = idempotent(inner, store)
    with idempotency_scope("s"):
        assert wrapped.invoke({"invoice_id": "I-1"}) == "gateway timeout"
        assert wrapped.invoke({"invoice_id": "I-1"}) == "ok"


def test_invalid_arguments_are_reported_as_the_inner_tool_reports_them(
    store: InMemoryIdempotencyStore,
) -> None:
    def charge(card: str, cents: int) -> str:
        return "charged"

    for flag in (True, "bad arguments, try again", False):
        inner = StructuredTool.from_function(
            charge, name="charge", description="Charge.", handle_validation_error=flag
        )
        wrapped = idempotent(inner, store)
        for bad in ({"card": "4242", "cents": "lots"}, call("charge", {"card": "4242"}, "c1")):
            with idempotency_scope("s"):
                if flag is False:
                    with pytest.raises(ValidationError):
                        inner.invoke(bad)
                    with pytest.raises(ValidationError):
                        wrapped.invoke(bad)
                else:
                    assert wrapped.invoke(bad) == inner.invoke(bad)
    assert store.list() == []  # nothing ran, nothing was claimed


def test_an_unhandled_error_propagates_and_a_retry_runs_again(
    store: InMemoryIdempotencyStore,
) -> None:
    effects = Effects()

    @tool
    def flaky(invoice_id: str) -> str:
        """Flaky."""
        if effects.record("flaky") == 1:
            raise ConnectionError("reset by peer")
        return "ok"

    wrapped = idempotent(flaky, store)
    with idempotency_scope("s"):
        with pytest.raises(ConnectionError):
            wrapped.invoke({"invoice_id": "I-1"})
        assert wrapped.invoke({"invoice_id": "I-1"}) == "ok"
        assert wrapped.invoke({"invoice_id": "I-1"}) == "ok"
    assert effects.count() == 2


async def test_an_async_only_tool_runs_under_ainvoke_and_replays(
    store: InMemoryIdempotencyStore,
) -> None:
    effects = Effects()

    async def notify(customer_id: str) -> str:
        await asyncio.sleep(0)
        return f"notified #{effects.record('notify')}"

    inner = StructuredTool.from_function(coroutine=notify, name="notify", description="Notify.")
    wrapped = idempotent(inner, store)
    with idempotency_scope("s"):
        assert await wrapped.ainvoke({"customer_id": "C-1"}) == "notified #1"
        assert await wrapped.ainvoke({"customer_id": "C-1"}) == "notified #1"
        # Like the inner tool, an async-only tool cannot be invoked synchronously.
        with pytest.raises(NotImplementedError):
            inner.invoke({"customer_id": "C-2"})
        with pytest.raises(NotImplementedError):
            wrapped.invoke({"customer_id": "C-2"})
    assert effects.count() == 1


# -- injected arguments inside a graph ------------------------------------------------------


def test_injected_state_store_call_id_and_runtime_pass_through_in_tool_node(
    store: InMemoryIdempotencyStore,
) -> None:
    seen: dict[str, Any] = {}

    @tool
    def remember(
        customer_id: str,
        state: Annotated[dict[str, Any], InjectedState],
        kv: Annotated[BaseStore, InjectedStore()],
        tool_call_id: Annotated[str, InjectedToolCallId],
    ) -> str:
        """Remember a customer."""
        kv.put(("customers",), customer_id, {"seen": True})
        seen["messages"] = len(state["messages"])
        seen["tool_call_id"] = tool_call_id
        return "remembered"

    @tool
    def inspect_runtime(customer_id: str, runtime: ToolRuntime) -> str:
        """Inspect the runtime."""
        seen["runtime_call_id"] = runtime.tool_call_id
        seen["runtime_thread"] = runtime.config["configurable"]["thread_id"]
        seen["runtime_store"] = runtime.store
        return "inspected"

    kv = InMemoryStore()
    model = ScriptedChatModel(
        script=[
            calls(
                call("remember", {"customer_id": "C-1"}, "call-r"),
                call("inspect_runtime", {"customer_id": "C-1"}, "call-i"),
            )
        ]
    )
    graph = tool_graph(
        model,
        idempotent([remember, inspect_runtime], store, key_state=()),
        checkpointer=InMemorySaver(),
    )
    # tool_graph compiles without a store; compile this one with the LangGraph store too.
    graph = graph.builder.compile(checkpointer=InMemorySaver(), store=kv)
    out = graph.invoke({"messages": [HumanMessage("hi")]}, thread("t-inj"))
    assert seen == {
        "messages": 2,
        "tool_call_id": "call-r",
        "runtime_call_id": "call-i",
        "runtime_thread": "t-inj",
        "runtime_store": kv,
    }
    assert kv.get(("customers",), "C-1") is not None
    results = {m.tool_call_id: m.content for m in out["messages"] if isinstance(m, ToolMessage)}
    assert results == {"call-r": "remembered", "call-i": "inspected"}


# -- the idempotency context inside the tool ----------------------------------------------


def _context_graph(store: InMemoryIdempotencyStore, seen: list[Any]) -> Any:
    def record() -> None:
        seen.append((get_idempotency_context(), threading.current_thread().name))

    @tool
    def sync_effect(n: int) -> str:
        """A sync tool."""
        record()
        return "sync"

    async def _async_effect(n: int) -> str:
        await asyncio.sleep(0)
        record()
        return "async"

    async_effect = StructuredTool.from_function(
        coroutine=_async_effect, name="async_effect", description="An async tool."
    )
    model = ScriptedChatModel(
        script=[
            calls(call("sync_effect", {"n": 1}), call("sync_effect", {"n": 2})),
        ]
    )
    return tool_graph(model, idempotent([sync_effect, async_effect], store)), model


def test_the_context_is_visible_inside_a_sync_tool_in_tool_nodes_thread_pool(
    store: InMemoryIdempotencyStore,
) -> None:
    seen: list[tuple[IdempotencyContext | None, str]] = []
    graph, _ = _context_graph(store, seen)
    recorder = EventRecorder()
    graph.invoke({"messages": [HumanMessage("go")]}, {**thread("ctx"), "callbacks": [recorder]})
    assert len(seen) == 2
    assert all(thread_name != "MainThread" for _, thread_name in seen)  # the executor
    contexts = [ctx for ctx, _ in seen]
    assert all(ctx is not None for ctx in contexts)
    keys = {ctx.key for ctx in contexts if ctx}
    assert len(keys) == 2  # n=1 and n=2 are different effects
    assert all(ctx and (ctx.fence, ctx.attempt, ctx.takeover) == (1, 1, False) for ctx in contexts)
    # The key the tool sees is the key in the run metadata (LangSmith shows it).
    assert keys <= {m.get("idempotency_key") for m in recorder.tool_metadata}
    assert get_idempotency_context() is None


async def test_the_context_is_visible_inside_an_async_tool_and_gone_after_it() -> None:
    store = InMemoryIdempotencyStore()
    seen: list[tuple[IdempotencyContext | None, str]] = []

    async def effect(n: int) -> str:
        await asyncio.sleep(0)
        seen.append((get_idempotency_context(), ""))
        return "ok"

    wrapped = idempotent(
        StructuredTool.from_function(coroutine=effect, name="effect", description="Effect."),
        store,
    )
    with idempotency_scope("ctx-async"):
        await asyncio.gather(wrapped.ainvoke({"n": 1}), wrapped.ainvoke({"n": 2}))
    ctxs = [ctx for ctx, _ in seen]
    assert len(ctxs) == 2 and all(ctx is not None for ctx in ctxs)
    assert len({ctx.key for ctx in ctxs if ctx}) == 2
    assert get_idempotency_context() is None


async def test_the_context_is_visible_inside_a_sync_tool_under_ainvoke() -> None:
    store = InMemoryIdempotencyStore()
    seen: list[tuple[IdempotencyContext | None, str]] = []
    graph, _ = _context_graph(store, seen)
    await graph.ainvoke({"messages": [HumanMessage("go")]}, thread("ctx-a"))
    assert len(seen) == 2 and all(ctx is not None for ctx, _ in seen)


# -- scope outside graphs -----------------------------------------------------------------


def test_a_bare_invoke_without_a_thread_fails_with_a_message_saying_how_to_fix_it(
    store: InMemoryIdempotencyStore,
) -> None:
    effects = Effects()

    @tool
    def refund(invoice_id: str) -> str:
        """Refund."""
        effects.record("refund")
        return "ok"

    wrapped = idempotent(refund, store)
    with pytest.raises(MissingScopeError) as info:
        wrapped.invoke({"invoice_id": "I-1"})
    message = str(info.value)
    assert "'refund'" in message
    assert "thread_id" in message and "checkpointer" in message
    assert "idempotency_scope(" in message and "'idempotency_scope'" in message
    assert effects.count() == 0


async def test_a_bare_ainvoke_without_a_thread_fails_too(store: InMemoryIdempotencyStore) -> None:
    with pytest.raises(MissingScopeError):
        await idempotent(lookup_invoice, store).ainvoke({"invoice_id": "I-1"})


def test_idempotency_scope_and_the_config_key_name_the_same_scope(
    store: InMemoryIdempotencyStore,
) -> None:
    effects = Effects()

    @tool
    def refund(invoice_id: str) -> str:
        """Refund."""
        return f"refund #{effects.record('refund')}"

    wrapped = idempotent(refund, store)
    args = {"invoice_id": "I-1"}
    with idempotency_scope("order-1"):
        assert wrapped.invoke(args) == "refund #1"
    assert wrapped.invoke(args, {"configurable": {"idempotency_scope": "order-1"}}) == "refund #1"
    with idempotency_scope("order-2"):
        assert wrapped.invoke(args) == "refund #2"
    # The config key wins over a thread id: a graph can pin a scope wider than its thread.
    pinned: RunnableConfig = {"configurable": {"idempotency_scope": "order-2", "thread_id": "t-9"}}
    assert wrapped.invoke(args, pinned) == "refund #2"
    assert effects.count() == 2


def test_a_key_function_scope_needs_no_thread(store: InMemoryIdempotencyStore) -> None:
    effects = Effects()

    @tool
    def refund(invoice_id: str, amount: float) -> str:
        """Refund."""
        return f"refund #{effects.record('refund')}"

    wrapped = idempotent(refund, store, scope=lambda info: f"refund:{info.args['invoice_id']}")
    assert wrapped.invoke({"invoice_id": "I-1", "amount": 140}) == "refund #1"
    assert wrapped.invoke({"invoice_id": "I-1", "amount": 140.0}) == "refund #1"
    # Same business key, other arguments: refused, never silently replayed.
    with pytest.raises(PayloadMismatchError):
        wrapped.invoke({"invoice_id": "I-1", "amount": 99})
    assert effects.count() == 1


# -- visibility: callback events and run metadata ----------------------------------------


def test_a_replay_dispatches_a_custom_event_and_carries_the_key_in_run_metadata(
    store: InMemoryIdempotencyStore,
) -> None:
    wrapped = idempotent(lookup_invoice, store)
    recorder = EventRecorder()
    config: RunnableConfig = {"configurable": {"idempotency_scope": "s"}, "callbacks": [recorder]}
    wrapped.invoke(call("lookup_invoice", {"invoice_id": "I-1"}, "c1"), config)
    assert recorder.names() == []  # a first run is the quiet path
    wrapped.invoke(call("lookup_invoice", {"invoice_id": "I-1"}, "c2"), config)
    [(name, data)] = recorder.events
    assert name == "idempotency.replay"
    assert data["tool"] == "lookup_invoice" and (data["fence"], data["attempt"]) == (1, 1)
    keys = {m["idempotency_key"] for m in recorder.tool_metadata}
    assert keys == {data["key"]}


async def test_a_replay_under_ainvoke_dispatches_the_event_too(
    store: InMemoryIdempotencyStore,
) -> None:
    wrapped = idempotent(lookup_invoice, store)
    recorder = EventRecorder()
    config: RunnableConfig = {"configurable": {"idempotency_scope": "s"}, "callbacks": [recorder]}
    await wrapped.ainvoke({"invoice_id": "I-1"}, config)
    await wrapped.ainvoke({"invoice_id": "I-1"}, config)
    assert recorder.names() == ["idempotency.replay"]


@pytest.mark.parametrize("path", ["sync", "async"])
async def test_one_model_call_is_one_tool_run_in_the_trace(
    store: InMemoryIdempotencyStore, path: str
) -> None:
    wrapped = idempotent(issue_refund, store)
    recorder = EventRecorder()
    config: RunnableConfig = {"configurable": {"idempotency_scope": "s"}, "callbacks": [recorder]}
    args = {"invoice_id": "I-1", "amount": 140}
    for call_id in ("c1", "c2"):  # a first run, then a replay
        if path == "sync":
            wrapped.invoke(call("issue_refund", args, call_id), config)
        else:
            await wrapped.ainvoke(call("issue_refund", args, call_id), config)
    assert len(recorder.tool_metadata) == 2  # not nested runs of the inner tool too


def test_the_inner_tools_own_callbacks_fire_once_per_call(store: InMemoryIdempotencyStore) -> None:
    recorder = EventRecorder()
    inner = StructuredTool.from_function(
        _ship,
        name="ship",
        description="Ship a parcel.",
        args_schema=ShipInput,
        callbacks=[recorder],
    )
    wrapped = idempotent(inner, store)
    with idempotency_scope("s"):
        wrapped.invoke({"parcel_id": "P-12", "to": {"street": "1 Main", "city": "Oslo"}})
    assert len(recorder.tool_metadata) == 1


def test_a_tool_gets_the_run_manager_and_config_it_asks_for(
    store: InMemoryIdempotencyStore,
) -> None:
    seen: dict[str, Any] = {}

    @tool
    def audited(order_id: str, config: RunnableConfig, callbacks: Any = None) -> str:
        """Refund an order, with the run's config and callbacks."""
        seen["config"], seen["callbacks"] = config, callbacks
        return order_id

    wrapped = idempotent(audited, store)
    with idempotency_scope("s"):
        wrapped.invoke({"order_id": "O-1"}, {"tags": ["batch-7"]})
    assert "batch-7" in seen["config"]["tags"]
    assert seen["config"]["metadata"]["idempotency_key"]  # the wrapper's run, with the key
    assert seen["callbacks"] is not None  # a child of the wrapper's tool run


def test_a_tool_that_overrides_invoke_is_still_called_through_it(
    store: InMemoryIdempotencyStore,
) -> None:
    class Audited(BaseTool):
        name: str = "audited"
        description: str = "Refund with an audit line written by invoke."
        audit: list[str] = Field(default_factory=list)

        def invoke(self, input: Any, config: RunnableConfig | None = None, **kw: Any) -> Any:
            self.audit.append("invoke")
            return super().invoke(input, config, **kw)

        def _run(self, order_id: str) -> str:
            return f"refunded {order_id}"

    inner = Audited()
    wrapped = idempotent(inner, store)
    with idempotency_scope("s"):
        assert wrapped.invoke({"order_id": "O-1"}) == "refunded O-1"
        assert wrapped.invoke({"order_id": "O-1"}) == "refunded O-1"  # replayed
    assert inner.audit == ["invoke"]


def test_a_plain_invoke_after_a_tool_call_invoke_gets_the_content_not_a_message(
    store: InMemoryIdempotencyStore,
) -> None:
    wrapped = idempotent(lookup_invoice, store)
    with idempotency_scope("mixed"):
        message = wrapped.invoke(call("lookup_invoice", {"invoice_id": "I-1"}, "c1"))
        assert isinstance(message, ToolMessage)
        assert wrapped.invoke({"invoice_id": "I-1"}) == "invoice I-1: $140"


def test_a_duplicate_that_waits_for_the_owner_dispatches_a_wait_event_and_replays(
    store: InMemoryIdempotencyStore,
) -> None:
    started, release = threading.Event(), threading.Event()
    effects = Effects()

    @tool
    def slow(invoice_id: str) -> str:
        """Slow."""
        started.set()
        release.wait(5)
        return f"slow #{effects.record('slow')}"

    # The owner finishes only once the duplicate has found its lease and started waiting.
    def on_event(event: IdempotencyEvent) -> None:
        if event.kind == "wait":
            release.set()

    wrapped = idempotent(slow, store, on_event=on_event)
    recorder = EventRecorder()
    config: RunnableConfig = {"configurable": {"idempotency_scope": "s"}, "callbacks": [recorder]}
    results: list[str] = []
    owner = threading.Thread(
        target=lambda: results.append(
            wrapped.invoke({"invoice_id": "I"}, {"configurable": {"idempotency_scope": "s"}})
        )
    )
    owner.start()
    assert started.wait(5)
    assert wrapped.invoke({"invoice_id": "I"}, config) == "slow #1"
    owner.join(5)
    assert results == ["slow #1"] and effects.count() == 1
    assert recorder.names() == ["idempotency.wait", "idempotency.replay"]


def test_a_takeover_and_a_lost_lease_are_dispatched_as_events() -> None:
    now = [1_000.0]
    store = InMemoryIdempotencyStore(clock=lambda: now[0])
    contexts: list[IdempotencyContext | None] = []

    @tool
    def refund(invoice_id: str) -> str:
        """Refund."""
        ctx = get_idempotency_context()
        contexts.append(ctx)
        if len(contexts) == 1:
            # While this run holds the lease, the store's clock jumps past it and another
            # worker takes the key over; the next renewal finds the lease lost.
            now[0] += 60
            with idempotency_scope("s"):
                takeover_result.append(wrapped.invoke({"invoice_id": "I-1"}, config))
            deadline = time.monotonic() + 5
            while ctx is not None and not ctx.lease_lost and time.monotonic() < deadline:
                time.sleep(0.01)
        return f"attempt {ctx.attempt if ctx else 0}"

    takeover_result: list[str] = []
    # Renewals every lease/3 = 0.33 s: long after the jump and takeover below.
    wrapped = idempotent(refund, store, lease=1.0, wait_timeout=1.0)
    recorder = EventRecorder()
    config: RunnableConfig = {"callbacks": [recorder]}
    with idempotency_scope("s"):
        stale = wrapped.invoke({"invoice_id": "I-1"}, config)
    assert takeover_result == ["attempt 2"]
    first, second = contexts
    assert first and second and second.takeover and second.fence == first.fence + 1
    assert first.lease_lost
    # Write-once: the late owner's result is not stored; it gets the stored one back.
    assert stale == "attempt 2"
    names = recorder.names()
    assert "idempotency.takeover" in names
    assert "idempotency.lease_lost" in names
    assert "idempotency.stale_completion" in names


def test_a_payload_mismatch_under_call_scope_is_dispatched_and_raised(
    store: InMemoryIdempotencyStore,
) -> None:
    wrapped = idempotent(issue_refund, store, scope="call")
    recorder = EventRecorder()
    config: RunnableConfig = {"configurable": {"thread_id": "t"}, "callbacks": [recorder]}
    wrapped.invoke(call("issue_refund", {"invoice_id": "I-1", "amount": 140}, "same-id"), config)
    with pytest.raises(PayloadMismatchError):
        wrapped.invoke(call("issue_refund", {"invoice_id": "I-1", "amount": 99}, "same-id"), config)
    assert recorder.names() == ["idempotency.payload_mismatch"]


def test_events_reach_on_event_hooks_with_the_tool_name(store: InMemoryIdempotencyStore) -> None:
    kinds: list[tuple[str, str | None]] = []
    wrapped = idempotent(lookup_invoice, store, on_event=lambda e: kinds.append((e.kind, e.tool)))
    with idempotency_scope("s"):
        wrapped.invoke({"invoice_id": "I-1"})
        wrapped.invoke({"invoice_id": "I-1"})
    assert kinds == [
        ("claim", "lookup_invoice"),
        ("complete", "lookup_invoice"),
        ("replay", "lookup_invoice"),
    ]


# -- a missing scope is the developer's mistake, never a tool failure for the model --------


def _never(error: Exception) -> str:
    return f"the model reads: {error}"


@pytest.mark.parametrize("handle_tool_errors", [True, (Exception,), _never])
@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_missing_thread_id_passes_through_tool_error_handling(
    handle_tool_errors: Any, mode: str
) -> None:
    effects: list[str] = []

    @tool
    def charge(card: str) -> str:
        """Charge a card."""
        effects.append(card)
        return "charged"

    model = ScriptedChatModel(then=on_each_turn(("charge", {"card": "4242"})))
    wrapped = idempotent(charge, InMemoryIdempotencyStore())
    graph = tool_graph(model, [wrapped], handle_tool_errors=handle_tool_errors)  # no checkpointer
    with pytest.raises(MissingScopeError, match="without a thread id"):
        if mode == "sync":
            graph.invoke({"messages": [HumanMessage("charge")]})
        else:
            await graph.ainvoke({"messages": [HumanMessage("charge")]})
    assert effects == []


def test_the_wrapper_never_stores_langgraph_control_flow() -> None:
    wrapped = idempotent(
        lookup_invoice, InMemoryIdempotencyStore(), terminal_exceptions=(Exception,)
    )
    assert GraphBubbleUp in wrapped.engine.never_terminal
