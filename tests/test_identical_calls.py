"""Identical calls in one ``AIMessage`` (same tool, same arguments): ``identical_calls=``
``"share"`` (default: one effect, as before), ``"run"`` (each once, and a replay of the
same message runs none again) or ``"reject"`` (all but the first refused), in a
``ToolNode`` graph and in ``create_agent``, beside the plain tool (which runs each)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from langchain_idempotent import IdempotencyMiddleware, InMemoryIdempotencyStore, idempotent
from tests.support.graphs import Effects, ScriptedChatModel, call, calls, thread, tool_graph

REFUND = {"invoice": "A", "amount": 140}


def _refund(effects: Effects) -> Any:
    @tool
    def refund(invoice: str, amount: float) -> str:
        """Refund an invoice."""
        n = effects.record("refund", invoice=invoice)
        return f"refund #{n}"

    return refund


def _batch() -> ScriptedChatModel:
    other = {"invoice": "B", "amount": 140}
    twice = calls(call("refund", REFUND), call("refund", dict(REFUND)), call("refund", other))
    return ScriptedChatModel(script=[twice])


def _run(kind: str, option: str | None, effects: Effects) -> list[ToolMessage]:
    store = InMemoryIdempotencyStore()
    options = {} if option is None else {"identical_calls": option}
    config = thread(f"t-{uuid.uuid4().hex}")
    if kind == "toolnode":
        inner = _refund(effects)
        tools = [inner] if option == "plain" else [idempotent(inner, store, **options)]
        graph = tool_graph(_batch(), tools, checkpointer=InMemorySaver())
    else:
        middleware = (
            [] if option == "plain" else [IdempotencyMiddleware(store, tools=["refund"], **options)]
        )
        graph = create_agent(
            _batch(), tools=[_refund(effects)], middleware=middleware, checkpointer=InMemorySaver()
        )
    out = graph.invoke({"messages": [HumanMessage("refund A twice?")]}, config)
    return [m for m in out["messages"] if isinstance(m, ToolMessage)]


@pytest.mark.parametrize("kind", ["toolnode", "create_agent"])
@pytest.mark.parametrize(
    ("option", "refunds", "refused"),
    [("plain", 3, 0), (None, 2, 0), ("share", 2, 0), ("run", 3, 0), ("reject", 2, 1)],
)
def test_identical_calls_in_one_message_share_run_or_are_rejected(
    kind: str, option: str | None, refunds: int, refused: int
) -> None:
    effects = Effects()
    answers = _run(kind, option, effects)
    assert effects.count("refund") == refunds
    assert len(answers) == 3
    assert sum(1 for m in answers if m.status == "error") == refused
    if option == "reject":
        assert "identical_calls='reject'" in str(answers[1].content)
    if option in (None, "share"):
        assert answers[0].content == answers[1].content  # one effect, one answer


def test_run_gives_each_identical_call_a_key_that_a_retry_of_the_message_finds() -> None:
    effects, store = Effects(), InMemoryIdempotencyStore()
    refund = idempotent(_refund(effects), store, identical_calls="run")
    graph = tool_graph(_batch(), [refund], checkpointer=InMemorySaver())
    config = thread(f"t-{uuid.uuid4().hex}")
    graph.invoke({"messages": [HumanMessage("go")]}, config)
    assert len(store.list()) == 3
    # Replay the tools step of the same message from its checkpoint: nothing runs again.
    before_tools = next(s for s in graph.get_state_history(config) if s.next == ("tools",))
    graph.invoke(None, before_tools.config)
    assert effects.count("refund") == 3


def test_identical_calls_must_be_a_known_option() -> None:
    with pytest.raises(ValueError, match="identical_calls must be 'share', 'run' or 'reject'"):
        idempotent(_refund(Effects()), InMemoryIdempotencyStore(), identical_calls="twice")  # type: ignore[arg-type]
