"""Keys: the same call gives the same key; anything that makes it another effect changes it."""

from __future__ import annotations

import json
import unicodedata
from typing import Annotated, Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.tools import InjectedToolCallId, tool
from langgraph.prebuilt import InjectedState
from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, field_serializer

from langchain_idempotent import (
    InvalidArgumentsError,
    MissingScopeError,
    idempotency_scope,
)
from langchain_idempotent.adapters.keys import CallInfo, call_info, derive_key, graph_path
from langchain_idempotent.core.canonical import canonical_json, json_arguments

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(),
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.text(), json_values, max_size=6))
def test_key_order_never_changes_the_canonical_form(doc: dict[str, Any]) -> None:
    reordered = dict(reversed(list(doc.items())))
    assert canonical_json(doc) == canonical_json(reordered)


@given(st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1))
def test_an_integer_and_the_same_float_are_the_same_argument(n: int) -> None:
    assert canonical_json({"amount": n}) == canonical_json({"amount": float(n)})


#: Everything the fast path must tell apart: any code point (lone surrogates, characters
#: beyond U+FFFF, control characters), integers either side of the safe domain, floats.
any_text = st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x10FFFF))
edge_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**53) - 3, max_value=2**53 + 3),
    st.integers(),
    st.floats(),
    any_text,
)
edge_values = st.recursive(
    edge_scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.tuples(children, children)
        | st.dictionaries(any_text, children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None)
@given(edge_values)
def test_the_plain_json_fast_path_writes_the_same_bytes_as_rfc8785_or_the_same_refusal(
    value: Any,
) -> None:
    from langchain_idempotent.core.canonical import _general

    try:
        general: bytes | None = _general(value)
    except InvalidArgumentsError:
        general = None
    if general is None:
        with pytest.raises(InvalidArgumentsError):
            canonical_json(value)
    else:
        assert canonical_json(value) == general


def _numbers_as_floats(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, list):
        return [_numbers_as_floats(v) for v in value]
    return {k: _numbers_as_floats(v) for k, v in value.items()}


@settings(max_examples=60, deadline=None)
@given(json_values)
def test_the_canonical_form_is_json_that_parses_back_to_an_equal_value(value: Any) -> None:
    # JSON numbers are IEEE doubles: compare as such (6.4e16 is written as an integer).
    text = canonical_json(value)
    assert _numbers_as_floats(json.loads(text)) == _numbers_as_floats(value)


@given(st.text(min_size=1))
def test_unicode_is_kept_exactly_and_never_normalised(s: str) -> None:
    nfkc = unicodedata.normalize("NFKC", s)
    same = canonical_json({"name": s}) == canonical_json({"name": nfkc})
    assert same == (s == nfkc)


def test_look_alike_characters_are_different_arguments() -> None:
    cyrillic_a = "\u0430"
    assert canonical_json({"to": "paypal"}) != canonical_json({"to": f"p{cyrillic_a}ypal"})


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), 2**60, object()])
def test_arguments_without_a_canonical_form_are_a_clear_error(bad: object) -> None:
    with pytest.raises(InvalidArgumentsError):
        canonical_json({"x": bad})


def test_deep_nesting_is_a_clear_error_not_a_crash() -> None:
    deep: Any = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(InvalidArgumentsError):
        canonical_json(deep)


@pytest.mark.parametrize(
    ("ns", "path"),
    [
        ("", ""),
        ("tools:0340b676-94a7-03a6-cde8-591d4889d429", "tools"),
        ("outer:12f41adf|tools:0340b676", "outer|tools"),
        ("a:1|b:2|c:3", "a|b|c"),
    ],
)
def test_graph_path_drops_task_ids(ns: str, path: str) -> None:
    assert graph_path(ns) == path


@tool
def refund(
    invoice: str,
    amount: float,
    state: Annotated[dict, InjectedState],
    call_id: Annotated[str, InjectedToolCallId],
) -> str:
    """Refund an invoice."""
    return "ok"


