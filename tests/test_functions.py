"""Plain functions wrapped with ``idempotent(fn)``: the model sees what ``bind_tools([fn])``
showed, the wrapper is still callable as the function (once per key from a graph node), and
``@idempotent(store=...)`` is a decorator.

The function shapes are those of LangChain's templates: react-agent's ``search`` and
``get_weather`` (``langchain-ai/react-agent``, ``src/react_agent/tools.py``) and
memory-agent's ``upsert_memory`` (``langchain-ai/memory-agent``, ``src/memory_agent/tools.py``),
plus ``Annotated`` descriptions, defaults and a sync function with ``Args:``. No
``from __future__ import annotations`` here: the templates evaluate their annotations.
"""

import asyncio
import inspect
import uuid
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Optional

import pytest
from langchain.agents import create_agent
from langchain_core.callbacks import BaseCallbackManager, Callbacks
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, InjectedToolArg, tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.store.base import BaseStore
from langgraph.store.memory import InMemoryStore
from langgraph.types import RetryPolicy

from langchain_idempotent import (
    IdempotentTool,
    InMemoryIdempotencyStore,
    MissingScopeError,
    idempotency_scope,
    idempotent,
)
from langchain_idempotent.adapters.tool import IdempotentFunction
from tests.support.graphs import (
    Effects,
    EventRecorder,
    ScriptedChatModel,
    call,
    calls,
    thread,
    tool_graph,
    tool_results,
)

# -- the shapes of LangChain's templates ---------------------------------------------------


async def search(
    query: str, *, config: Annotated[RunnableConfig, InjectedToolArg]
) -> Optional[list[dict[str, Any]]]:  # noqa: UP045 (the template's spelling)
    """Search for general web results.

    This function performs a search using the Tavily search engine, which is designed
    to provide comprehensive, accurate, and trusted results. It's particularly useful
    for answering questions about current events.
    """
    return [{"query": query, "max_results": config["configurable"].get("max_search_results")}]


async def get_weather(
    location: str, *, config: Annotated[RunnableConfig, InjectedToolArg]
) -> Optional[dict[str, Any]]:  # noqa: UP045
    """Get the current weather for a given city or zip code.

    Args:
        location: Can be in formats:
            - City name (e.g., "London")
            - City name with country code (e.g., "London,GB")
            - US ZIP code (e.g., "90210")

    Note: The location must be properly formatted before calling this function.
    Invalid formats may result in no weather data being returned.
    """
    return {"location": location}


async def upsert_memory(
    content: str,
    context: str,
    *,
    memory_id: Optional[uuid.UUID] = None,  # noqa: UP045
    # Hide these arguments from the model.
    config: Annotated[RunnableConfig, InjectedToolArg],
    store: Annotated[BaseStore, InjectedToolArg],
) -> str:
    """Upsert a memory in the database.

    Args:
        content: The main content of the memory. For example:
            "User expressed interest in learning about French."
        context: Additional context for the memory. For example:
            "This was mentioned while discussing career options in Europe."
        memory_id: ONLY PROVIDE IF UPDATING AN EXISTING MEMORY.
        The memory to overwrite.
    """
    mem_id = memory_id or uuid.uuid4()
    await store.aput(
        ("memories", config["configurable"]["user_id"]),
        key=str(mem_id),
        value={"content": content, "context": context},
    )
    return f"Stored memory {memory_id}"


def lookup_order(
    order_id: Annotated[str, "The order's id, e.g. ORD-7."],
    include_items: Annotated[bool, "Whether to list the order's lines."] = False,
) -> str:
    """Look up an order."""
    return f"{order_id}: shipped" + (" (2 lines)" if include_items else "")


def issue_refund(invoice_id: str, amount: float, reason: str = "customer request") -> str:
    """Refund an invoice.

    Refunds go to the card the invoice was paid with.

    Args:
        invoice_id: The invoice to refund.
        amount: How much to refund, in dollars.
        reason: Why, as the customer put it.
    """
    return f"refunded {amount:g} on {invoice_id}"


SHAPES: list[Callable[..., Any]] = [search, get_weather, upsert_memory, lookup_order, issue_refund]
WITH_ARGS_SECTION = {get_weather, upsert_memory, issue_refund}
# (and search, whose indented body LangChain's tool(fn) keeps: every shape but lookup_order)


@pytest.fixture
def store() -> InMemoryIdempotencyStore:
    return InMemoryIdempotencyStore()


