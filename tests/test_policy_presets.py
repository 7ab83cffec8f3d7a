"""An effect class is a preset of ``on_expired`` and ``approval`` for what was not given.

"Not given" is a value a reader can see (``None``), not a comparison with the defaults:
so the constructor, ``with_options`` and any order of the two give the same policy, and an
option given wins even when it equals the default.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from langchain_idempotent import Policy
from langchain_idempotent.adapters.keys import CallInfo
from langchain_idempotent.core.policy import EFFECT_CLASSES, option_names, preset


def _asks_above_500(call: CallInfo) -> bool:
    return bool(call.args.get("amount", 0) > 500)


def _found(attempt: Any) -> None:
    return None


#: Values each option can take in the properties below (the preset's inputs in full,
#: the other options as a sample). An option missing here is left at its default.
_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "effect": st.sampled_from(
        [None, *EFFECT_CLASSES, {"refund": "unsafe", "lookup": "read", "wire": "irreversible"}]
    ),
    "on_expired": st.sampled_from([None, "takeover", "raise"]),
    "approval": st.sampled_from([None, True, False, _asks_above_500, {"refund": True}]),
    "reconcile": st.sampled_from([None, _found, {"refund": _found}]),
    "lease": st.sampled_from([30.0, 5, timedelta(seconds=10)]),
    "wait_timeout": st.sampled_from([60.0, 0, None]),
    "fail_open": st.booleans(),
    "namespace": st.sampled_from(["default", "billing"]),
    "scope": st.sampled_from(["thread", "turn", "call"]),
    "interrupt_mode": st.sampled_from(["batched", "per_call"]),
    "identical_calls": st.sampled_from(["share", "run", "reject"]),
    "on_fork": st.sampled_from(["replay", "run"]),
}
_TOOLS = st.sampled_from(["refund", "lookup", "wire", "other"])


@st.composite
def _options(draw: st.DrawFn) -> dict[str, Any]:
    """Some options, each one drawn or left out (so both "given" and "not given" occur)."""
    names = draw(st.sets(st.sampled_from(sorted(_VALUES))))
    return {name: draw(_VALUES[name]) for name in names}


def test_the_options_drawn_are_options_of_the_policy() -> None:
    assert set(_VALUES) <= set(option_names())


@given(options=_options(), tool=_TOOLS)
def test_the_constructor_and_with_options_give_the_same_policy_for_every_tool(
    options: dict[str, Any], tool: str
) -> None:
    built = Policy(**options)
    replaced = Policy().with_options(**options)
    assert built == replaced
    assert built.for_tool(tool) == replaced.for_tool(tool)


@given(first=_options(), second=_options(), tool=_TOOLS)
def test_with_options_on_top_of_a_policy_is_the_policy_of_both_option_sets(
    first: dict[str, Any], second: dict[str, Any], tool: str
) -> None:
    layered = Policy(**first).with_options(**second)
    assert layered.for_tool(tool) == Policy(**{**first, **second}).for_tool(tool)


@given(options=_options(), tool=_TOOLS)
def test_an_option_given_wins_over_the_preset_and_one_not_given_takes_it(
    options: dict[str, Any], tool: str
) -> None:
    resolved = Policy(**options).for_tool(tool)
    effect = options.get("effect")
    chosen = effect.get(tool) if isinstance(effect, dict) else effect
    assert resolved.effect == chosen and resolved.effect_class == chosen
    reconcile = options.get("reconcile")
    hooked = reconcile.get(tool) if isinstance(reconcile, dict) else reconcile
    expected = preset(chosen, reconciled=hooked is not None)
    for name in ("on_expired", "approval"):
        given_value = options.get(name)
        assert getattr(resolved, name) == (expected[name] if given_value is None else given_value)


@given(options=_options(), tool=_TOOLS)
def test_a_policy_for_a_tool_is_its_own_policy_for_that_tool(
    options: dict[str, Any], tool: str
) -> None:
    resolved = Policy(**options).for_tool(tool)
    assert resolved.for_tool(tool) is resolved
    assert resolved.on_expired is not None and resolved.approval is not None


def test_the_presets_table_of_docs_effects() -> None:
    assert preset(None, reconciled=False) == {"on_expired": "takeover", "approval": False}
    assert preset("read", reconciled=False) == {"on_expired": "takeover", "approval": False}
    assert preset("keyed", reconciled=False) == {"on_expired": "takeover", "approval": False}
    assert preset("unsafe", reconciled=False) == {"on_expired": "raise", "approval": False}
    assert preset("unsafe", reconciled=True) == {"on_expired": "takeover", "approval": False}
    assert preset("irreversible", reconciled=True) == {"on_expired": "raise", "approval": True}


def test_the_default_given_explicitly_still_wins_over_the_preset() -> None:
    # The case a comparison with the defaults got wrong: "takeover" is the default value.
    assert Policy(effect="unsafe", on_expired="takeover").for_tool("t").on_expired == "takeover"
    assert (
        Policy().with_options(effect="unsafe", on_expired="takeover").for_tool("t").on_expired
        == "takeover"
    )
    assert Policy(effect="irreversible", approval=False).for_tool("t").approval is False
    assert Policy(effect="unsafe").for_tool("t").on_expired == "raise"
