"""The seed's fault end to end: a billing POST commits, then the answer is lost.

A real HTTP server on loopback (:mod:`tests.support.billing_server`), called through httpx
with a 0.3 s read timeout, commits a charge and then (a) answers after the read timeout,
(b) resets the connection, (c) answers 502. A LangGraph ``ToolNode`` with
``RetryPolicy(retry_on=httpx.HTTPError)`` retries the node, as a production graph would.
Each effect class is run against a server that honours ``Idempotency-Key`` (Stripe-like)
and one that does not, beside the plain tool, and the charges are counted:

- plain: the retry charges again, on either server (no key is sent);
- ``keyed``: the error releases the key and the retry re-sends it with the same key: the
  honouring server answers from its key table (one charge); the other charges twice
  (``keyed`` is a promise about the downstream, and this one does not keep it);
- ``unsafe`` with ``reconcile=``: the error leaves the key uncertain, the retry is a
  takeover that asks the server what happened and returns the charge it made: one charge;
- ``unsafe`` without it, and ``irreversible`` (approved by a reviewer first): the retry
  stops with ``OutcomeUnknownError`` (an operator resolves it): one charge, never a second
  blind one.

``python -m tests.test_errors_after_effect`` prints the table of these figures.
"""

from __future__ import annotations

import contextlib
import sys
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from langchain_core.messages import AIMessage
from langchain_core.tools import BaseTool, ToolException, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from langgraph.types import Command, RetryPolicy

from langchain_idempotent import (
    InMemoryIdempotencyStore,
    ReconcileCall,
    get_idempotency_context,
    idempotent,
)
from langchain_idempotent.core.context import side_effect
from langchain_idempotent.errors import OutcomeUnknownError
from tests.support.billing_server import FAULTS, BillingServer, Fault

#: The client's read timeout: shorter than the server's slow answer (billing_server.SLOW_S).
READ_TIMEOUT_S = 0.3
#: What the wrapped tools declare proves nothing left the process.
NOT_SENT = (httpx.ConnectError, ConnectionRefusedError)
#: How each row wraps the tool (``None``: plain, unwrapped).
CASES: dict[str, dict[str, Any] | None] = {
    "plain": None,
    "keyed": {"effect": "keyed"},
    "unsafe": {"effect": "unsafe"},
    "unsafe + reconcile=": {"effect": "unsafe", "reconcile": True},
    # A human approves each new irreversible effect: the run is resumed with an approval.
    "irreversible": {"effect": "irreversible"},
}


@dataclass
class Figures:
    case: str
    fault: str
    honours_key: bool
    posts: int = 0
    charges: int = 0
    asked: int = 0
    approvals: int = 0
    #: What the graph's caller got at the end: the charge id, or the exception's name.
    outcome: str = ""
    errors: list[str] = field(default_factory=list)


def _charge_tool(http: httpx.Client, *, marks: bool) -> BaseTool:
    @tool
    def charge(order: str, amount: int) -> str:
        """Charge the customer `amount` cents for `order`. Moves money."""
        ctx = get_idempotency_context()
        headers = {"Idempotency-Key": ctx.key} if ctx is not None else {}
        with side_effect() if marks else contextlib.nullcontext():
            response = http.post(
                "/charges", json={"order": order, "amount": amount}, headers=headers
            )
            response.raise_for_status()  # a 502 after the commit: an exception inside the block
        return str(response.json()["id"])

    return charge