class BoundSchemas(ScriptedChatModel):
    """A scripted model that records what ``bind_tools`` would send a provider."""

    bound: list[dict[str, Any]] = []

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> "BoundSchemas":
        self.bound = [convert_to_openai_tool(t) for t in tools]
        return self


# -- what the model sees -------------------------------------------------------------------


@pytest.mark.parametrize("fn", SHAPES, ids=lambda fn: fn.__name__)
def test_the_model_sees_what_bind_tools_showed_for_the_function(
    fn: Callable[..., Any], store: InMemoryIdempotencyStore
) -> None:
    wrapped = idempotent(fn, store=store)
    assert convert_to_openai_tool(wrapped) == convert_to_openai_tool(fn)


@pytest.mark.parametrize(
    "fn", [search, get_weather, upsert_memory, issue_refund], ids=lambda fn: fn.__name__
)
def test_the_summary_and_args_descriptions_reach_the_model_where_tool_fn_loses_them(
    fn: Callable[..., Any], store: InMemoryIdempotencyStore
) -> None:
    """The shapes on which LangChain's two paths disagree: ``tool(fn)`` (the way the
    wrapper built the tool before) shows the whole indented docstring."""
    shown = convert_to_openai_tool(idempotent(fn, store=store))["function"]
    as_tool = convert_to_openai_tool(tool(fn))["function"]
    assert shown != as_tool
    assert "\n    " in as_tool["description"]
    assert "\n    " not in shown["description"].split("\n", 1)[0]
    if fn in WITH_ARGS_SECTION:
        assert "Args:" in as_tool["description"] and "Args:" not in shown["description"]
        described = [p for p in shown["parameters"]["properties"].values() if "description" in p]
        assert described and not any(
            "description" in p for p in as_tool["parameters"]["properties"].values()
        )


def test_annotated_descriptions_and_defaults_are_shown(store: InMemoryIdempotencyStore) -> None:
    params = convert_to_openai_tool(idempotent(lookup_order, store=store))["function"]
    assert params["parameters"] == {
        "properties": {
            "order_id": {"description": "The order's id, e.g. ORD-7.", "type": "string"},
            "include_items": {
                "default": False,
                "description": "Whether to list the order's lines.",
                "type": "boolean",
            },
        },
        "required": ["order_id"],
        "type": "object",
    }


@pytest.mark.parametrize("fn", SHAPES, ids=lambda fn: fn.__name__)
def test_create_agent_sends_the_model_the_same_schema_as_bind_tools(
    fn: Callable[..., Any], store: InMemoryIdempotencyStore
) -> None:
    model = BoundSchemas(script=[])
    create_agent(model, tools=[idempotent(fn, store=store)]).invoke({"messages": ["hi"]})
    assert model.bound == [convert_to_openai_tool(fn)]


def test_create_agent_with_the_bare_function_shows_tool_fn_instead(
    store: InMemoryIdempotencyStore,
) -> None:
    """Where LangChain's two paths differ for an unwrapped function (documented in
    docs/functions.md): create_agent converts it with tool(fn), bind_tools parses it."""
    model = BoundSchemas(script=[])
    create_agent(model, tools=[issue_refund]).invoke({"messages": ["hi"]})
    assert model.bound == [convert_to_openai_tool(tool(issue_refund))]
    assert model.bound != [convert_to_openai_tool(issue_refund)]


def test_a_config_parameter_is_filled_by_the_run_not_asked_of_the_model(
    store: InMemoryIdempotencyStore,
) -> None:
    """The one place the schema departs from bind_tools: bind_tools shows a
    ``config: RunnableConfig`` parameter (no InjectedToolArg) as an argument for the model
    to fill in; a tool run fills it in itself, so the wrapped tool does not show it."""

    def charge(card: str, config: RunnableConfig) -> str:
        """Charge a card.

        Args:
            card: The card's token.
        """
        return f"charged {card} for {config['configurable']['thread_id']}"

    bound = convert_to_openai_tool(charge)["function"]
    shown = convert_to_openai_tool(idempotent(charge, store=store))["function"]
    assert "config" in bound["parameters"]["properties"]
    del bound["parameters"]["properties"]["config"]
    bound["parameters"]["required"].remove("config")
    assert shown == bound
    with idempotency_scope("order-1"):
        assert idempotent(charge, store=store)("tok", {"configurable": {"thread_id": "T"}}) == (
            "charged tok for T"
        )