def info(
    args: dict[str, Any],
    *,
    thread: str | None = "t1",
    ns: str = "default",
    node: str = "tools",
    checkpoint_ns: str = "tools:abc",
    call_id: str | None = "c1",
) -> CallInfo:
    config: dict[str, Any] = {
        "configurable": {"checkpoint_ns": checkpoint_ns},
        "metadata": {"langgraph_node": node},
    }
    if thread is not None:
        config["configurable"]["thread_id"] = thread
    return call_info(
        tool="refund",
        schema=refund.tool_call_schema,
        tool_input=args,
        tool_call_id=call_id,
        config=config,
        namespace=ns,
    )  # type: ignore[arg-type]


ARGS = {"invoice": "inv_1", "amount": 140}


def key(i: CallInfo, scope: Any = "thread") -> str:
    return derive_key(i, scope).key


def test_injected_arguments_never_enter_the_key() -> None:
    a = info({**ARGS, "state": {"messages": [1]}, "call_id": "x"})
    b = info({**ARGS, "state": {"messages": [2, 3]}, "call_id": "y"})
    assert key(a) == key(b)


def test_140_and_140_0_and_reordered_keys_are_one_call() -> None:
    assert key(info(ARGS)) == key(info({"amount": 140.0, "invoice": "inv_1"}))


def test_task_ids_in_the_checkpoint_namespace_do_not_change_the_key() -> None:
    assert key(info(ARGS, checkpoint_ns="tools:aaa")) == key(info(ARGS, checkpoint_ns="tools:bbb"))


@pytest.mark.parametrize(
    "other",
    [
        {"thread": "t2"},
        {"ns": "tenant-b"},
        {"node": "other_tools"},
        {"checkpoint_ns": "sub_a:1|tools:2"},
    ],
)
def test_thread_namespace_node_and_graph_path_separate_keys(other: dict[str, Any]) -> None:
    assert key(info(ARGS)) != key(info(ARGS, **other))


def test_other_arguments_are_another_key_under_thread_scope() -> None:
    assert key(info(ARGS)) != key(info({**ARGS, "amount": 141}))


def test_call_scope_keys_by_tool_call_id_and_fingerprints_the_arguments() -> None:
    a, b = (
        derive_key(info(ARGS, call_id="c1"), "call"),
        derive_key(info(ARGS, call_id="c2"), "call"),
    )
    assert a.key != b.key and a.fingerprint == b.fingerprint
    c = derive_key(info({**ARGS, "amount": 1}, call_id="c1"), "call")
    assert c.key == a.key and c.fingerprint != a.fingerprint


def test_call_scope_without_a_tool_call_id_says_how_to_fix_it() -> None:
    with pytest.raises(MissingScopeError, match="ToolCall"):
        derive_key(info(ARGS, call_id=None), "call")


def test_turn_scope_uses_the_explicit_turn_when_given() -> None:
    i1 = info(ARGS)
    cfg = {**i1.config, "configurable": {**i1.config["configurable"], "idempotency_turn": "u1"}}
    cfg2 = {**i1.config, "configurable": {**i1.config["configurable"], "idempotency_turn": "u2"}}
    k1 = derive_key(
        call_info(
            tool="refund",
            schema=refund.tool_call_schema,
            tool_input=ARGS,
            tool_call_id="c",
            config=cfg,
            namespace="default",
        ),
        "turn",
    )  # type: ignore[arg-type]
    k2 = derive_key(
        call_info(
            tool="refund",
            schema=refund.tool_call_schema,
            tool_input=ARGS,
            tool_call_id="c",
            config=cfg2,
            namespace="default",
        ),
        "turn",
    )  # type: ignore[arg-type]
    assert k1.key != k2.key
    with pytest.raises(MissingScopeError, match="idempotency_turn"):
        derive_key(i1, "turn")


def test_a_key_function_decides_and_namespaces_still_separate() -> None:
    fn = lambda call: f"order-{call.args['invoice']}"  # noqa: E731
    assert key(info(ARGS), fn) == key(info({**ARGS, "amount": 9}, thread="t9"), fn)
    assert key(info(ARGS), fn) != key(info(ARGS, ns="tenant-b"), fn)
    with pytest.raises(InvalidArgumentsError, match="non-empty string"):
        key(info(ARGS), lambda call: "")


