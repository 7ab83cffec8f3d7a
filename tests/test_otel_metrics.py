"""OpenTelemetry metrics from idempotency events: what an on-call engineer alerts on.

Read with the SDK's own ``InMemoryMetricReader`` and ``InMemorySpanExporter``; the calls
run through the real engine, stores and LangGraph ``ToolNode``. The Prometheus text an
operator scrapes is checked in ``tests/test_otel_prometheus.py``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")

from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from langchain_idempotent import (
    InMemoryIdempotencyStore,
    OutcomeUnknownError,
    PayloadMismatchError,
    Policy,
    ReconcileCall,
    SqliteIdempotencyStore,
    StoreUnavailableError,
    idempotent,
)
from langchain_idempotent.core.engine import Engine
from langchain_idempotent.core.store import ClaimRequest, Held
from langchain_idempotent.integrations.otel import OUTCOMES, OpenTelemetryHook
from tests.support.graphs import thread

Points = dict[tuple[str, frozenset[tuple[str, Any]]], Any]


@pytest.fixture
def reader() -> Iterator[InMemoryMetricReader]:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    reader.provider = provider  # type: ignore[attr-defined]
    yield reader
    provider.shutdown()


def hook_for(reader: InMemoryMetricReader, **options: Any) -> OpenTelemetryHook:
    return OpenTelemetryHook(meter_provider=reader.provider, **options)  # type: ignore[attr-defined]


def points(reader: InMemoryMetricReader) -> Points:
    """Every data point: (instrument, attributes) -> a counter's value or a histogram point."""
    data = reader.get_metrics_data()
    found: Points = {}
    for resource in data.resource_metrics if data is not None else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    attrs = frozenset((point.attributes or {}).items())
                    found[(metric.name, attrs)] = (
                        point if isinstance(point, HistogramDataPoint) else point.value
                    )
    return found


def calls(reader: InMemoryMetricReader, tool: str = "issue_refund") -> dict[str, int]:
    """``idempotency.calls`` for ``tool``, by outcome."""
    out: dict[str, int] = {}
    for (name, attrs), value in points(reader).items():
        a = dict(attrs)
        if name == "idempotency.calls" and a.get("gen_ai.tool.name") == tool:
            out[a["idempotency.outcome"]] = value
    return out


def expire(store: InMemoryIdempotencyStore, key: str, *, boundary: bool = False) -> None:
    """A worker claimed ``key`` and died: its attempt is uncertain (lease ended, no result)."""
    c = store.claim(ClaimRequest(key, "dead", "fp", 5000, 60_000, boundary=boundary))
    assert store.abandon(Held(key, "dead", c.fence), "lease_expired")


class DownStore(InMemoryIdempotencyStore):
    def claim(self, request: ClaimRequest) -> object:  # type: ignore[override]
        raise StoreUnavailableError("connection refused", key=request.key)


def test_each_call_is_counted_once_under_its_outcome(reader: InMemoryMetricReader) -> None:
    store = InMemoryIdempotencyStore()
    effects: list[str] = []
    found: dict[str, str] = {"k-reconciled": "refunded earlier"}

    def reconcile(call: ReconcileCall) -> str | None:
        if call.key == "k-reconcile-fails":
            raise RuntimeError("the provider's API is down")
        return found.get(call.key)

    hook = hook_for(reader)
    engine = Engine(store, Policy(reconcile=reconcile), on_event=hook)
    plain = Engine(store, Policy(), on_event=hook)  # no reconcile hook
    marked = Engine(store, Policy(boundary=True), on_event=hook)

    def run(e: Engine, key: str, fp: str = "fp") -> Any:
        return e.run(key, fingerprint=fp, action=lambda: effects.append(key), tool="issue_refund")

    run(engine, "k-1")  # first_run
    run(engine, "k-1")  # replay
    run(engine, "k-1")  # replay
    with pytest.raises(PayloadMismatchError):
        run(engine, "k-1", fp="other")  # conflict
    expire(store, "k-takeover")
    run(plain, "k-takeover")  # takeover: no hook, the tool runs again
    expire(store, "k-not-found")
    run(engine, "k-not-found")  # takeover: the hook found nothing, the tool runs
    expire(store, "k-reconciled")
    assert run(engine, "k-reconciled") == "refunded earlier"  # reconciled, the tool did not run
    expire(store, "k-reconcile-fails")
    with pytest.raises(RuntimeError):
        run(engine, "k-reconcile-fails")  # error
    expire(store, "k-free", boundary=True)
    run(marked, "k-free")  # free_retry: the dead attempt never entered its block
    expire(store, "k-raise")
    with pytest.raises(OutcomeUnknownError):
        Engine(store, Policy(on_expired="raise"), on_event=hook).run(
            "k-raise", fingerprint="fp", action=lambda: None, tool="issue_refund"
        )  # error
    with pytest.raises(StoreUnavailableError):
        Engine(DownStore(), Policy(), on_event=hook).run(
            "k-down", fingerprint="fp", action=lambda: None, tool="issue_refund"
        )  # error

    assert calls(reader) == {
        "first_run": 1,
        "replay": 2,
        "conflict": 1,
        "takeover": 2,
        "reconciled": 1,
        "error": 3,
        "free_retry": 1,
    }
    assert set(calls(reader)) == set(OUTCOMES)
    assert sorted(effects) == ["k-1", "k-free", "k-not-found", "k-takeover"]
    p = points(reader)
    verdicts = {
        dict(a)["idempotency.reconcile.verdict"]: v
        for (n, a), v in p.items()
        if n == "idempotency.reconcile.verdicts"
    }
    assert verdicts == {"found": 1, "not_found": 1, "error": 1}
    tool = frozenset({("gen_ai.tool.name", "issue_refund")})
    assert p[("idempotency.store.errors", tool | {("idempotency.operation", "claim")})] == 1
    # Every claim's round trip is in the histogram, in seconds; the reconcile hooks' too.
    claims = p[("idempotency.claim.duration", tool)]
    assert claims.count == 11 and 0 < claims.sum < 11
    assert p[("idempotency.reconcile.duration", tool)].count == 3