def test_a_docstring_the_parser_refuses_is_shown_whole_as_tool_fn_shows_it(
    store: InMemoryIdempotencyStore,
) -> None:
    def cancel(order_id: str) -> str:
        """Cancel an order.

        Args:
            order: The order.
        """
        return order_id

    with pytest.raises(ValueError, match="Arg order in docstring not found"):
        convert_to_openai_tool(cancel)  # bind_tools refuses it
    shown = convert_to_openai_tool(idempotent(cancel, store=store))
    assert shown == convert_to_openai_tool(tool(cancel))
    assert "Args:" in shown["function"]["description"]


def test_a_function_without_a_docstring_is_refused_as_tool_fn_refuses_it(
    store: InMemoryIdempotencyStore,
) -> None:
    def cancel(order_id: str) -> str:
        return order_id

    with pytest.raises(ValueError, match="must have a docstring"):
        idempotent(cancel, store=store)


# -- callable as the function --------------------------------------------------------------


def _retried_node_graph(node: Callable[..., Any]) -> Any:
    """One node that LangGraph retries after a ConnectionError, with a checkpointer."""
    builder = StateGraph(MessagesState)
    builder.add_node(
        "act", node, retry_policy=RetryPolicy(retry_on=ConnectionError, initial_interval=0.01)
    )
    builder.add_edge(START, "act")
    return builder.compile(checkpointer=InMemorySaver())


def _refund(effects: Effects) -> Callable[..., str]:
    def refund(invoice_id: str, amount: float, reason: str = "customer request") -> str:
        """Refund an invoice.

        Args:
            invoice_id: The invoice to refund.
            amount: How much to refund, in dollars.
            reason: Why.
        """
        n = effects.record("refund", invoice_id=invoice_id, amount=amount)
        return f"refund #{n}: {amount:g} on {invoice_id}"

    return refund


@pytest.mark.parametrize("wrapped", [False, True], ids=["plain", "idempotent"])
def test_a_function_called_from_a_node_runs_once_when_the_node_is_retried(
    wrapped: bool, store: InMemoryIdempotencyStore
) -> None:
    effects = Effects()
    refund = _refund(effects)
    if wrapped:
        refund = idempotent(refund, store=store)
    outages = iter([ConnectionError("mail API timed out")])

    def act(state: MessagesState) -> dict[str, Any]:
        answer = refund("INV-7", 140)  # then the e-mail, which fails once
        if error := next(outages, None):
            raise error
        return {"messages": [AIMessage(answer)]}

    out = _retried_node_graph(act).invoke({"messages": [HumanMessage("refund")]}, thread("T-1"))
    assert effects.count("refund") == (1 if wrapped else 2)
    assert out["messages"][-1].content == ("refund #1" if wrapped else "refund #2") + (
        ": 140 on INV-7"
    )


@pytest.mark.parametrize("wrapped", [False, True], ids=["plain", "idempotent"])
async def test_memory_agents_node_stores_each_memory_once_when_retried(
    wrapped: bool, store: InMemoryIdempotencyStore
) -> None:
    """memory-agent's ``store_memory`` node, as the template writes it: the tool function
    called for each tool call with the node's config and store, concurrently."""
    # No options: the BaseStore handle it injects with InjectedToolArg is never a key
    # input, and its injected config is keyed by what the tool reads of it.
    upsert = idempotent(upsert_memory, store=store) if wrapped else upsert_memory
    outages = iter([ConnectionError("vector index timed out")])
    asked = calls(
        call("upsert_memory", {"content": "likes French", "context": "career chat"}),
        call("upsert_memory", {"content": "lives in Lyon", "context": "intro"}),
    )

    async def store_memory(
        state: MessagesState, config: RunnableConfig, *, store: BaseStore
    ) -> dict[str, Any]:
        tool_calls = state["messages"][-1].tool_calls
        saved = await asyncio.gather(
            *(upsert(**tc["args"], config=config, store=store) for tc in tool_calls)
        )
        if error := next(outages, None):
            raise error
        results = [
            {"role": "tool", "content": mem, "tool_call_id": tc["id"]}
            for tc, mem in zip(tool_calls, saved, strict=True)
        ]
        return {"messages": results}

    builder = StateGraph(MessagesState)
    builder.add_node(
        store_memory,
        retry_policy=RetryPolicy(retry_on=ConnectionError, initial_interval=0.01),
    )
    builder.add_edge(START, "store_memory")
    memories = InMemoryStore()
    graph = builder.compile(checkpointer=InMemorySaver(), store=memories)
    out = await graph.ainvoke({"messages": [asked]}, thread("T-1", user_id="alice"))

    stored = await memories.asearch(("memories", "alice"))
    assert sorted(m.value["content"] for m in stored) == (
        ["likes French", "lives in Lyon"]
        if wrapped
        else ["likes French", "likes French", "lives in Lyon", "lives in Lyon"]
    )
    assert [content for _, content in tool_results(out["messages"])] == ["Stored memory None"] * 2


