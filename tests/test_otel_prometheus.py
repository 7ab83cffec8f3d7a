"""The Prometheus side of the metrics: what an operator scrapes, and the alert rules in
``docs/operations.md`` naming only series the hook exports. (The page's snippet, scraped
from a real HTTP endpoint, runs in ``tests/test_docs.py``.)"""

from __future__ import annotations

import re
from collections.abc import Iterator
from urllib.request import urlopen

import pytest
import yaml

pytest.importorskip("opentelemetry.exporter.prometheus", reason="the otel extra is not installed")

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import CollectorRegistry, start_http_server

from langchain_idempotent import (
    IdempotencyEvent,
    InMemoryIdempotencyStore,
    Policy,
    StoreUnavailableError,
)
from langchain_idempotent.core.engine import Engine
from langchain_idempotent.core.store import ClaimRequest, Held
from langchain_idempotent.integrations.otel import OpenTelemetryHook

from .support.docs import DOCS

SUFFIXES = ("_bucket", "_count", "_sum")
#: What a scrape shows once every instrument has a data point: family -> type.
EXPORTED = {
    "idempotency_calls_total": "counter",
    "idempotency_claim_duration_seconds": "histogram",
    "idempotency_wait_duration_seconds": "histogram",
    "idempotency_reconcile_verdicts_total": "counter",
    "idempotency_reconcile_duration_seconds": "histogram",
    "idempotency_store_errors_total": "counter",
    "idempotency_lease_lost_total": "counter",
}


class DownStore(InMemoryIdempotencyStore):
    def claim(self, request: ClaimRequest) -> object:  # type: ignore[override]
        raise StoreUnavailableError("connection refused", key=request.key)


@pytest.fixture
def scrape() -> Iterator[tuple[OpenTelemetryHook, str]]:
    """A hook exporting to a private registry served on loopback, and the endpoint's URL."""
    registry = CollectorRegistry()
    reader = PrometheusMetricReader(registry=registry)
    provider = MeterProvider(metric_readers=[reader])
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    yield OpenTelemetryHook(meter_provider=provider), f"http://127.0.0.1:{server.server_port}/"
    server.shutdown()
    thread.join(5)
    provider.shutdown()


def exported(text: str) -> dict[str, str]:
    """Metric family -> type, from the ``# TYPE`` lines of a scrape (ours: ``idempotency_``)."""
    return dict(re.findall(r"^# TYPE (idempotency_\S+) (\S+)$", text, flags=re.MULTILINE))


def test_every_instrument_is_scraped_under_its_documented_name(
    scrape: tuple[OpenTelemetryHook, str],
) -> None:
    hook, url = scrape
    store = InMemoryIdempotencyStore()
    engine = Engine(store, Policy(reconcile=lambda call: "found"), on_event=hook)
    engine.run("k", fingerprint="fp", action=lambda: 1, tool="issue_refund")
    engine.run("k", fingerprint="fp", action=lambda: 1, tool="issue_refund")
    c = store.claim(ClaimRequest("k2", "dead", "fp", lease_ms=5000, ttl_ms=60_000))
    store.abandon(Held("k2", "dead", c.fence), "lease_expired")
    assert engine.run("k2", fingerprint="fp", action=lambda: 1, tool="issue_refund") == "found"
    with pytest.raises(StoreUnavailableError):
        Engine(DownStore(), on_event=hook).run("k3", fingerprint="fp", action=lambda: 1)
    # A wait and a lost lease, as the engine reports them (their scenarios: test_otel_metrics).
    hook(IdempotencyEvent("replay", "k4", "issue_refund", 1, 1, {"claim_ms": 1, "waited_ms": 40}))
    hook(IdempotencyEvent("lease_lost", "k5", "issue_refund", 1, 1))

    text = urlopen(url, timeout=10).read().decode()
    assert exported(text) == EXPORTED
    page = (DOCS / "operations.md").read_text()
    for name in exported(text):
        assert f"`{name}`" in page, name
    assert re.search(
        r'^idempotency_calls_total\{gen_ai_tool_name="issue_refund",'
        r'idempotency_outcome="reconciled",[^}]*\} 1\.0$',
        text,
        flags=re.MULTILINE,
    )
    assert 'idempotency_reconcile_verdicts_total{gen_ai_tool_name="issue_refund",' in text


def test_the_documented_alert_rules_name_only_exported_series() -> None:
    names = set(EXPORTED)  # checked against a real scrape above
    block = re.search(r"```yaml\n(groups:.*?)```", (DOCS / "operations.md").read_text(), re.S)
    assert block is not None, "the alert rules block is gone"
    rules = yaml.safe_load(block.group(1))["groups"][0]["rules"]
    assert len(rules) >= 8
    labels = {"gen_ai_tool_name", "idempotency_outcome", "idempotency_operation",
              "idempotency_reconcile_verdict", "le"}  # fmt: skip
    for rule in rules:
        expr = rule["expr"]
        series = set(re.findall(r"\b(idempotency_[a-z_]+)", expr)) - labels
        assert series, rule["alert"]
        for name in series:
            base = next((name[: -len(s)] for s in SUFFIXES if name.endswith(s)), name)
            assert base in names, (rule["alert"], name)
        for label in re.findall(r"\b([a-z_]+)\s*(?:=~|=)\s*\"", expr):
            assert label in labels, (rule["alert"], label)
