"""Every way LangChain lets a caller hand a tool its input reaches the wrapper the same way.

``run`` / ``arun`` (legacy executors and user code call them, not ``invoke``), a string or
an empty string for a tool's first or no argument, an argument passed by its validation
alias: each is keyed like the equivalent ``invoke``, so a retry replays instead of running
again. Results of plain classes replay as themselves once allowed, and the wrapper dumps
as the inner tool does (``model_dump(mode="json")``).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from langchain_core.tools import StructuredTool, tool
from pydantic import AliasChoices, BaseModel, Field

from langchain_idempotent import (
    InMemoryIdempotencyStore,
    UnstorableResultError,
    idempotency_scope,
    idempotent,
)


def counting_search() -> tuple[StructuredTool, list[str]]:
    runs: list[str] = []

    @tool
    def search(query: str) -> str:
        """Search."""
        runs.append(query)
        return f"result for {query}"

    return search, runs


@pytest.mark.parametrize("protected", [True, False], ids=["wrapped", "unprotected"])
def test_run_called_directly_is_keyed_like_invoke(protected: bool) -> None:
    search, runs = counting_search()
    target = idempotent(search, store=InMemoryIdempotencyStore()) if protected else search
    with idempotency_scope("run-direct"):
        first = target.run({"query": "refund"})
        again = target.run({"query": "refund"}, tool_call_id="call-2")
        via_invoke = target.invoke({"query": "refund"})
    assert first == again.content == via_invoke == "result for refund"
    assert again.tool_call_id == "call-2"
    assert runs == (["refund"] if protected else ["refund"] * 3)


async def test_arun_called_directly_is_keyed_like_ainvoke() -> None:
    search, runs = counting_search()
    wrapped = idempotent(search, store=InMemoryIdempotencyStore())
    with idempotency_scope("arun-direct"):
        assert await wrapped.arun({"query": "a"}) == "result for a"
        assert await wrapped.arun({"query": "a"}) == "result for a"
        assert await wrapped.ainvoke({"query": "a"}) == "result for a"
    assert runs == ["a"]


def test_a_tool_run_inside_a_wrapped_tool_gets_its_own_key() -> None:
    store = InMemoryIdempotencyStore()
    search, runs = counting_search()
    inner = idempotent(search, store=store)

    @tool
    def outer(query: str) -> str:
        """Calls another tool with run(), as legacy code does."""
        return "outer: " + inner.run({"query": query + "!"})

    wrapped = idempotent(outer, store=store)
    with idempotency_scope("nested-run"):
        assert wrapped.invoke({"query": "q"}) == "outer: result for q!"
        assert inner.run({"query": "q!"}) == "result for q!"  # replayed, its own key
    assert runs == ["q!"]


def test_a_string_input_is_the_first_argument_as_langchain_reads_it() -> None:
    runs: list[tuple[str, float]] = []

    @tool
    def kw(arg_0: str, arg_1: float = 4.3) -> str:
        """Two arguments, one with a default."""
        runs.append((arg_0, arg_1))
        return f"{arg_0} {arg_1}"

    wrapped = idempotent(kw, store=InMemoryIdempotencyStore())
    with idempotency_scope("string-input"):
        assert wrapped.invoke("foobar") == kw.invoke("foobar") == "foobar 4.3"
        # The same call as {"arg_0": "foobar"}: replayed.
        assert wrapped.invoke({"arg_0": "foobar"}) == "foobar 4.3"
    assert runs == [("foobar", 4.3), ("foobar", 4.3)]  # once wrapped, once plain


def test_an_empty_string_calls_a_tool_that_takes_no_arguments() -> None:
    def constant() -> str:
        """Docstring."""
        return "invoke foo"

    wrapped = idempotent(StructuredTool.from_function(constant), store=InMemoryIdempotencyStore())
    with idempotency_scope("empty-input"):
        assert wrapped.run("") == wrapped.run({}) == wrapped.invoke("") == "invoke foo"


def test_an_argument_passed_by_its_validation_alias_is_keyed_by_its_field_name() -> None:
    class Args(BaseModel):
        canonical: str = Field(validation_alias=AliasChoices("canonical", "alias"))

    runs: list[str] = []

    @tool(args_schema=Args)
    def aliased(canonical: str) -> str:
        """Return the canonical argument."""
        runs.append(canonical)
        return canonical

    wrapped = idempotent(aliased, store=InMemoryIdempotencyStore())
    with idempotency_scope("alias"):
        assert wrapped.invoke({"alias": "value"}) == "value"
        assert wrapped.invoke({"canonical": "value"}) == "value"  # the same call
        assert wrapped.invoke({"alias": "other"}) == "other"
    assert runs == ["value", "other"]


class Point:
    """A plain class: no pydantic, no dataclass, no ``__eq__``."""

    def __init__(self, x: int) -> None:
        self.x = x


def point_tool() -> tuple[StructuredTool, list[int]]:
    runs: list[int] = []

    def locate(x: int) -> Point:
        """Locate."""
        runs.append(x)
        return Point(x)

    return StructuredTool.from_function(locate), runs


def test_a_plain_class_result_replays_as_itself_when_allowed() -> None:
    locate, runs = point_tool()
    wrapped = idempotent(locate, store=InMemoryIdempotencyStore(), allowed_types=[Point])
    with idempotency_scope("point"):
        first = wrapped.invoke({"x": 3})
        replay = wrapped.invoke({"x": 3})
    assert type(first) is Point and type(replay) is Point
    assert replay.x == 3 and vars(replay) == vars(first)
    assert runs == [3]


def test_a_plain_class_result_that_is_not_allowed_is_refused_on_the_first_call() -> None:
    locate, runs = point_tool()
    wrapped = idempotent(locate, store=InMemoryIdempotencyStore())
    with idempotency_scope("point-refused"):
        with pytest.raises(UnstorableResultError, match=r"allowed_types=\[Point\]") as first:
            wrapped.invoke({"x": 3})
        with pytest.raises(UnstorableResultError) as retry:
            wrapped.invoke({"x": 3})
    assert str(retry.value) == str(first.value)
    assert runs == [3]


def test_the_wrapper_dumps_as_the_inner_tool_including_json_mode() -> None:
    @tool
    def write_file(file_path: str, content: str) -> str:
        """Write content to the given path."""
        return "ok"

    wrapped = idempotent(write_file, store=InMemoryIdempotencyStore())
    dumped: dict[str, Any] = wrapped.model_dump(mode="json")
    assert dumped == write_file.model_dump(mode="json")
    json.dumps(dumped)
    assert "write_file" in dumped["func"]
    assert json.loads(wrapped.model_dump_json()) == json.loads(write_file.model_dump_json())
    assert wrapped.model_dump(mode="json", include={"name"}) == {"name": "write_file"}
