"""OpenTelemetry spans and span events from idempotency events (the ``otel`` extra)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import StatusCode

from langchain_idempotent import (
    IdempotencyEvent,
    InMemoryIdempotencyStore,
    Policy,
    StoreUnavailableError,
)
from langchain_idempotent.core.engine import Engine
from langchain_idempotent.core.record import Claim
from langchain_idempotent.core.store import ClaimRequest
from langchain_idempotent.integrations.otel import OpenTelemetryHook, event_attributes


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


class DownStore(InMemoryIdempotencyStore):
    def claim(self, request: ClaimRequest) -> Claim:
        raise StoreUnavailableError("connection refused", key=request.key)


def test_without_a_current_span_each_event_becomes_a_span_with_its_attributes(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = spans
    engine = Engine(
        InMemoryIdempotencyStore(), Policy(), on_event=OpenTelemetryHook(tracer_provider=provider)
    )
    engine.run("k", fingerprint="fp", action=lambda: 1, tool="issue_refund")
    engine.run("k", fingerprint="fp", action=lambda: 1, tool="issue_refund")

    finished = exporter.get_finished_spans()
    assert [s.name for s in finished] == [
        "idempotency.claim",
        "idempotency.complete",
        "idempotency.replay",
    ]
    replay = finished[-1]
    attributes = dict(replay.attributes or {})
    assert isinstance(attributes.pop("idempotency.claim_ms"), float)
    assert attributes == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "issue_refund",
        "idempotency.kind": "replay",
        "idempotency.key": "k",
        "idempotency.fence": 1,
        "idempotency.attempt": 1,
    }
    assert replay.status.status_code is StatusCode.UNSET


def test_inside_a_recording_span_events_annotate_it_instead(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = spans
    engine = Engine(
        InMemoryIdempotencyStore(), Policy(), on_event=OpenTelemetryHook(tracer_provider=provider)
    )
    with provider.get_tracer("test").start_as_current_span("tool run"):
        engine.run("k", fingerprint="fp", action=lambda: 1)
        engine.run("k", fingerprint="fp", action=lambda: 1)

    (tool_run,) = exporter.get_finished_spans()
    assert [e.name for e in tool_run.events] == [
        "idempotency.claim",
        "idempotency.complete",
        "idempotency.replay",
    ]
    assert tool_run.events[-1].attributes is not None
    assert tool_run.events[-1].attributes["idempotency.key"] == "k"


def test_span_mode_makes_child_spans_and_marks_store_errors(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = spans
    hook = OpenTelemetryHook(tracer_provider=provider, mode="span")
    engine = Engine(DownStore(), Policy(fail_open=True), on_event=hook)
    with provider.get_tracer("test").start_as_current_span("tool run") as parent:
        assert engine.run("k", fingerprint="fp", action=lambda: "unprotected") == "unprotected"

    by_name = {s.name: s for s in exporter.get_finished_spans()}
    error = by_name["idempotency.store_error"]
    assert error.parent is not None
    assert error.parent.span_id == parent.get_span_context().span_id
    assert error.status.status_code is StatusCode.ERROR
    assert "connection refused" in (error.status.description or "")
    assert (error.attributes or {})["idempotency.op"] == "claim"
    assert by_name["idempotency.fail_open"].status.status_code is StatusCode.ERROR
    assert by_name["tool run"].status.status_code is StatusCode.UNSET


def test_event_mode_and_kinds_filter_what_is_reported(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = spans
    only_replays = OpenTelemetryHook(tracer_provider=provider, kinds=["replay"])
    engine = Engine(InMemoryIdempotencyStore(), Policy(), on_event=only_replays)
    engine.run("k", fingerprint="fp", action=lambda: 1)
    engine.run("k", fingerprint="fp", action=lambda: 1)
    assert [s.name for s in exporter.get_finished_spans()] == ["idempotency.replay"]

    exporter.clear()
    annotate_only = OpenTelemetryHook(tracer_provider=provider, mode="event")
    annotate_only(IdempotencyEvent("replay", "k"))  # no current span: dropped
    assert exporter.get_finished_spans() == ()

    with pytest.raises(ValueError, match="unknown event kind"):
        OpenTelemetryHook(kinds=["replayed"])
    with pytest.raises(ValueError, match="mode"):
        OpenTelemetryHook(mode="trace")  # type: ignore[arg-type]


def test_detail_values_become_plain_attribute_values() -> None:
    event = IdempotencyEvent(
        "wait", "k", "t", 3, 2, {"lease_left_ms": 1200, "stored": True, "obj": object}
    )
    attributes = event_attributes(event)
    assert attributes["idempotency.lease_left_ms"] == 1200
    assert attributes["idempotency.stored"] is True
    assert attributes["idempotency.obj"] == "<class 'object'>"


def test_without_opentelemetry_installed_the_hook_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in [m for m in sys.modules if m == "opentelemetry" or m.startswith("opentelemetry.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # import now fails
    import langchain_idempotent.integrations.otel as otel

    otel = importlib.reload(otel)  # the module itself imports without opentelemetry
    assert otel.otel_available() is False
    with pytest.raises(ImportError, match=r"langchain-idempotent\[otel\]"):
        otel.OpenTelemetryHook()