def run_case(case: str, fault: Fault, *, honours_key: bool) -> Figures:
    """One refund through a retrying graph against a fresh server; the figures."""
    options = CASES[case]
    figures = Figures(case, fault, honours_key)
    with (
        BillingServer(fault, honours_key=honours_key) as server,
        httpx.Client(base_url=server.url, timeout=httpx.Timeout(2.0, read=READ_TIMEOUT_S)) as http,
    ):
        tool_: BaseTool = _charge_tool(http, marks=options is not None)
        if options is not None:
            options = dict(options)
            if options.pop("reconcile", False):

                def charged(call: ReconcileCall) -> str | None:
                    figures.asked += 1
                    found = http.get("/charges", params={"order": call.args["order"]})
                    return None if found.status_code == 404 else str(found.json()["id"])

                options["reconcile"] = charged
            store = InMemoryIdempotencyStore()
            tool_ = idempotent(tool_, store, boundary=True, not_sent=NOT_SENT, **options)
        builder = StateGraph(MessagesState)
        retry = RetryPolicy(
            max_attempts=3, initial_interval=0.01, jitter=False, retry_on=httpx.HTTPError
        )
        builder.add_node("tools", ToolNode([tool_]), retry_policy=retry)
        builder.add_edge(START, "tools")
        builder.add_edge("tools", END)
        graph = builder.compile(checkpointer=InMemorySaver())
        call = {"name": "charge", "args": {"order": "ord-7", "amount": 14000}, "id": "call-1"}
        config = {"configurable": {"thread_id": f"t-{uuid.uuid4().hex}"}}
        try:
            out = graph.invoke({"messages": [AIMessage("", tool_calls=[call])]}, config)
            while out.get("__interrupt__"):  # irreversible: the reviewer approves
                figures.approvals += 1
                out = graph.invoke(Command(resume={"decisions": [{"type": "approve"}]}), config)
            figures.outcome = str(out["messages"][-1].content)
        except Exception as exc:  # what the graph's caller sees
            figures.outcome = type(exc).__name__
        figures.posts, figures.charges = server.posts, len(server.charges)
    return figures


@pytest.mark.parametrize("honours_key", [True, False], ids=["honours-key", "ignores-key"])
@pytest.mark.parametrize("fault", FAULTS)
def test_a_lost_answer_after_the_commit_never_pays_twice_unless_the_class_allows_it(
    fault: Fault, honours_key: bool
) -> None:
    plain = run_case("plain", fault, honours_key=honours_key)
    # The fault fired and the retry happened: without protection the charge is paid twice.
    assert (plain.posts, plain.charges, plain.outcome) == (2, 2, "ch_2")

    keyed = run_case("keyed", fault, honours_key=honours_key)
    assert keyed.posts == 2 and keyed.asked == 0  # released: re-sent with the same key
    if honours_key:
        assert (keyed.charges, keyed.outcome) == (1, "ch_1")  # the server's key table
    else:  # keyed promises the downstream dedupes; this one does not, and it shows
        assert keyed.charges == 2

    reconciled = run_case("unsafe + reconcile=", fault, honours_key=honours_key)
    assert (reconciled.posts, reconciled.charges, reconciled.asked) == (1, 1, 1)
    assert reconciled.outcome == "ch_1"  # what the server says it charged

    for case in ("unsafe", "irreversible"):
        stopped = run_case(case, fault, honours_key=honours_key)
        assert (stopped.posts, stopped.charges) == (1, 1), case
        assert stopped.outcome == OutcomeUnknownError.__name__, case
        assert stopped.approvals == (1 if case == "irreversible" else 0), case


def test_an_error_that_proves_nothing_was_sent_is_a_free_retry() -> None:
    # Nothing listens on the port: httpx.ConnectError, named in not_sent=. The key is
    # released, so the retry runs again (and fails again), and nobody is asked.
    asked: list[ReconcileCall] = []
    with httpx.Client(base_url="http://127.0.0.1:9", timeout=READ_TIMEOUT_S) as http:
        wrapped = idempotent(
            _charge_tool(http, marks=True),
            InMemoryIdempotencyStore(),
            effect="unsafe",
            boundary=True,
            not_sent=NOT_SENT,
            reconcile=lambda call: asked.append(call),
        )
        config = {"configurable": {"thread_id": f"t-{uuid.uuid4().hex}"}}
        for _ in range(2):
            with pytest.raises(httpx.ConnectError):
                wrapped.invoke({"order": "ord-7", "amount": 14000}, config)
    assert asked == []


