"""Each private LangChain / LangGraph API that ``_compat.py`` relies on still exists and
behaves as relied on (and those of its siblings beside their one user: LangGraph's msgpack
serde in ``core/_compat.py``, psycopg_pool in ``stores/postgres/_compat.py``). A failure
names the API that moved: fix that ``_compat`` module (and nothing else: no other module
touches these)."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any

import pytest
from langchain_core.callbacks import CallbackManagerForToolRun
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, InjectedToolCallId, tool
from langgraph.errors import GraphBubbleUp
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

import langchain_idempotent
from langchain_idempotent import MissingScopeError
from langchain_idempotent.adapters import _compat


def moved(api: str) -> str:
    return (
        f"LangChain/LangGraph moved or changed {api}, which the library's _compat.py relies "
        "on: update that _compat.py for this release (its docstring lists the supported ranges)"
    )


def test_get_runnable_config_param_finds_the_config_parameter() -> None:
    try:
        from langchain_core.tools.base import _get_runnable_config_param
    except ImportError:
        pytest.fail(moved("langchain_core.tools.base._get_runnable_config_param"))

    def run(x: int, cfg: RunnableConfig) -> int:
        return x

    assert _get_runnable_config_param(run) == "cfg", moved("_get_runnable_config_param")


def test_format_output_makes_the_tool_message_base_tool_would() -> None:
    try:
        from langchain_core.tools.base import _format_output  # noqa: F401
    except ImportError:
        pytest.fail(moved("langchain_core.tools.base._format_output"))
    message = _compat.format_tool_output({"refund": 140}, None, "call-1", "issue_refund")
    assert isinstance(message, ToolMessage), moved("_format_output")
    assert (message.content, message.tool_call_id, message.name, message.status) == (
        '{"refund": 140}',
        "call-1",
        "issue_refund",
        "success",
    ), moved("_format_output")
    assert _compat.format_tool_output(("c", [1]), None, None, "t") == ("c", [1])
    own = ToolMessage("x", tool_call_id="call-1")
    assert _compat.format_tool_output(own, None, "call-2", "t") is own, moved("_format_output")


def test_base_tool_parses_and_reports_injected_arguments() -> None:
    @tool
    def close(ticket: str, call_id: Annotated[str, InjectedToolCallId]) -> str:
        """Close a ticket."""
        return ticket

    assert hasattr(BaseTool, "_injected_args_keys"), moved("BaseTool._injected_args_keys")
    assert hasattr(BaseTool, "_to_args_and_kwargs"), moved("BaseTool._to_args_and_kwargs")
    assert _compat.injected_args_keys(close) >= {"call_id"}, moved("_injected_args_keys")
    args, kwargs = _compat.to_args_and_kwargs(close, {"ticket": "T-1"}, "call-9")
    assert (args, kwargs) == ((), {"ticket": "T-1", "call_id": "call-9"}), moved(
        "BaseTool._to_args_and_kwargs"
    )


def test_a_tools_own_run_is_called_directly_with_its_run_manager_and_config() -> None:
    seen: dict[str, Any] = {}

    class Refund(BaseTool):
        name: str = "refund"
        description: str = "Refund."

        def _run(
            self,
            amount: int,
            run_manager: CallbackManagerForToolRun | None = None,
            *,
            cfg: RunnableConfig,
        ) -> str:
            seen.update(run_manager=run_manager, config=cfg)
            return f"refunded {amount}"

    direct = _compat.DirectCall.of(Refund())
    assert direct is not None, moved("BaseTool._run's calling convention")
    config: RunnableConfig = {"tags": ["t"]}
    marker: Any = object()
    assert direct.run((3,), {}, config=config, run_manager=marker) == "refunded 3"
    assert seen == {"run_manager": marker, "config": config}, moved(
        "BaseTool._run (run_manager / RunnableConfig parameters)"
    )


async def test_a_tools_own_arun_is_called_directly() -> None:
    @tool
    async def notify(to: str) -> str:
        """Notify."""
        return f"sent to {to}"

    direct = _compat.DirectCall.of(notify)
    assert direct is not None, moved("StructuredTool._arun's signature")
    result = await direct.arun((), {"to": "a@b"}, config={}, run_manager=None)
    assert result == "sent to a@b", moved("StructuredTool._arun")


def test_a_running_graph_exposes_its_state_to_a_tool() -> None:
    seen: list[Any] = []

    @tool
    def peek(x: int, config: RunnableConfig) -> str:
        """Peek at the graph state."""
        assert _compat.PREGEL_READ in (config.get("configurable") or {}), moved(
            f"LangGraph's configurable[{_compat.PREGEL_READ!r}]"
        )
        seen.append(_compat.graph_state_messages(config))
        return "ok"

    builder = StateGraph(MessagesState)
    builder.add_node("tools", ToolNode([peek]))
    builder.add_edge(START, "tools")
    call = {"name": "peek", "args": {"x": 1}, "id": "c1", "type": "tool_call"}
    builder.compile().invoke(
        {"messages": [HumanMessage("hi", id="h1"), AIMessage("", tool_calls=[call])]}
    )
    [messages] = seen
    assert [m.id for m in messages][:1] == ["h1"], moved(f"configurable[{_compat.PREGEL_READ!r}]")
    assert _compat.graph_state_messages({}) is None


def test_a_task_on_a_time_travel_branch_sees_the_checkpoint_that_started_it() -> None:
    from langgraph.checkpoint.memory import InMemorySaver

    seen: list[str | None] = []

    def step(state: MessagesState, config: RunnableConfig) -> dict[str, Any]:
        configurable = config.get("configurable") or {}
        for name in (_compat.PREGEL_CHECKPOINTER, "checkpoint_map"):
            assert name in configurable, moved(f"LangGraph's configurable[{name!r}]")
        seen.append(_compat.forked_from(config))
        return {}

    builder = StateGraph(MessagesState)
    builder.add_node("first", lambda state: {})
    builder.add_node("step", step)
    builder.add_edge(START, "first")
    builder.add_edge("first", "step")
    graph = builder.compile(checkpointer=InMemorySaver())
    config: RunnableConfig = {"configurable": {"thread_id": "t"}}
    graph.invoke({"messages": []}, config)
    before = next(s for s in graph.get_state_history(config) if s.next == ("step",))
    graph.invoke(None, before.config)  # resumed from an earlier checkpoint: a "fork"
    branch = graph.update_state(before.config, {"messages": []}, as_node="first")
    graph.invoke(None, branch)  # an update_state branch: "update"
    sources = {
        s.config["configurable"]["checkpoint_id"]: s.metadata.get("source")
        for s in graph.get_state_history(config)
    }
    assert seen[0] is None
    assert [sources.get(cid or "") for cid in seen[1:]] == ["fork", "update"], moved(
        "LangGraph's checkpoint metadata source 'fork' / 'update'"
    )
    assert _compat.forked_from({}) is None


def test_langgraph_still_names_its_config_keys_as_compat_does() -> None:
    try:
        from langgraph._internal._constants import CONFIG_KEY_READ, CONFIG_KEY_SCRATCHPAD
    except ImportError:
        pytest.fail(moved("langgraph._internal._constants.CONFIG_KEY_READ / _SCRATCHPAD"))
    assert CONFIG_KEY_READ == _compat.PREGEL_READ, moved("CONFIG_KEY_READ")
    assert CONFIG_KEY_SCRATCHPAD == _compat.PREGEL_SCRATCHPAD, moved("CONFIG_KEY_SCRATCHPAD")


def test_a_task_has_a_scratchpad_whose_interrupt_counter_is_shared_and_counts_positions() -> None:
    """What approval's per-task turns rely on: every call of one ToolNode task sees the same
    scratchpad; its interrupt counter is one object per run of the task that counts the
    task's ``interrupt()`` calls; a re-run of the task gets a new counter."""
    seen: list[tuple[Any, Any]] = []

    @tool
    def peek(x: int, config: RunnableConfig) -> str:
        """Look at the task's scratchpad."""
        scratchpad = _compat.task_scratchpad(config)
        assert scratchpad is not None, moved(
            f"LangGraph's configurable[{_compat.PREGEL_SCRATCHPAD!r}]"
        )
        seen.append((scratchpad, _compat.interrupt_counter(scratchpad)))
        return "ok"

    builder = StateGraph(MessagesState)
    builder.add_node("tools", ToolNode([peek]))
    builder.add_edge(START, "tools")
    two = [{"name": "peek", "args": {"x": i}, "id": f"c{i}", "type": "tool_call"} for i in (1, 2)]
    graph = builder.compile()
    graph.invoke({"messages": [AIMessage("", tool_calls=two)]})
    (pad_a, counter_a), (pad_b, counter_b) = seen
    assert pad_a is pad_b and counter_a is counter_b, moved("one scratchpad per task")
    assert [counter_a(), counter_a()] == [0, 1], moved("scratchpad.interrupt_counter()")
    graph.invoke({"messages": [AIMessage("", tool_calls=two[:1])]})
    assert seen[-1][1] is not counter_a, moved("a new interrupt counter per run of a task")
    assert _compat.task_scratchpad({}) is None