def test_a_config_parameter_left_out_of_the_call_is_the_nodes_config(
    store: InMemoryIdempotencyStore,
) -> None:
    seen: list[tuple[str, str]] = []

    def charge(card: str, *, config: RunnableConfig) -> str:
        """Charge a card."""
        seen.append((config["configurable"]["thread_id"], config["metadata"]["langgraph_node"]))
        return "charged"

    wrapped = idempotent(charge, store=store)

    def bill(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage(wrapped("tok"))]}

    builder = StateGraph(MessagesState)
    builder.add_node("bill", bill)
    builder.add_edge(START, "bill")
    graph = builder.compile(checkpointer=InMemorySaver())
    for _ in range(2):  # the second turn of the thread replays: one effect per thread
        graph.invoke({"messages": [HumanMessage("pay")]}, thread("T-9"))
    assert seen == [("T-9", "bill")]


def test_calling_outside_a_graph_needs_a_scope_as_invoke_does(
    store: InMemoryIdempotencyStore,
) -> None:
    effects = Effects()
    refund = idempotent(_refund(effects), store=store)
    with pytest.raises(MissingScopeError):
        refund("INV-7", 140)
    with pytest.raises(MissingScopeError):
        refund.invoke({"invoice_id": "INV-7", "amount": 140})
    assert effects.count() == 0
    with idempotency_scope("order-7"):
        first = refund("INV-7", 140)
        again = refund(invoice_id="INV-7", amount=140.0, reason="customer request")
    assert first == again == "refund #1: 140 on INV-7"
    assert effects.count("refund") == 1


def test_a_call_and_a_tool_invoke_with_the_same_arguments_are_one_effect(
    store: InMemoryIdempotencyStore,
) -> None:
    effects = Effects()
    refund = idempotent(_refund(effects), store=store)
    with idempotency_scope("order-7"):
        assert refund("INV-7", 140) == refund.invoke({"invoice_id": "INV-7", "amount": 140})
        assert refund("INV-7", 90) == "refund #2: 90 on INV-7"
    assert effects.count("refund") == 2


def test_arguments_that_do_not_fit_the_function_are_refused_naming_it(
    store: InMemoryIdempotencyStore,
) -> None:
    refund = idempotent(_refund(Effects()), store=store)
    with pytest.raises(TypeError, match=r"refund\(\): missing a required argument: 'amount'"):
        refund("INV-7")
    with pytest.raises(TypeError, match=r"refund\(\): got an unexpected keyword argument 'x'"):
        refund("INV-7", 1, x=2)


def test_callbacks_passed_to_the_call_are_the_tool_runs_handlers(
    store: InMemoryIdempotencyStore,
) -> None:
    handler = EventRecorder()
    given: list[Any] = []

    def refund(invoice_id: str, callbacks: Callbacks = None) -> str:
        """Refund an invoice."""
        given.append(callbacks)
        return "refunded"

    def cancel(invoice_id: str, run_manager: Any = None) -> str:
        """Cancel an invoice."""
        return "cancelled"

    wrapped = idempotent(refund, store=store)
    with idempotency_scope("order-7"):
        assert wrapped("INV-7", callbacks=[handler]) == "refunded"
        with pytest.raises(TypeError, match=r"cancel\(\): run_manager is LangChain's"):
            idempotent(cancel, store=store)("INV-7", run_manager=None)
    assert ["idempotency_key" in m for m in handler.tool_metadata] == [True]
    assert isinstance(given[0], BaseCallbackManager) and handler in given[0].handlers


async def test_calling_a_wrapped_async_function_returns_an_awaitable(
    store: InMemoryIdempotencyStore,
) -> None:
    weather = idempotent(get_weather, store=store)
    with idempotency_scope("trip"):
        pending = weather("London,GB", config={"configurable": {}})
        assert inspect.isawaitable(pending)
        assert await pending == {"location": "London,GB"}


