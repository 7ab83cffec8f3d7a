"""``effect=``: a per-tool class as a preset of today's options. ``read`` passes straight
through (no record, no store round trip: it runs again each time, as a plain tool does);
``keyed`` re-sends on a takeover; ``unsafe`` raises outcome unknown on a takeover unless a
``reconcile=`` hook is asked; ``irreversible`` also asks a human. Explicit options win."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from langchain_idempotent import (
    IdempotencyMiddleware,
    InMemoryIdempotencyStore,
    Policy,
    idempotency_scope,
    idempotent,
)
from langchain_idempotent.core.context import side_effect
from langchain_idempotent.core.policy import EFFECT_CLASSES
from langchain_idempotent.core.store import ClaimRequest
from langchain_idempotent.errors import IdempotencyError, OutcomeUnknownError
from langchain_idempotent.testing import FakeClock
from tests.support.graphs import Effects, ScriptedChatModel, on_each_turn, thread


def _tools(effects: Effects) -> list[Any]:
    @tool
    def lookup(invoice: str) -> str:
        """Look an invoice up."""
        effects.record("lookup", invoice=invoice)
        return f"invoice {invoice}"

    @tool
    def refund(invoice: str) -> str:
        """Refund an invoice."""
        effects.record("refund", invoice=invoice)
        return f"refunded {invoice}"

    return [lookup, refund]


def test_the_presets_are_todays_options_and_explicit_options_win() -> None:
    hook = lambda call: None  # noqa: E731
    cases = {
        "keyed": {"on_expired": "takeover", "approval": False},
        "unsafe": {"on_expired": "raise", "approval": False},
        "irreversible": {"on_expired": "raise", "approval": True},
    }
    for name, want in cases.items():
        got = Policy().with_options(effect=name).for_tool("refund")
        assert {k: getattr(got, k) for k in want} == want, name
    assert Policy(effect="unsafe", reconcile=hook).for_tool("refund").on_expired == "takeover"
    explicit = Policy().with_options(effect="unsafe", on_expired="takeover").for_tool("refund")
    assert explicit.on_expired == "takeover"
    assert (
        Policy().with_options(effect="irreversible", approval=False).for_tool("r").approval is False
    )
    per_tool = Policy(effect={"refund": "unsafe"})
    assert per_tool.for_tool("refund").on_expired == "raise"
    assert per_tool.for_tool("lookup").on_expired == "takeover"
    assert per_tool.for_tool("lookup").effect_class is None


def test_an_unknown_effect_class_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="unknown effect class 'write'; valid: read, keyed"):
        Policy(effect="write")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="for tool 'refund'"):
        Policy(effect={"refund": "maybe"})  # type: ignore[dict-item]
    assert EFFECT_CLASSES == ("read", "keyed", "unsafe", "irreversible")
    with pytest.raises(ValueError, match="effect= names nope"):
        IdempotencyMiddleware(InMemoryIdempotencyStore(), tools=["refund"], effect={"nope": "read"})
    with pytest.raises(ValueError, match="no side effect to mark"):
        Policy(effect="read", boundary=True)


def test_a_read_tool_passes_straight_through_while_the_others_are_memoized() -> None:
    effects, store = Effects(), InMemoryIdempotencyStore()
    lookup, refund = idempotent(_tools(effects), store, effect={"lookup": "read"})
    with idempotency_scope(f"t-{uuid.uuid4().hex}"):
        for _ in range(2):
            assert lookup.invoke({"invoice": "A"}) == "invoice A"
            assert refund.invoke({"invoice": "A"}) == "refunded A"
    assert (effects.count("lookup"), effects.count("refund")) == (2, 1)
    assert [r.meta.get("tool") for r in store.list()] == ["refund"]
    # A read needs no scope either: a whole tool list can be wrapped.
    assert lookup.invoke({"invoice": "B"}) == "invoice B"


def test_side_effect_in_a_read_tool_is_refused_by_name() -> None:
    @tool
    def peek(invoice: str) -> str:
        """Read something."""
        with side_effect():
            return invoice

    wrapped = idempotent(peek, InMemoryIdempotencyStore(), effect="read")
    with pytest.raises(IdempotencyError, match="tool 'peek', declared effect='read'"):
        wrapped.invoke({"invoice": "A"})


@pytest.mark.parametrize(("effect", "reruns"), [("keyed", True), ("unsafe", False)])
def test_a_takeover_re_sends_a_keyed_call_and_never_an_unsafe_one(
    effect: str, reruns: bool
) -> None:
    clock = FakeClock()
    effects, store = Effects(), InMemoryIdempotencyStore(clock=clock)
    _, refund = idempotent(_tools(effects), store, effect=effect, lease=1)  # type: ignore[arg-type]
    scope = f"t-{uuid.uuid4().hex}"
    with idempotency_scope(scope):
        refund.invoke({"invoice": "A"})
    (rec,) = store.list()
    # The record as a worker that died mid-call leaves it: running, its lease run out.
    store.delete(rec.key)
    store.claim(
        ClaimRequest(
            rec.key,
            owner="dead",
            fingerprint=rec.fingerprint,
            lease_ms=1000,
            ttl_ms=10**6,
            meta=rec.meta,
        )
    )
    clock.now += 2
    with idempotency_scope(scope):
        if reruns:
            assert refund.invoke({"invoice": "A"}) == "refunded A"
        else:
            with pytest.raises(OutcomeUnknownError):
                refund.invoke({"invoice": "A"})
    assert effects.count("refund") == (2 if reruns else 1)


def test_the_middleware_applies_a_class_per_tool_in_create_agent() -> None:
    effects, store = Effects(), InMemoryIdempotencyStore()
    lookup, refund = _tools(effects)
    middleware = IdempotencyMiddleware(
        store, tools=["lookup", "refund"], effect={"lookup": "read", "refund": "keyed"}
    )
    agent = create_agent(
        ScriptedChatModel(
            then=on_each_turn(("lookup", {"invoice": "A"}), ("refund", {"invoice": "A"}))
        ),
        tools=[lookup, refund],
        middleware=[middleware],
        checkpointer=InMemorySaver(),
    )
    config = thread(f"mw-{uuid.uuid4().hex}")
    for _ in range(2):  # two user turns asking for the same calls (scope "thread")
        agent.invoke({"messages": [HumanMessage("refund A")]}, config)
    assert (effects.count("lookup"), effects.count("refund")) == (2, 1)
    assert [r.meta.get("tool") for r in store.list()] == ["refund"]