def test_a_tasks_answers_are_matched_to_its_interrupts_by_position() -> None:
    """LangGraph hands the n-th answer of a task to its n-th ``interrupt()``, whatever the
    question was: why ``_asking`` records which call each position asked about."""
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.types import Command, interrupt

    got: list[Any] = []

    def node(state: MessagesState) -> dict[str, Any]:
        got.append((interrupt("first?"), interrupt("second?")))
        return {}

    builder = StateGraph(MessagesState)
    builder.add_node("node", node)
    builder.add_edge(START, "node")
    graph = builder.compile(checkpointer=InMemorySaver())
    config: RunnableConfig = {"configurable": {"thread_id": "positions"}}
    graph.invoke({"messages": []}, config)
    graph.invoke(Command(resume="a"), config)
    graph.invoke(Command(resume="b"), config)
    assert got == [("a", "b")], moved("position-matched resumes within one task")


@pytest.mark.parametrize("handle_tool_errors", [True, (Exception,)])
def test_tool_node_lets_graph_bubble_up_through_its_error_handling(
    handle_tool_errors: Any,
) -> None:
    @tool
    def broken(x: int) -> str:
        """Fails as a misconfigured idempotent tool does."""
        raise _compat.loud(MissingScopeError("no thread id"))

    builder = StateGraph(MessagesState)
    builder.add_node("tools", ToolNode([broken], handle_tool_errors=handle_tool_errors))
    builder.add_edge(START, "tools")
    call = {"name": "broken", "args": {"x": 1}, "id": "c1", "type": "tool_call"}
    with pytest.raises(MissingScopeError, match="no thread id") as raised:
        builder.compile().invoke({"messages": [AIMessage("", tool_calls=[call])]})
    assert isinstance(raised.value, GraphBubbleUp), moved("ToolNode's GraphBubbleUp handling")