def test_no_thread_id_is_a_loud_error_that_says_how_to_give_one() -> None:
    with pytest.raises(MissingScopeError, match="thread_id") as e:
        key(info(ARGS, thread=None))
    assert "idempotency_scope" in str(e.value)


def test_an_explicit_scope_makes_calls_outside_graphs_keyable() -> None:
    with idempotency_scope("order-123"):
        k1 = key(info(ARGS, thread=None))
    with idempotency_scope("order-123"):
        k2 = key(info(ARGS, thread=None))
    assert k1 == k2 == key(info(ARGS, thread="order-123"))


def test_thread_ids_with_control_characters_are_fine_and_distinct() -> None:
    assert key(info(ARGS, thread="t\x00\n1")) != key(info(ARGS, thread="t1"))


def test_keys_are_64_hex_chars_safe_for_headers_and_redis() -> None:
    k = key(info(ARGS))
    assert len(k) == 64 and all(c in "0123456789abcdef" for c in k)


def test_a_digest_frames_each_part_with_its_length_in_bytes_short_or_long() -> None:
    import hashlib

    from langchain_idempotent.core.keys import digest

    long = "é" * 200  # 400 bytes: past the lengths written in advance
    framed = b"3:abc" + b"0:" + b"400:" + long.encode() + b"2:\x00\x01"
    assert digest("abc", "", long, b"\x00\x01") == hashlib.sha256(framed).hexdigest()
    # Again, the text parts now framed from the cache of short parts: the same digest.
    assert digest("abc", "", long, b"\x00\x01") == hashlib.sha256(framed).hexdigest()


@given(st.lists(st.text() | st.binary(), max_size=6))
def test_a_digest_is_the_same_whether_its_text_parts_were_seen_before_or_not(
    parts: list[str | bytes],
) -> None:
    import hashlib

    from langchain_idempotent.core import keys

    def framed(part: str | bytes) -> bytes:
        data = part.encode("utf-8", "surrogatepass") if isinstance(part, str) else part
        return b"%d:" % len(data) + data

    expected = hashlib.sha256(b"".join(map(framed, parts))).hexdigest()
    keys._FRAMED.clear()
    assert keys.digest(*parts) == expected  # each text part framed and kept
    assert keys.digest(*parts) == expected  # each taken from what was kept


class _Plain(BaseModel):
    name: str
    count: int
    flag: bool = False
    note: str | None = None


class _Upper(BaseModel):
    name: Annotated[str, PlainSerializer(lambda s: s.upper(), when_used="json")]


class _Serialized(BaseModel):
    name: str

    @field_serializer("name")
    def _lower(self, value: str) -> str:
        return value.lower()


class _Excluded(BaseModel):
    name: str
    secret: str = Field(default="s", exclude=True)


class _ByAlias(BaseModel):
    model_config = ConfigDict(serialize_by_alias=True)
    name: str = Field(alias="n")


@given(
    name=st.text(),
    count=st.integers(),
    flag=st.booleans(),
    note=st.none() | st.text(),
)
def test_plain_arguments_taken_as_they_are_equal_pydantics_json_dump(
    name: str, count: int, flag: bool, note: str | None
) -> None:
    model = _Plain(name=name, count=count, flag=flag, note=note)
    fields = {"name", "count", "flag", "note"}
    dumped = model.model_dump(mode="json", include=fields)
    assert json_arguments(model, fields) == dumped
    assert list(json_arguments(model, fields)) == list(dumped)  # the same order too
    assert json_arguments(model, {"count"}) == {"count": count}


@pytest.mark.parametrize(
    ("model", "fields", "expected"),
    [
        (_Upper(name="Ab"), {"name"}, {"name": "AB"}),
        (_Serialized(name="Ab"), {"name"}, {"name": "ab"}),
        (_Excluded(name="a", secret="x"), {"name", "secret"}, {"name": "a"}),
        (_ByAlias(n="a"), {"name"}, {"n": "a"}),
    ],
    ids=["json-only serializer", "field serializer", "excluded field", "dumped by alias"],
)
def test_a_model_that_dumps_its_fields_its_own_way_is_dumped(
    model: BaseModel, fields: set[str], expected: dict[str, Any]
) -> None:
    assert (
        json_arguments(model, fields) == expected == model.model_dump(mode="json", include=fields)
    )