def _handled_charge_tool(http: httpx.Client) -> BaseTool:
    """The charge tool as LangChain's docs write an error for the model: the read timeout
    becomes a ``ToolException`` that ``handle_tool_error=True`` turns into an error
    ``ToolMessage`` (the exception never reaches the wrapper)."""

    @tool
    def charge(order: str, amount: int) -> str:
        """Charge the customer `amount` cents for `order`. Moves money."""
        ctx = get_idempotency_context()
        headers = {"Idempotency-Key": ctx.key} if ctx is not None else {}
        with side_effect() if ctx is not None else contextlib.nullcontext():
            try:
                response = http.post(
                    "/charges", json={"order": order, "amount": amount}, headers=headers
                )
            except httpx.ReadTimeout as exc:
                raise ToolException(f"the billing API timed out: {exc}") from exc
        return str(response.json()["id"])

    charge.handle_tool_error = True
    return charge


@pytest.mark.parametrize("protected", [False, True], ids=["plain", "ours"])
def test_a_handled_error_after_the_block_is_still_an_unknown_outcome(protected: bool) -> None:
    """A tool error turned into a message after the POST left: the retry asks the hook
    instead of paying again (plain: two charges)."""
    asked: list[ReconcileCall] = []
    with (
        BillingServer("timeout", honours_key=False) as server,
        httpx.Client(base_url=server.url, timeout=httpx.Timeout(2.0, read=READ_TIMEOUT_S)) as http,
    ):
        charge = _handled_charge_tool(http)

        def charged(call: ReconcileCall) -> str | None:
            asked.append(call)
            found = http.get("/charges", params={"order": call.args["order"]})
            return None if found.status_code == 404 else str(found.json()["id"])

        if protected:
            charge = idempotent(
                charge, InMemoryIdempotencyStore(), effect="unsafe", boundary=True,
                not_sent=NOT_SENT, reconcile=charged,
            )  # fmt: skip
        config = {"configurable": {"thread_id": f"t-{uuid.uuid4().hex}"}}
        answers = []
        for _ in range(2):  # the model sees the error and asks again
            call = {"type": "tool_call", "name": "charge", "id": f"c-{uuid.uuid4().hex}"}
            message = charge.invoke({**call, "args": {"order": "ord-7", "amount": 1}}, config)
            answers.append((message.status, str(message.content)))
        posts, charges = server.posts, len(server.charges)
    assert answers[0][0] == "error"
    if not protected:
        assert (posts, charges) == (2, 2)
        return
    assert (posts, charges) == (1, 1)
    [question] = asked
    assert (question.reason, question.entered) == ("error", True)
    # The wrapper sees the ToolException itself (the inner tool's handling turns it into
    # the message after); through IdempotencyMiddleware only the message is seen
    # (tests/test_side_effect.py: a handled error after the block).
    assert question.error_type == "langchain_core.tools.base.ToolException"
    assert answers[1] == ("success", "ch_1")


def table(rows: list[Figures]) -> str:
    """The figures as a Markdown table: one row per class, a column per fault and server."""
    cols = [(f, h) for f in FAULTS for h in (True, False)]
    head = "| class | " + " | ".join(f"{f}, {'honours' if h else 'ignores'} key" for f, h in cols)
    lines = [head + " |", "|---" + "|---:" * len(cols) + "|"]
    for case in CASES:
        cells = []
        for f, h in cols:
            r = next(x for x in rows if (x.case, x.fault, x.honours_key) == (case, f, h))
            asked = f", asked {r.asked}" if r.asked else ""
            cells.append(f"POSTs {r.posts}, **paid {r.charges}**{asked} → {r.outcome}")
        lines.append(f"| {case} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    rows = [
        run_case(case, fault, honours_key=h)
        for case in CASES
        for fault in FAULTS
        for h in (True, False)
    ]
    sys.stdout.write(table(rows) + "\n")


if __name__ == "__main__":
    main()