def private_touches(source: str, name: str) -> list[str]:
    """Private LangChain / LangGraph use in one module: private imports, LangGraph's
    ``"__pregel_*"`` config keys, and underscore attributes read with ``getattr``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            ("langchain", "langgraph")
        ):
            private = [a.name for a in node.names if a.name.startswith("_")]
            if private or "._" in (node.module or ""):
                found.append(f"{name}: from {node.module} import {private}")
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value.startswith("__pregel_")
        ):
            found.append(f"{name}: {node.value!r}")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and node.args[1].value.startswith("_")
        ):
            found.append(f"{name}: getattr(..., {node.args[1].value!r})")
    return found


def _offenders() -> list[str]:
    package = Path(langchain_idempotent.__file__).parent
    offenders = []
    for path in package.rglob("*.py"):
        if not path.name.endswith("_compat.py"):
            offenders += private_touches(path.read_text(encoding="utf-8"), path.name)
    return offenders


def test_no_other_module_touches_private_langchain_or_langgraph_names() -> None:
    try:
        offenders = _offenders()
    except SystemError:  # CPython 3.11.7's ast after a RecursionError earlier in this
        # process (gh-106905, fixed in 3.11.8): parse again in a fresh interpreter
        done = subprocess.run(
            [sys.executable, "-c", "from tests.test_compat import _offenders; print(_offenders())"],
            cwd=Path(__file__).resolve().parents[1],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        offenders = ast.literal_eval(done.stdout.strip())
    assert offenders == [], "private LangChain/LangGraph use outside _compat.py"


@pytest.mark.parametrize(
    "source",
    [
        "from langgraph._internal._constants import CONFIG_KEY_SCRATCHPAD",
        "from langchain_core.tools.base import _format_output",
        "pad = config['configurable']['__pregel_scratchpad']",
        "x = '__pregel_send'",
        "counter = getattr(scratchpad, '_counter', None)",
    ],
)
def test_the_private_use_guard_sees_each_kind_of_touch(source: str) -> None:
    assert private_touches(source, "m.py") != []


def test_compat_lists_its_supported_ranges() -> None:
    doc = inspect.getdoc(_compat) or ""
    for package in ("langchain-core", "langgraph", "langchain"):
        assert f"``{package}``" in doc


def test_psycopg_pool_keeps_its_idle_connections_where_the_postgres_store_reads_them() -> None:
    pytest.importorskip("psycopg_pool")
    from collections import deque

    from psycopg_pool import AsyncConnectionPool

    pool = AsyncConnectionPool("postgresql://127.0.0.1:1/none", open=False)
    idle = getattr(pool, "_pool", None)
    assert isinstance(idle, deque), moved("psycopg_pool.AsyncConnectionPool._pool (idle deque)")
    marker = object()
    idle.append(marker)
    from langchain_idempotent.stores.postgres._compat import idle_connections

    assert idle_connections(pool) == [marker]
    assert idle_connections(object()) == []  # moved: the store closes none itself


def test_the_injected_call_id_parameter_is_found_even_outside_a_custom_schema() -> None:
    from pydantic import BaseModel

    class Input(BaseModel):
        x: int

    @tool(args_schema=Input)
    def echo(x: int, tool_call_id: Annotated[str, InjectedToolCallId]) -> str:
        """Echo."""
        return str(x)

    assert _compat.injected_call_id_names(echo) == ["tool_call_id"], moved(
        "langchain_core.tools.base._is_injected_arg_type"
    )


def test_a_nested_graph_reads_the_outermost_graphs_messages_from_its_checkpoint() -> None:
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import END

    seen: list[Any] = []

    def inner(state: MessagesState, config: RunnableConfig) -> dict[str, Any]:
        seen.append(_compat.root_state_messages(config))
        return {}

    sub = StateGraph(MessagesState)
    sub.add_node("inner", inner)
    sub.add_edge(START, "inner")
    sub.add_edge("inner", END)
    subgraph = sub.compile()

    def outer(state: MessagesState, config: RunnableConfig) -> dict[str, Any]:
        subgraph.invoke({"messages": [HumanMessage("made afresh", id="sub-1")]}, config)
        return {}

    parent = StateGraph(MessagesState)
    parent.add_node("outer", outer)
    parent.add_edge(START, "outer")
    parent.add_edge("outer", END)
    graph = parent.compile(checkpointer=InMemorySaver())
    graph.invoke(
        {"messages": [HumanMessage("the user", id="u-1")]}, {"configurable": {"thread_id": "t"}}
    )
    [messages] = seen
    assert [m.id for m in messages] == ["u-1"], moved("configurable checkpointer / checkpoint_map")


def test_langgraphs_msgpack_helpers_that_result_storage_uses_still_exist() -> None:
    import uuid

    import ormsgpack
    from langgraph.checkpoint.serde import jsonplus
    from langgraph.types import Send

    from langchain_idempotent.core import _compat as _codec_compat

    safe = _codec_compat.safe_msgpack_types()
    assert ("langchain_core.messages.tool", "ToolMessage") in safe, moved("SAFE_MSGPACK_TYPES")
    assert ("zoneinfo", "ZoneInfo") in safe, moved("SAFE_MSGPACK_TYPES")
    ext = _codec_compat.langgraph_msgpack_default(uuid.UUID(int=1))
    assert isinstance(ext, ormsgpack.Ext), moved("jsonplus._msgpack_default")
    send = _codec_compat.send_from_args(["node", {"x": 1}])
    assert isinstance(send, Send) and send.node == "node", moved("jsonplus._send_from_args")
    for name in [n for n in _codec_compat.__all__ if n.startswith("EXT_")]:
        assert getattr(jsonplus, name) == getattr(_codec_compat, name), moved(f"jsonplus.{name}")
