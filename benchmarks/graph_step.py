"""The LangGraph case: one graph step whose ``ToolNode`` calls a no-op tool.

``START -> tools -> END`` with an in-memory checkpointer (``InMemorySaver``), invoked with
an ``AIMessage`` carrying one tool call. ``messages`` is overwritten, not appended, so a
thread invoked again does not grow its state. The same graph is built with the tool as is
and with the tool wrapped by :func:`langchain_idempotent.idempotent`; the difference per
invoke is what the wrapper costs inside LangGraph.
"""

from __future__ import annotations

from typing import Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.prebuilt import ToolNode

__all__ = ["ToolCounter", "build_floor_step", "build_step", "step_input"]


class StepState(TypedDict):
    messages: list[AnyMessage]


class ToolCounter:
    def __init__(self) -> None:
        self.n = 0

    def count(self) -> int:
        return self.n


def _noop_tool(counter: ToolCounter) -> BaseTool:
    @tool
    def noop(order_id: str, amount: int) -> str:
        """Do nothing and say so (the benchmark's side effect is a counter)."""
        counter.n += 1
        return "ok"

    return noop


def step_input() -> dict[str, Any]:
    call = {"name": "noop", "args": {"order_id": "A-1", "amount": 140}, "id": "call_1"}
    return {"messages": [AIMessage(content="", tool_calls=[call])]}


def build_step(store: Any | None) -> tuple[Any, ToolCounter]:
    """The compiled graph (tool wrapped when ``store`` is given) and its execution counter."""
    counter = ToolCounter()
    noop = _noop_tool(counter)
    if store is not None:
        from . import ours

        noop = ours.wrap(noop, store)
    return _compiled(noop), counter


def build_floor_step(floor: Any) -> tuple[Any, ToolCounter]:
    """The same step, its tool unwrapped but doing what any two-round-trip protocol must:
    ``floor.run(key, action)`` (:class:`benchmarks.floor.LuaFloor`: one claim script, the
    action, one complete script; a thread invoked again replays in one round trip), keyed
    by the thread. No key derivation, fences, events or serialization: the cost of the
    round trips themselves inside a ToolNode step."""
    counter = ToolCounter()

    @tool
    def noop(order_id: str, amount: int, config: RunnableConfig) -> str:
        """Do nothing and say so (the benchmark's side effect is a counter)."""

        def act() -> str:
            counter.n += 1
            return "ok"

        answer = floor.run(f"graph-floor:{config['configurable']['thread_id']}", act)
        return answer if isinstance(answer, str) else answer.decode()

    return _compiled(noop), counter


def _compiled(noop: BaseTool) -> Any:
    graph = StateGraph(StepState)
    graph.add_node("tools", ToolNode([noop]))
    graph.add_edge(START, "tools")
    graph.add_edge("tools", END)
    return graph.compile(checkpointer=InMemorySaver())