def test_the_wrapped_function_is_still_a_tool(store: InMemoryIdempotencyStore) -> None:
    wrapped = idempotent(issue_refund, store=store)
    assert isinstance(wrapped, IdempotentFunction) and isinstance(wrapped, IdempotentTool)
    with pytest.raises(ValueError, match="already idempotent"):
        idempotent(wrapped, store=store)
    # a tool is not a function: wrapping one gives a tool that is not callable, as it was
    assert not callable(idempotent(tool(issue_refund), store=store))


async def test_react_agents_search_runs_once_in_a_retried_tool_node(
    store: InMemoryIdempotencyStore,
) -> None:
    """react-agent's ``search`` in its ToolNode: the config it reads is filled in by the
    tool run, and a retried node replays it."""
    effects = Effects()

    async def search(
        query: str, *, config: Annotated[RunnableConfig, InjectedToolArg]
    ) -> list[dict[str, Any]]:
        """Search for general web results.

        This function performs a search using the Tavily search engine.
        """
        effects.record("search", query=query)
        return [{"query": query, "max": config["configurable"]["max_search_results"]}]

    async def fail_once(query: str) -> str:
        """Fails once."""
        if effects.record("fail_once") == 1:
            raise ConnectionError("search API reset")
        return "ok"

    script = [calls(call("search", {"query": "weather"}), call("fail_once", {"query": "x"}))]
    graph = tool_graph(
        ScriptedChatModel(script=script),
        idempotent([search, fail_once], store=store),
        checkpointer=InMemorySaver(),
        retry_policy=RetryPolicy(retry_on=ConnectionError, initial_interval=0.01),
    )
    out = await graph.ainvoke(
        {"messages": [HumanMessage("hi")]}, thread("T-1", max_search_results=3)
    )
    assert effects.count("search") == 1 and effects.count("fail_once") == 2
    assert tool_results(out["messages"])[0][1] == '[{"query": "weather", "max": 3}]'


# -- the decorator -------------------------------------------------------------------------


@pytest.mark.parametrize("above_tool", [False, True], ids=["on a function", "above @tool"])
def test_the_decorator_wraps_the_function_or_the_tool_below_it(
    above_tool: bool, store: InMemoryIdempotencyStore
) -> None:
    effects = Effects()

    @idempotent(store=store, namespace="billing")
    @(tool(parse_docstring=True) if above_tool else lambda fn: fn)
    def refund(invoice_id: str, amount: float) -> str:
        """Refund an invoice.

        Args:
            invoice_id: The invoice to refund.
            amount: How much.
        """
        effects.record("refund", invoice_id=invoice_id)
        return "refunded"

    assert type(refund) is (IdempotentTool if above_tool else IdempotentFunction)
    assert refund.policy.namespace == "billing"
    params = convert_to_openai_tool(refund)["function"]["parameters"]["properties"]
    assert params["amount"]["description"] == "How much."
    with idempotency_scope("order-7"):
        refund.invoke({"invoice_id": "INV-7", "amount": 140})
        if not above_tool:  # the function stays callable; a tool never was
            assert refund("INV-7", 140) == "refunded"
    assert effects.count("refund") == 1


def test_tool_above_the_decorator_is_refused_at_definition_not_shown_wrong(
    store: InMemoryIdempotencyStore,
) -> None:
    """LangChain's ``tool()`` takes any BaseTool for a Runnable and would show the model
    its ``repr`` as the description; given the wrapper, it refuses at definition."""
    with pytest.raises(ValueError, match="IdempotentFunction"):

        @tool
        @idempotent(store=store)
        def refund(invoice_id: str) -> str:
            """Refund an invoice."""
            return "refunded"


def test_the_decorator_needs_its_store_by_keyword(store: InMemoryIdempotencyStore) -> None:
    with pytest.raises(TypeError, match=r"@idempotent\(store=\.\.\.\)"):
        idempotent(store)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="needs a store"):

        @idempotent  # type: ignore[call-overload]
        def refund(invoice_id: str) -> str:
            """Refund an invoice."""
            return "refunded"


def test_a_list_of_functions_gives_callable_tools(store: InMemoryIdempotencyStore) -> None:
    tools: list[BaseTool] = idempotent([issue_refund, lookup_order], store=store)
    assert all(isinstance(t, IdempotentFunction) for t in tools)
    with idempotency_scope("order-7"):
        assert tools[1]("ORD-7", include_items=True) == "ORD-7: shipped (2 lines)"  # type: ignore[operator]
