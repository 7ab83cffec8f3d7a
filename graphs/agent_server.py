"""The refund agent as the LangGraph Agent Server serves it (``langgraph.json``).

``langgraph dev`` (``pip install 'langchain-idempotent[server]'``) serves two assistants:

- ``refund_agent``: ``issue_refund`` and ``notify_customer`` wrapped with ``idempotent()``;
- ``refund_agent_plain``: the same agent with plain tools (to show the duplicates).

Both are graph *factories* (called by the server per run) compiled without a checkpointer:
the server brings its own. The agent is async end to end (an async planner node, async
tools on ``httpx.AsyncClient``), so a run cancelled by a double-texted run
(``multitask_strategy="interrupt"`` / ``"rollback"``) is cancelled inside the tool, and
every store operation runs on the async path under the dev server's blocking-call
detector. The planner is the scripted model (no API key, no network).

Configuration, read from the environment when a run builds the graph:

- ``REFUND_PROVIDER_URL`` (required): the payment provider (:mod:`graphs.provider`).
- ``IDEMPOTENCY_STORE_URL``: the store (default ``sqlite:///idempotency.db``, a file in
  the server's working directory; use Redis or PostgreSQL when several servers share work).
- ``IDEMPOTENCY_LEASE`` and the other ``IDEMPOTENCY_*`` policy fields
  (:meth:`~langchain_idempotent.Policy.from_env`). ``wait_timeout`` defaults to ``None``
  here: a run re-dispatched while the first still runs the tool waits for it as long as
  its lease is renewed (set ``IDEMPOTENCY_WAIT_TIMEOUT`` to bound it).

Per run, ``configurable.settle_seconds`` (default 0) keeps ``issue_refund`` busy that long
after the provider committed the refund (waiting for the refund to settle): the window in
which the scenario tests cancel, kill or re-dispatch a run *after* the effect.

A takeover of an uncertain ``issue_refund`` (its owner was cancelled or died) asks the
provider whether the refund already happened (:func:`refund_status`) instead of sending it
again.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
from typing import Any

import httpx
from langchain_core.messages import BaseMessage, SystemMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, tool
from langgraph.graph import MessagesState
from langgraph.graph.state import CompiledStateGraph

from graphs.fake_model import ScriptedRefundModel
from graphs.refund_agent import SYSTEM_PROMPT, agent_loop
from graphs.tools import (
    DEFAULT_TIMEOUT,
    ProviderRejectedError,
    ProviderUnavailableError,
)
from langchain_idempotent import (
    BaseIdempotencyStore,
    Policy,
    ReconcileCall,
    get_idempotency_context,
    idempotent,
)
from langchain_idempotent.settings import store_from_url

__all__ = ["plain", "protected", "refund_status"]

ServerAgent = CompiledStateGraph[MessagesState, None, MessagesState, MessagesState]

#: ``idempotency.db`` in the server's directory, resolved when the server imports this module:
#: resolving it in a run would call ``os.getcwd()``, a blocking call on the server's loop.
DEFAULT_STORE_URL = "sqlite:///" + os.path.abspath("idempotency.db")


def _provider_url() -> str:
    url = os.environ.get("REFUND_PROVIDER_URL")
    if not url:
        raise RuntimeError(
            "set REFUND_PROVIDER_URL to the payment provider's URL (start one with "
            "graphs.provider.PaymentProvider(path, invoices=[...]).start()) before starting "
            "the server"
        )
    return url


def _client() -> httpx.AsyncClient:
    # verify=False / trust_env=False: plain HTTP on loopback; nothing to read from disk
    # (no CA bundle, no .netrc) inside the event loop.
    return httpx.AsyncClient(
        base_url=_provider_url(), timeout=DEFAULT_TIMEOUT, verify=False, trust_env=False
    )


async def _call(method: str, path: str, **kwargs: Any) -> str:
    try:
        async with _client() as http:
            response = await http.request(method, path, **kwargs)
    except httpx.TransportError as exc:
        raise ProviderUnavailableError(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
    if response.status_code >= 500:
        raise ProviderUnavailableError(f"{method} {path}: HTTP {response.status_code}")
    if response.status_code >= 400:
        raise ProviderRejectedError(f"{method} {path}: HTTP {response.status_code} {response.text}")
    return json.dumps(response.json(), sort_keys=True)


def _headers() -> dict[str, str]:
    ctx = get_idempotency_context()
    if ctx is None:  # plain tools: nothing to hand downstream
        return {}
    return {"Idempotency-Key": ctx.key, "Idempotency-Fence": str(ctx.fence)}


@tool
async def lookup_invoice(invoice_id: str) -> str:
    """Look up an invoice: its customer, amount (in cents) and currency."""
    return await _call("GET", f"/invoices/{invoice_id}")


@tool
async def issue_refund(invoice_id: str, amount: float, reason: str, config: RunnableConfig) -> str:
    """Refund `amount` dollars of invoice `invoice_id` to its customer. Moves money."""
    cents = round(amount * 100)
    body = {"invoice_id": invoice_id, "amount_cents": cents, "reason": reason}
    result = await _call("POST", "/refunds", json=body, headers=_headers())
    settle = float(config.get("configurable", {}).get("settle_seconds", 0))
    if settle > 0:
        await asyncio.sleep(settle)  # the refund is committed; the tool is still running
    return result


@tool
async def notify_customer(customer_id: str, ticket_id: str, message: str) -> str:
    """Send the customer a message about their ticket."""
    body = {"customer_id": customer_id, "ticket_id": ticket_id, "message": message}
    return await _call("POST", "/notifications", json=body, headers=_headers())


async def refund_status(call: ReconcileCall) -> str | None:
    """Did a refund with this key reach the provider? Its result if so, else ``None``.

    Asked when ``issue_refund``'s previous attempt was cancelled or died mid-call: the
    provider's ledger keeps the ``Idempotency-Key`` of every refund.
    """
    ledger = json.loads(await _call("GET", "/ledger"))
    for refund in ledger["refunds"]:
        if refund["idempotency_key"] == call.key:
            return json.dumps(
                {
                    "id": refund["refund_id"],
                    "object": "refund",
                    "invoice": refund["invoice_id"],
                    "customer": refund["customer_id"],
                    "amount": refund["amount_cents"],
                    "currency": refund["currency"],
                    "status": "succeeded",
                    "created": refund["created_at"],
                },
                sort_keys=True,
            )
    return None


@functools.cache
def _store(url: str) -> BaseIdempotencyStore:
    return store_from_url(url)  # one store (and connection pool) per server process


def _policy() -> Policy:
    # key_exclude=["context"]: the Agent Server mirrors a run's configurable into the run
    # context (here the demo's settle_seconds knob, set on the first run only), and these
    # tools read nothing from it, so a double-texted run is the same effect (docs/keys.md).
    policy = Policy.from_env().with_options(key_exclude=("context",))
    if "IDEMPOTENCY_WAIT_TIMEOUT" not in os.environ:
        policy = policy.with_options(wait_timeout=None)
    return policy


def _protect(tools: list[BaseTool]) -> list[BaseTool]:
    store = _store(os.environ.get("IDEMPOTENCY_STORE_URL") or DEFAULT_STORE_URL)
    refund, notify = tools
    return [
        idempotent(refund, store, policy=_policy(), reconcile=refund_status),
        idempotent(notify, store, policy=_policy()),
    ]


def _build(*, protect: bool) -> ServerAgent:
    _provider_url()  # fail at the first run, with the fix in the message
    effectful: list[BaseTool] = [issue_refund, notify_customer]
    tools = [lookup_invoice, *(_protect(effectful) if protect else effectful)]
    bound = ScriptedRefundModel().bind_tools(tools)

    async def planner(state: MessagesState) -> dict[str, list[BaseMessage]]:
        reply = await bound.ainvoke([SystemMessage(SYSTEM_PROMPT), *state["messages"]])
        return {"messages": [reply]}

    graph = agent_loop(planner, tools)
    return graph.compile()  # no checkpointer: the server provides it


def protected() -> ServerAgent:
    """``refund_agent``: the effectful tools run once per thread and arguments."""
    return _build(protect=True)


def plain() -> ServerAgent:
    """``refund_agent_plain``: the same agent without protection."""
    return _build(protect=False)
