"""OpenTelemetry for idempotent tool calls, as an ``on_event`` hook: spans and metrics.

::

    from langchain_idempotent.integrations.otel import OpenTelemetryHook

    refund = idempotent(issue_refund, store=store, on_event=OpenTelemetryHook())

Needs ``opentelemetry-api`` (``pip install "langchain-idempotent[otel]"``); the library
itself never imports it, and constructing the hook without it raises :class:`ImportError`
saying what to install. Spans go to the global tracer provider and metrics to the global
meter provider unless ``tracer_provider`` / ``meter_provider`` is given; with no SDK
configured they cost next to nothing. A provider of the wrong type is a :class:`TypeError`.

**Spans.** Each :class:`~langchain_idempotent.core.events.IdempotencyEvent` becomes, by ``mode``:

- ``"auto"`` (default): a span event ``idempotency.<kind>`` on the current span when one is
  recording (the tool run's span, under LangChain / LangSmith OpenTelemetry tracing),
  otherwise a span of its own, so no event is lost;
- ``"span"``: always a span ``idempotency.<kind>`` (a child of the current span, if any);
- ``"event"``: only a span event on the current span (dropped when none is recording).

Attributes, on spans and span events alike, after the OpenTelemetry GenAI conventions:
``gen_ai.operation.name`` (``execute_tool``), ``gen_ai.tool.name``, ``gen_ai.tool.call.id``
(when known); and ``idempotency.kind``, ``idempotency.key``, ``idempotency.fence``,
``idempotency.attempt`` (the attempt ordinal: one operation, one key, attempts 1, 2, ...)
and one ``idempotency.<name>`` per detail entry (``op``, ``error``, ``claim_ms``, ...).
The spans this hook creates for ``store_error`` and ``fail_open`` get status ``ERROR``;
it never changes the status of a span it did not create.

**Metrics** (instrument names as exported; Prometheus adds ``_total`` / ``_seconds``):

=================================  =========  ==========================================
``idempotency.calls``              counter    one per call, by ``idempotency.outcome``
                                              (:data:`OUTCOMES`) and ``gen_ai.tool.name``
``idempotency.claim.duration``     histogram  a claim's store round trip, seconds
``idempotency.wait.duration``      histogram  how long a call waited out another owner's
                                              lease before its answer, seconds
``idempotency.reconcile.verdicts`` counter    reconcile hook answers, by
                                              ``idempotency.reconcile.verdict`` (``found``,
                                              ``not_found``, ``error``)
``idempotency.reconcile.duration`` histogram  how long a reconcile hook took, seconds
``idempotency.store.errors``       counter    store errors, by ``idempotency.operation``
                                              (``claim``, ``complete``, ``release``, ...)
``idempotency.lease.lost``         counter    renewals that found the lease gone
=================================  =========  ==========================================

Every metric carries ``gen_ai.tool.name`` when the tool is known; none carries the key (its
cardinality is unbounded). The outcome of a call: ``first_run`` (claimed, the tool ran),
``replay`` (a stored answer), ``takeover`` (an expired attempt's outcome unknown: the tool
runs again, no reconcile hook or the hook found nothing), ``free_retry`` (the expired
attempt never entered its side effect), ``reconciled`` (a reconcile hook found the
result; the tool did not run), ``conflict`` (the key reused with other arguments) and
``error`` (the claim failed: the store down or the record unreadable, the outcome unknown
under ``on_expired="raise"``, or the reconcile hook raised). A wait that runs out
(:class:`~langchain_idempotent.errors.InProgressError`) emits no event, so no outcome.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal

from ..core.events import EVENT_KINDS, IdempotencyEvent

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider

__all__ = ["OUTCOMES", "OpenTelemetryHook", "event_attributes", "otel_available"]

Mode = Literal["auto", "span", "event"]
_ERROR_KINDS = frozenset({"store_error", "fail_open"})
_AttributeValue = str | bool | int | float
#: The values of ``idempotency.outcome`` on ``idempotency.calls``.
OUTCOMES = ("first_run", "replay", "takeover", "free_retry", "reconciled", "conflict", "error")
#: The outcome an event decides on its own (takeovers, reconciles and store errors depend
#: on their detail: :func:`_outcome`).
_OUTCOME_OF: dict[str, str] = {
    "claim": "first_run",
    "replay": "replay",
    "free_retry": "free_retry",
    "payload_mismatch": "conflict",
    "outcome_unknown": "error",
}
#: Bucket boundaries (seconds) for the claim and reconcile histograms: a claim is well
#: under a millisecond in memory, a few ms on a network store; a wait is bounded by a lease.
_CLAIM_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                  0.25, 0.5, 1.0, 2.5)  # fmt: skip
_WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
#: The counters: name -> (unit, description).
_COUNTERS = {
    "idempotency.calls": ("{call}", "Idempotent tool calls, by outcome"),
    "idempotency.reconcile.verdicts": ("{verdict}", "Reconcile hook answers, by verdict"),
    "idempotency.store.errors": ("{error}", "Store operations that failed, by operation"),
    "idempotency.lease.lost": ("{lease}", "Renewals that found the lease gone while the tool ran"),
}
#: The histograms, in seconds: name -> (description, bucket boundaries).
_HISTOGRAMS = {
    "idempotency.claim.duration": ("The claim's store round trip", _CLAIM_BUCKETS),
    "idempotency.wait.duration": (
        "Time a call waited out another owner's lease before its answer",
        _WAIT_BUCKETS,
    ),
    "idempotency.reconcile.duration": ("Time a reconcile hook took", _WAIT_BUCKETS),
}


def otel_available() -> bool:
    """Whether ``opentelemetry-api`` can be imported."""
    try:
        import opentelemetry.trace  # noqa: F401
    except ImportError:
        return False
    return True


def event_attributes(event: IdempotencyEvent) -> dict[str, _AttributeValue]:
    """The OpenTelemetry attributes of ``event`` (values are str, bool, int or float)."""
    attributes: dict[str, _AttributeValue] = {"gen_ai.operation.name": "execute_tool"}
    if event.tool is not None:
        attributes["gen_ai.tool.name"] = event.tool
    if event.call_id is not None:
        attributes["gen_ai.tool.call.id"] = event.call_id
    attributes["idempotency.kind"] = event.kind
    attributes["idempotency.key"] = event.key
    attributes["idempotency.fence"] = event.fence
    attributes["idempotency.attempt"] = event.attempt
    for name, value in event.detail.items():
        attributes[f"idempotency.{name}"] = (
            value if isinstance(value, str | bool | int | float) else str(value)
        )
    return attributes


def _outcome(event: IdempotencyEvent) -> str | None:
    """The call outcome ``event`` settles, or ``None`` (not a call's deciding event, or one
    whose outcome a later event settles: a takeover whose reconcile hook is asked)."""
    kind, detail = event.kind, event.detail
    if kind == "takeover":
        return None if detail.get("reconcile") else "takeover"
    if kind == "reconcile":
        verdict = detail.get("outcome")
        if verdict == "found":
            return "reconciled"
        if verdict == "error":
            return "error"
        # Not found: a takeover runs the tool; under on_expired="raise" outcome_unknown follows.
        return "takeover" if detail.get("takeover") else None
    if kind == "store_error":
        return "error" if detail.get("op") == "claim" else None
    return _OUTCOME_OF.get(kind)


class OpenTelemetryHook:
    """An ``on_event`` hook that reports idempotency events to OpenTelemetry: spans (or
    span events) and metrics (see the module).

    ``kinds`` limits which event kinds become spans or span events (default: all of
    :data:`~langchain_idempotent.core.events.EVENT_KINDS`); metrics always see every event.
    """

    def __init__(
        self,
        *,
        mode: Mode = "auto",
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        kinds: Iterable[str] | None = None,
    ) -> None:
        try:
            from opentelemetry import metrics, trace
        except ImportError as exc:
            raise ImportError(
                "OpenTelemetryHook needs opentelemetry-api: "
                'pip install "langchain-idempotent[otel]"'
            ) from exc
        if mode not in ("auto", "span", "event"):
            raise ValueError(f"mode must be 'auto', 'span' or 'event', got {mode!r}")
        if tracer_provider is not None and not isinstance(tracer_provider, trace.TracerProvider):
            raise TypeError(
                "tracer_provider must be an opentelemetry.trace.TracerProvider (e.g. "
                f"opentelemetry.sdk.trace.TracerProvider()), got {type(tracer_provider).__name__}"
            )
        if meter_provider is not None and not isinstance(meter_provider, metrics.MeterProvider):
            raise TypeError(
                "meter_provider must be an opentelemetry.metrics.MeterProvider (e.g. "
                "opentelemetry.sdk.metrics.MeterProvider(metric_readers=[...])), got "
                f"{type(meter_provider).__name__}"
            )
        selected = frozenset(EVENT_KINDS if kinds is None else kinds)
        unknown = sorted(selected - set(EVENT_KINDS))
        if unknown:
            raise ValueError(
                f"unknown event kind(s) {', '.join(unknown)}; known: {', '.join(EVENT_KINDS)}"
            )
        self.mode: Mode = mode
        self.kinds = selected
        self._trace = trace
        version = _version() or ""
        self._tracer = trace.get_tracer(
            "langchain_idempotent", version, tracer_provider=tracer_provider
        )
        meter = metrics.get_meter("langchain_idempotent", version, meter_provider=meter_provider)
        self._counters = {
            name: meter.create_counter(name, unit=unit, description=about)
            for name, (unit, about) in _COUNTERS.items()
        }
        self._histograms = {
            name: meter.create_histogram(
                name, unit="s", description=about, explicit_bucket_boundaries_advisory=buckets
            )
            for name, (about, buckets) in _HISTOGRAMS.items()
        }

    def __call__(self, event: IdempotencyEvent) -> None:
        self._measure(event)
        if event.kind not in self.kinds:
            return
        name = f"idempotency.{event.kind}"
        attributes = event_attributes(event)
        if self.mode != "span":
            current = self._trace.get_current_span()
            if current.is_recording():
                current.add_event(name, attributes)
                return
            if self.mode == "event":
                return
        span = self._tracer.start_span(name, attributes=attributes)
        try:
            if event.kind in _ERROR_KINDS:
                span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, _error(event)))
        finally:
            span.end()

    def _measure(self, event: IdempotencyEvent) -> None:
        tool: Mapping[str, str] = {} if event.tool is None else {"gen_ai.tool.name": event.tool}
        count, record = self._counters, self._histograms
        detail = event.detail
        outcome = _outcome(event)
        if outcome is not None:
            count["idempotency.calls"].add(1, {**tool, "idempotency.outcome": outcome})
        for field, name in (("claim_ms", "claim.duration"), ("waited_ms", "wait.duration")):
            if (ms := detail.get(field)) is not None:
                record[f"idempotency.{name}"].record(ms / 1000, tool)
        if event.kind == "reconcile":
            verdict = {**tool, "idempotency.reconcile.verdict": str(detail.get("outcome"))}
            count["idempotency.reconcile.verdicts"].add(1, verdict)
            if (ms := detail.get("duration_ms")) is not None:
                record["idempotency.reconcile.duration"].record(ms / 1000, tool)
        elif event.kind == "store_error":
            op = {**tool, "idempotency.operation": str(detail.get("op", "unknown"))}
            count["idempotency.store.errors"].add(1, op)
        elif event.kind == "lease_lost":
            count["idempotency.lease.lost"].add(1, tool)


def _error(event: IdempotencyEvent) -> str:
    detail: Any = event.detail.get("error")
    return str(detail) if detail is not None else event.kind


def _version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("langchain-idempotent")
    except PackageNotFoundError:
        return None
