"""OpenTelemetry for idempotent tool calls, as an ``on_event`` hook.

::

    from langchain_idempotent.otel import OpenTelemetryHook

    refund = idempotent(issue_refund, store=store, on_event=OpenTelemetryHook())

Needs ``opentelemetry-api`` (``pip install "langchain-idempotent[otel]"``); the library
itself never imports it, and constructing the hook without it raises :class:`ImportError`
saying what to install. Spans go to the global tracer provider unless ``tracer_provider``
is given; with no SDK configured they cost next to nothing.

Each :class:`~langchain_idempotent.events.IdempotencyEvent` becomes, by ``mode``:

- ``"auto"`` (default): a span event ``idempotency.<kind>`` on the current span when one is
  recording (the tool run's span, under LangChain / LangSmith OpenTelemetry tracing),
  otherwise a span of its own, so no event is lost;
- ``"span"``: always a span ``idempotency.<kind>`` (a child of the current span, if any);
- ``"event"``: only a span event on the current span (dropped when none is recording).

Attributes, on spans and span events alike: ``idempotency.kind``, ``idempotency.key``,
``idempotency.tool``, ``idempotency.fence``, ``idempotency.attempt`` and one
``idempotency.<name>`` per detail entry (``op``, ``error``, ``lease_left_ms``, ``stored``).
The spans this hook creates for ``store_error`` and ``fail_open`` get status ``ERROR``;
it never changes the status of a span it did not create.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal

from .events import EVENT_KINDS, IdempotencyEvent

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

__all__ = ["OpenTelemetryHook", "event_attributes", "otel_available"]

Mode = Literal["auto", "span", "event"]
_ERROR_KINDS = frozenset({"store_error", "fail_open"})
_AttributeValue = str | bool | int | float


def otel_available() -> bool:
    """Whether ``opentelemetry-api`` can be imported."""
    try:
        import opentelemetry.trace  # noqa: F401
    except ImportError:
        return False
    return True


def event_attributes(event: IdempotencyEvent) -> dict[str, _AttributeValue]:
    """The OpenTelemetry attributes of ``event`` (values are str, bool, int or float)."""
    attributes: dict[str, _AttributeValue] = {
        "idempotency.kind": event.kind,
        "idempotency.key": event.key,
        "idempotency.fence": event.fence,
        "idempotency.attempt": event.attempt,
    }
    if event.tool is not None:
        attributes["idempotency.tool"] = event.tool
    for name, value in event.detail.items():
        attributes[f"idempotency.{name}"] = (
            value if isinstance(value, str | bool | int | float) else str(value)
        )
    return attributes


class OpenTelemetryHook:
    """An ``on_event`` hook that reports idempotency events to OpenTelemetry.

    ``kinds`` limits which event kinds are reported (default: all of
    :data:`~langchain_idempotent.events.EVENT_KINDS`).
    """

    def __init__(
        self,
        *,
        mode: Mode = "auto",
        tracer_provider: TracerProvider | None = None,
        kinds: Iterable[str] | None = None,
    ) -> None:
        try:
            from opentelemetry import trace
        except ImportError as exc:
            raise ImportError(
                "OpenTelemetryHook needs opentelemetry-api: "
                'pip install "langchain-idempotent[otel]"'
            ) from exc
        if mode not in ("auto", "span", "event"):
            raise ValueError(f"mode must be 'auto', 'span' or 'event', got {mode!r}")
        selected = frozenset(EVENT_KINDS if kinds is None else kinds)
        unknown = sorted(selected - set(EVENT_KINDS))
        if unknown:
            raise ValueError(
                f"unknown event kind(s) {', '.join(unknown)}; known: {', '.join(EVENT_KINDS)}"
            )
        self.mode: Mode = mode
        self.kinds = selected
        self._trace = trace
        self._tracer = trace.get_tracer(
            "langchain_idempotent", _version(), tracer_provider=tracer_provider
        )

    def __call__(self, event: IdempotencyEvent) -> None:
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


def _error(event: IdempotencyEvent) -> str:
    detail: Any = event.detail.get("error")
    return str(detail) if detail is not None else event.kind


def _version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("langchain-idempotent")
    except PackageNotFoundError:
        return None
