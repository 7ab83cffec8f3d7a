"""The refund agent's three tools, calling the payment provider over HTTP.

- ``lookup_invoice``: a read (``GET /invoices/<id>``).
- ``issue_refund``: moves money (``POST /refunds``). Inside an idempotent call it passes
  the idempotency key and fencing token downstream as ``Idempotency-Key`` and
  ``Idempotency-Fence``, so the provider deduplicates the effect itself — the only way a
  refund whose response was lost (dropped connection, dead worker) is not paid twice.
- ``notify_customer``: sends a message (``POST /notifications``), with the key likewise.

:func:`make_reconcilers` gives their ``reconcile=`` hooks: when a call's outcome is
unknown (its worker died, or was cancelled, after the POST; or the POST raised inside its
``side_effect()`` block: a dropped connection, a timeout, a 502), the next attempt asks the
provider ``GET /refunds?idempotency_key=K`` and, if the refund was committed, takes its
stored response as the tool's result instead of sending the POST again.

Provider failures are mapped once, here, to :class:`ProviderError`:
:class:`ProviderUnavailableError` when the outcome is unknown or nothing happened (5xx,
dropped connection, timeout) and :class:`ProviderRejectedError` for a refusal (4xx).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from decimal import ROUND_HALF_UP, Decimal

import httpx
from langchain_core.tools import BaseTool, tool

from langchain_idempotent import ReconcileCall, get_idempotency_context
from langchain_idempotent.core.context import side_effect

__all__ = [
    "DEFAULT_TIMEOUT",
    "ProviderError",
    "ProviderRejectedError",
    "ProviderUnavailableError",
    "make_reconcilers",
    "make_tools",
]

#: Explicit client timeouts (seconds): a hung provider must not hang a worker.
DEFAULT_TIMEOUT = httpx.Timeout(10.0, connect=2.0)


class ProviderError(Exception):
    """The payment provider did not do what was asked (or we cannot know whether it did)."""


class ProviderUnavailableError(ProviderError):
    """5xx, dropped connection or timeout: the request may or may not have taken effect."""


class ProviderRejectedError(ProviderError):
    """A 4xx answer: invalid request, reused key (422), stale fence (409)."""


def _cents(amount: float) -> int:
    return int((Decimal(str(amount)) * 100).quantize(Decimal(1), rounding=ROUND_HALF_UP))


def _idempotency_headers() -> dict[str, str]:
    ctx = get_idempotency_context()
    if ctx is None:  # unprotected (baseline) call: nothing to hand downstream
        return {}
    return {"Idempotency-Key": ctx.key, "Idempotency-Fence": str(ctx.fence)}


def _send(http: httpx.Client, method: str, path: str, **kwargs: object) -> httpx.Response:
    try:
        return http.request(method, path, **kwargs)  # type: ignore[arg-type]
    except httpx.TransportError as exc:
        raise ProviderUnavailableError(f"{method} {path}: {type(exc).__name__}: {exc}") from exc


def _call(http: httpx.Client, method: str, path: str, **kwargs: object) -> str:
    return _answer(_send(http, method, path, **kwargs), method, path)


def _answer(response: httpx.Response, method: str, path: str) -> str:
    """The response body as the tool's result (sorted JSON), or the error it maps to."""
    if response.status_code >= 500:
        raise ProviderUnavailableError(f"{method} {path}: HTTP {response.status_code}")
    if response.status_code >= 400:
        raise ProviderRejectedError(f"{method} {path}: HTTP {response.status_code} {response.text}")
    return json.dumps(response.json(), sort_keys=True)


def make_tools(
    http: httpx.Client,
    *,
    after_refund_committed: Callable[[], None] | None = None,
    on_refund_resent: Callable[[], None] | None = None,
    before_refund: Callable[[], None] | None = None,
    mark_effects: bool = False,
) -> tuple[BaseTool, BaseTool, BaseTool]:
    """``(lookup_invoice, issue_refund, notify_customer)`` bound to ``http``.

    ``http`` must have the provider as ``base_url`` and explicit timeouts (see
    :data:`DEFAULT_TIMEOUT`). ``after_refund_committed`` runs inside ``issue_refund`` once
    the provider has answered with a committed refund, before the tool returns: the demo
    uses it to kill the worker process at the worst moment. ``on_refund_resent`` runs when
    ``issue_refund`` sends its POST as a takeover (a previous attempt's outcome was
    unknown and its hook found nothing committed): a re-sent refund, which the demo counts.
    ``before_refund`` runs inside ``issue_refund`` before its POST (the demo kills the
    worker there too). ``mark_effects``: each POST runs inside ``side_effect()`` (the tools
    are wrapped with ``boundary=True``), so a worker that dies before it is retried freely.
    """

    def crossing() -> contextlib.AbstractContextManager[object]:
        return side_effect() if mark_effects else contextlib.nullcontext()

    @tool
    def lookup_invoice(invoice_id: str) -> str:
        """Look up an invoice: its customer, amount (in cents) and currency."""
        return _call(http, "GET", f"/invoices/{invoice_id}")

    @tool
    def issue_refund(invoice_id: str, amount: float, reason: str) -> str:
        """Refund `amount` dollars of invoice `invoice_id` to its customer. Moves money."""
        body = {"invoice_id": invoice_id, "amount_cents": _cents(amount), "reason": reason}
        ctx = get_idempotency_context()
        if on_refund_resent is not None and ctx is not None and ctx.takeover:
            on_refund_resent()
        if before_refund is not None:
            before_refund()
        with crossing():
            result = _call(http, "POST", "/refunds", json=body, headers=_idempotency_headers())
        if after_refund_committed is not None:
            after_refund_committed()
        return result

    @tool
    def notify_customer(customer_id: str, ticket_id: str, message: str) -> str:
        """Send the customer a message about their ticket."""
        body = {"customer_id": customer_id, "ticket_id": ticket_id, "message": message}
        with crossing():
            return _call(http, "POST", "/notifications", json=body, headers=_idempotency_headers())

    return lookup_invoice, issue_refund, notify_customer


def make_reconcilers(http: httpx.Client) -> dict[str, Callable[[ReconcileCall], str | None]]:
    """``reconcile=`` hooks for ``issue_refund`` and ``notify_customer``, asking the
    provider whether a POST with the call's idempotency key was committed.

    A hook returns the stored response as the tool would have returned it (sorted JSON),
    or ``None`` (``404``: nothing was committed, so the tool runs). Any other failure
    raises a :class:`ProviderError`: the call stays uncertain and is asked about again.
    """

    def lookup(path: str) -> Callable[[ReconcileCall], str | None]:
        def committed(call: ReconcileCall) -> str | None:
            response = _send(http, "GET", path, params={"idempotency_key": call.key})
            if response.status_code == 404:
                return None
            return _answer(response, "GET", path)

        committed.__name__ = f"committed_{path.strip('/')}"
        return committed

    return {"issue_refund": lookup("/refunds"), "notify_customer": lookup("/notifications")}
