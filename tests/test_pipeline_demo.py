"""The multi-agent pipeline (``python -m graphs.batch --pipeline``): a ``create_agent``
supervisor whose tools invoke triage, billing and notifications ``create_agent`` agents
(sub-agents as tools), retrying an LLM 502 (``ModelRetryMiddleware``,
``ToolRetryMiddleware``). Unprotected, a retried specialist pays twice; with
``idempotent()`` every refund is paid once — in one process and in the batch's worker
processes under faults."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage

from graphs.batch import main
from graphs.fake_model import UpstreamGatewayError
from graphs.pipeline import build_pipeline_agent
from graphs.provider import Invoice, PaymentProvider
from langchain_idempotent import InMemoryIdempotencyStore

TICKET = "Ticket T-00042 from customer C-00042: please refund $140 of invoice INV-4242."


@pytest.fixture
def provider(tmp_path: Path) -> Iterator[PaymentProvider]:
    with PaymentProvider(
        tmp_path / "ledger.db", invoices=[Invoice("INV-4242", "C-00042", 14000)]
    ) as p:
        yield p


def _run_ticket(provider: PaymentProvider, *, protected: bool) -> dict[str, Any]:
    store = InMemoryIdempotencyStore() if protected else None
    agent = build_pipeline_agent(store, provider_url=provider.url, fail_after_tool={"billing"})
    out: dict[str, Any] = agent.invoke(
        {"messages": [HumanMessage(TICKET)]}, {"configurable": {"thread_id": "T-00042"}}
    )
    return out


@pytest.mark.parametrize("protected", [True, False], ids=["idempotent", "plain"])
def test_a_billing_agent_retried_by_the_supervisor_after_the_refund_pays_once_when_wrapped(
    provider: PaymentProvider, protected: bool
) -> None:
    """The billing agent's model fails (502) right after ``issue_refund`` succeeded; the
    supervisor's ToolRetryMiddleware invokes the agent again from its start, which calls
    ``issue_refund`` again with a new tool-call id. Wrapped: the retry is the same key (the
    billing agent's call, same arguments), the refund is replayed. Plain: a second
    refund."""
    out = _run_ticket(provider, protected=protected)
    refunds = provider.ledger.refunds()
    assert out["messages"][-1].content.startswith("Refunded $140 for INV-4242")
    assert len(provider.ledger.notifications()) == 1
    if not protected:
        assert len(refunds) == 2  # the duplicate the wrapper prevents
        return
    assert len(refunds) == 1
    assert refunds[0]["refund_id"] in out["messages"][-1].content


def test_without_retries_the_failure_reaches_the_caller(provider: PaymentProvider) -> None:
    """The 502 above is what the supervisor's retry absorbs (so the test above is about it)."""
    agent = build_pipeline_agent(
        None, provider_url=provider.url, fail_after_tool={"billing"}, retries=0
    )
    with pytest.raises(UpstreamGatewayError):
        agent.invoke({"messages": [HumanMessage(TICKET)]}, {"configurable": {"thread_id": "t"}})


def test_an_unknown_agent_to_fail_is_refused_by_name(provider: PaymentProvider) -> None:
    with pytest.raises(ValueError, match=r"unknown agent.*'billing2'"):
        build_pipeline_agent(None, provider_url=provider.url, fail_after_tool={"billing2"})


def test_the_specialists_are_create_agent_sub_agents_called_as_tools(
    provider: PaymentProvider,
) -> None:
    out = _run_ticket(provider, protected=True)
    called = [m.name for m in out["messages"] if m.type == "tool"]
    assert called == ["triage", "billing", "notifications"]  # the supervisor's tools
    # The specialists' own messages stay inside them: the supervisor sees their answers.
    assert not any(m.type == "tool" and m.name == "issue_refund" for m in out["messages"])


def test_a_negative_retry_count_is_refused(provider: PaymentProvider) -> None:
    with pytest.raises(ValueError, match="retries must be 0 or more"):
        build_pipeline_agent(None, provider_url=provider.url, retries=-1)


SMALL_PIPELINE = [
    "--pipeline", "--tickets", "24", "--workers", "2", "--seed", "5", "--lease", "1.0",
    "--wait-timeout", "5", "--backoff-base", "0.02", "--backoff-cap", "0.3",
    "--llm-502", "0.08", "--arg-drift", "0.3", "--provider-502", "0.05",
    "--drop-after-commit", "0.1", "--latency", "0.05", "--latency-s", "0.05",
    "--worker-kill", "0.1", "--duplicate-delivery", "0.1", "--no-progress",
    "--protection", "none,idempotent",
]  # fmt: skip


@pytest.fixture(scope="module")
def small_pipeline(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("runs")
    assert main([*SMALL_PIPELINE, "--out", str(out)]) == 0
    (report,) = out.glob("refund-pipeline-*.json")
    assert report.with_suffix(".png").stat().st_size > 0
    modes: dict[str, Any] = json.loads(report.read_text())["modes"]
    return modes


def test_the_pipeline_batch_pays_every_refund_once_with_idempotent_and_not_without(
    small_pipeline: dict[str, Any],
) -> None:
    plain, ours = small_pipeline["none"], small_pipeline["idempotent"]
    for mode in (plain, ours):
        assert mode["faults"]["worker_kill"] > 0 and mode["faults"]["llm_502"] > 0
        assert mode["faults"]["drop_after_commit"] > 0
    assert plain["ledger"]["duplicate_refunds"] > 0  # the duplicates the library prevents
    assert ours["tickets_given_up"] == 0
    assert ours["ledger"]["refunds_executed"] == ours["ledger"]["refunds_expected"] == 24
    assert ours["ledger"]["duplicate_refunds"] == 0
    assert ours["ledger"]["duplicate_notifications"] == 0