def test_a_duplicate_that_waits_out_a_live_lease_records_how_long(
    reader: InMemoryMetricReader, tmp_path: Path
) -> None:
    store = SqliteIdempotencyStore(tmp_path / "records.db")
    engine = Engine(store, Policy(lease=10, wait_timeout=10), on_event=hook_for(reader))
    running, finish = threading.Event(), threading.Event()
    effects: list[int] = []

    def slow_refund() -> str:
        effects.append(1)
        running.set()
        assert finish.wait(10)
        return "refunded"

    def call(action: Any) -> Any:
        return engine.run("k", fingerprint="fp", action=action, tool="issue_refund")

    first = threading.Thread(target=call, args=(slow_refund,))
    first.start()
    assert running.wait(10)
    timer = threading.Timer(0.2, finish.set)
    timer.start()
    assert call(lambda: "duplicate") == "refunded"  # waited, then replayed
    first.join()
    assert effects == [1]
    assert calls(reader) == {"first_run": 1, "replay": 1}
    waits = points(reader)[
        ("idempotency.wait.duration", frozenset({("gen_ai.tool.name", "issue_refund")}))
    ]
    assert waits.count == 1 and 0.1 < waits.sum < 10


def test_spans_carry_the_tool_call_id_and_the_attempt_of_each_operation(
    reader: InMemoryMetricReader,
) -> None:
    exporter = InMemorySpanExporter()
    tracer = TracerProvider()
    tracer.add_span_processor(SimpleSpanProcessor(exporter))
    store = InMemoryIdempotencyStore()
    refunds: list[str] = []

    @tool
    def issue_refund(invoice_id: str) -> str:
        """Refund an invoice."""
        refunds.append(invoice_id)
        return f"refunded {invoice_id}"

    hook = OpenTelemetryHook(tracer_provider=tracer, meter_provider=reader.provider)  # type: ignore[attr-defined]
    builder = StateGraph(MessagesState)
    builder.add_node("tools", ToolNode([idempotent(issue_refund, store=store, on_event=hook)]))
    builder.add_edge(START, "tools")
    graph = builder.compile()
    message = AIMessage(
        "", tool_calls=[{"name": "issue_refund", "args": {"invoice_id": "INV-7"}, "id": "call_1"}]
    )
    graph.invoke({"messages": [message]}, thread("t-1"))
    graph.invoke({"messages": [message]}, thread("t-1"))  # the step replayed: same call id
    assert refunds == ["INV-7"]
    spans = [s for s in exporter.get_finished_spans() if s.name.startswith("idempotency.")]
    assert [s.name for s in spans] == [
        "idempotency.claim",
        "idempotency.complete",
        "idempotency.replay",
    ]
    for span in spans:
        a = span.attributes or {}
        assert a["gen_ai.operation.name"] == "execute_tool"
        assert a["gen_ai.tool.name"] == "issue_refund"
        assert a["gen_ai.tool.call.id"] == "call_1"
        assert a["idempotency.attempt"] == 1
    assert calls(reader) == {"first_run": 1, "replay": 1}
    tracer.shutdown()


def test_a_provider_of_the_wrong_type_is_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"meter_provider must be an opentelemetry\.metrics"):
        OpenTelemetryHook(meter_provider=InMemoryMetricReader())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="got MeterProvider"):
        OpenTelemetryHook(tracer_provider=MeterProvider())  # type: ignore[arg-type]
