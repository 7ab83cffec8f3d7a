"""A pytest plugin that runs another library's own tests with every tool made idempotent.

Loaded with ``-p idempotent_peer`` (``tests/peer`` on ``sys.path``) by
``python tests/peer/run.py``, which fetches LangGraph prebuilt's and langchain-core's test
files from the sdists of the installed versions. Every tool the tests build is replaced by
``idempotent(t, store=STORE)`` (one :class:`InMemoryIdempotencyStore`, emptied before each
test):

* ``--idempotent-wrap=toolnode``: the tools handed to ``ToolNode(...)`` (so every
  ``create_react_agent`` too);
* ``--idempotent-wrap=core``: what ``@tool`` / ``tool(...)``, ``StructuredTool.from_function``
  and ``Tool.from_function`` return;
* ``--idempotent-wrap=middleware``: every ``create_agent`` gets an ``IdempotencyMiddleware``
  naming all its tools, first in its list (outside the test's own middleware, e.g.
  LangChain's ``HumanInTheLoopMiddleware``); the tools themselves are not wrapped.

``--idempotent-mode``:

* ``fresh`` — a new key for every call (a key function returning a fresh id): nothing is
  ever replayed, so a failure is the wrapper not being invisible;
* ``thread`` — the default ``thread`` scope, each test inside its own
  ``idempotency_scope(<test id>)``: a second call with the same arguments in one test replays
  the first answer;
* ``off`` — nothing is wrapped (the suites' own baseline).
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from langchain_core.tools import BaseTool

from langchain_idempotent import InMemoryIdempotencyStore, idempotency_scope, idempotent
from langchain_idempotent.adapters.tool import IdempotentTool

STORE = InMemoryIdempotencyStore()
_MODE = "off"
#: Set while this plugin builds a wrapper, so the library's own ``tool(...)`` is not wrapped.
_building: contextvars.ContextVar[bool] = contextvars.ContextVar("peer_building", default=False)
#: How many tools were wrapped (printed at the end, so a run that wraps nothing shows it).
WRAPPED = [0]


def _fresh_key(info: Any) -> str:
    return uuid.uuid4().hex


def wrap(t: Any) -> Any:
    """``t`` made idempotent, if it is a tool that is not already."""
    if _MODE == "off" or _building.get() or not isinstance(t, BaseTool):
        return t
    if isinstance(t, IdempotentTool):
        return t
    token = _building.set(True)
    try:
        # key_state=(): a tool given the whole state declares it no input of its effect
        # (the suites' tools do not say which fields they read; without it such a tool
        # is refused: docs/keys.md). Named state fields and injected values enter the key.
        options: dict[str, Any] = {"scope": _fresh_key} if _MODE == "fresh" else {"key_state": ()}
        wrapped = idempotent(t, store=STORE, **options)
    finally:
        _building.reset(token)
    WRAPPED[0] += 1
    return wrapped


def _wrap_returned(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` whose result is wrapped; a returned decorator (``@tool("name")``) too."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = fn(*args, **kwargs)
        if isinstance(result, BaseTool):
            return wrap(result)
        if callable(result) and not isinstance(result, type):
            return _wrap_returned(result)
        return result

    return wrapper


def _patch_core() -> None:
    import langchain_core.tools as tools_pkg
    import langchain_core.tools.convert as convert
    from langchain_core.tools import StructuredTool, Tool

    patched = _wrap_returned(convert.tool)
    convert.tool = patched  # type: ignore[assignment]
    tools_pkg.tool = patched  # type: ignore[assignment]
    for cls in (StructuredTool, Tool):
        original = cls.__dict__["from_function"].__func__
        cls.from_function = classmethod(_wrap_returned(original))  # type: ignore[assignment, method-assign]


def _patch_toolnode() -> None:
    from langchain_core.tools import tool as create_tool
    from langgraph.prebuilt import tool_node

    original = tool_node.ToolNode.__init__

    @functools.wraps(original)
    def __init__(self: Any, tools: Any, *args: Any, **kwargs: Any) -> None:
        tools = [wrap(t if isinstance(t, BaseTool) else create_tool(t)) for t in tools]
        original(self, tools, *args, **kwargs)

    tool_node.ToolNode.__init__ = __init__  # type: ignore[method-assign]


def _patch_create_agent() -> None:
    import langchain.agents as agents_pkg
    from langchain.agents import factory

    from langchain_idempotent import IdempotencyMiddleware

    original = factory.create_agent

    @functools.wraps(original)
    def create_agent(*args: Any, **kwargs: Any) -> Any:
        tools = kwargs.get("tools", args[1] if len(args) > 1 else None) or []
        names = [t.name for t in tools if isinstance(t, BaseTool)]
        if names:
            options: dict[str, Any] = (
                {"scope": _fresh_key} if _MODE == "fresh" else {"key_state": ()}
            )
            ours = IdempotencyMiddleware(STORE, tools=names, **options)
            kwargs["middleware"] = [ours, *kwargs.get("middleware", ())]
            WRAPPED[0] += len(names)
        return original(*args, **kwargs)

    factory.create_agent = create_agent  # type: ignore[assignment]
    agents_pkg.create_agent = create_agent  # type: ignore[attr-defined]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("idempotent-peer")
    group.addoption(
        "--idempotent-mode",
        choices=["off", "fresh", "thread"],
        default="off",
        help="off: no wrapping; fresh: a new key per call; thread: thread scope per test",
    )
    group.addoption(
        "--idempotent-wrap",
        default="",
        help="comma-separated: toolnode (ToolNode's tools), core (@tool, from_function), "
        "middleware (IdempotencyMiddleware first in every create_agent)",
    )


def pytest_configure(config: pytest.Config) -> None:
    global _MODE
    _MODE = config.getoption("--idempotent-mode")
    if _MODE == "off":
        return
    for what in filter(None, config.getoption("--idempotent-wrap").split(",")):
        patches = {"toolnode": _patch_toolnode, "core": _patch_core}
        patches["middleware"] = _patch_create_agent
        patches[what]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """Each test with an empty store, inside its own scope (async tests too)."""
    for record in STORE.list():
        STORE.delete(record.key)
    if _MODE == "thread" and isinstance(item, pytest.Function):
        scope = f"peer:{item.nodeid}"
        test = item.obj
        if inspect.iscoroutinefunction(test):
            # The event loop runs the test in its own context: enter the scope inside it.

            @functools.wraps(test)
            async def scoped(*args: Any, **kwargs: Any) -> Any:
                with idempotency_scope(scope):
                    return await test(*args, **kwargs)

            item.obj = scoped
        with idempotency_scope(scope):
            return (yield)
    return (yield)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    terminalreporter.write_line(f"idempotent-peer: mode={_MODE}, tools wrapped={WRAPPED[0]}")
