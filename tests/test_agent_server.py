"""The refund agent inside a real LangGraph Agent Server (``langgraph dev``), driven by
``langgraph_sdk``: each scenario runs the protected assistant and the plain one.

CI subset: this file (the blocking-call detector, double-texting with ``interrupt`` and
``rollback``), ``tests/test_tool_retry_middleware.py`` (``create_agent`` +
``ToolRetryMiddleware``, in-process) and ``tests/faults/test_dbos_recovery.py`` (DBOS
recovery after a SIGKILL). The long scenarios (server SIGKILL and restart, which waits for
the dev server's 10 s flush; re-dispatch to a second server, a 10 s tool) are in
``tests/faults/test_agent_server_long.py`` and run in the campaign (``python -m tests.faults``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from graphs.provider import PaymentProvider
from tests.support.agent_server import REPO, AgentServer, langgraph_cli
from tests.support.refund_server import (
    ASSISTANTS,
    FOLLOW_UP,
    INVOICE,
    TICKET,
    Figures,
    last_answer,
    wait_for_refunds,
)

pytestmark = [
    pytest.mark.skipif(langgraph_cli() is None, reason="langgraph-cli not installed"),
    pytest.mark.server,
]
langgraph_sdk = pytest.importorskip("langgraph_sdk")


@pytest.fixture
def provider(tmp_path: Path) -> Iterator[PaymentProvider]:
    with PaymentProvider(tmp_path / "ledger.db", invoices=[INVOICE]) as p:
        yield p


def _server(tmp_path: Path, provider: PaymentProvider, **env: str) -> AgentServer:
    return AgentServer(
        tmp_path,
        env={
            "REFUND_PROVIDER_URL": provider.url,
            "IDEMPOTENCY_STORE_URL": f"sqlite:///{tmp_path / 'idempotency.db'}",
            **env,
        },
    )


async def test_the_async_paths_make_no_blocking_call_under_the_dev_servers_detector(
    tmp_path: Path, provider: PaymentProvider
) -> None:
    """claim, renew (lease 0.6 s, tool 2 s), wait and complete, all on the server's event
    loop with blockbuster on; a probe graph that does block fails, so the detector is on."""
    config = tmp_path / "langgraph.json"
    graphs = json.loads((REPO / "langgraph.json").read_text())["graphs"]
    graphs["blocking_probe"] = "tests.support.blocking_probe:graph"
    config.write_text(json.dumps({"dependencies": ["."], "graphs": graphs}))
    server = AgentServer(
        tmp_path,
        env={
            "REFUND_PROVIDER_URL": provider.url,
            "IDEMPOTENCY_STORE_URL": f"sqlite:///{tmp_path / 'idempotency.db'}",
            "IDEMPOTENCY_LEASE": "0.6",
        },
        config=config,
    )
    with server:
        client = langgraph_sdk.get_client(url=server.url)
        probe = await client.threads.create()
        answer = await client.runs.wait(
            probe["thread_id"], "blocking_probe", input={"messages": []}, raise_error=False
        )
        assert answer["__error__"]["error"] == "BlockingError", answer
        [probe_run] = await client.runs.list(probe["thread_id"])
        assert probe_run["status"] == "error"
        assert "BlockingError" in server.log_text()
        probed = len(server.log_text())

        # Two threads that share one idempotency scope: the second run's issue_refund
        # waits for the first's, which renews its 0.6 s lease while it settles for 2 s.
        shared = {"configurable": {"idempotency_scope": "T-9001", "settle_seconds": 2}}
        first = await client.threads.create()
        second = await client.threads.create()
        owner = await client.runs.create(
            first["thread_id"], ASSISTANTS["protected"], input=TICKET, config=shared
        )
        await wait_for_refunds(provider, 1)
        kinds: list[str] = []
        async for part in client.runs.stream(
            second["thread_id"],
            ASSISTANTS["protected"],
            input=TICKET,
            config=shared,
            stream_mode="events",
        ):
            if part.event == "events" and part.data.get("event") == "on_custom_event":
                kinds.append(part.data["name"])
        await client.runs.join(first["thread_id"], owner["run_id"])
        runs = [r for t in (first, second) for r in await client.runs.list(t["thread_id"])]
        log = server.log_text()[probed:]
    assert [r["status"] for r in runs] == ["success", "success"], log[-3000:]
    assert "idempotency.wait" in kinds and "idempotency.replay" in kinds, kinds
    assert "idempotency.takeover" not in kinds  # the owner kept its lease: it renewed
    assert len(provider.ledger.refunds()) == 1
    assert provider.stats().get("replayed", 0) == 0  # one POST
    assert "BlockingError" not in log  # none from the library's async paths


@pytest.mark.parametrize("strategy", ["interrupt", "rollback"])
@pytest.mark.parametrize("mode", ["protected", "plain"])
async def test_a_run_double_texted_mid_tool_refunds_once_when_protected(
    tmp_path: Path, provider: PaymentProvider, strategy: str, mode: str
) -> None:
    """Run 1 is cancelled by run 2 (same thread) after the provider committed its refund,
    while the tool still runs. Protected: run 2 reconciles the cancelled call (the refund
    is found by its key), does not send it again, and its answer names that refund.
    Plain: run 2 refunds again."""
    started = time.monotonic()
    with _server(tmp_path, provider) as server:
        client = langgraph_sdk.get_client(url=server.url)
        thread = (await client.threads.create())["thread_id"]
        assistant = ASSISTANTS[mode]
        await client.runs.create(
            thread, assistant, input=TICKET, config={"configurable": {"settle_seconds": 30}}
        )
        await wait_for_refunds(provider, 1)
        second_input = FOLLOW_UP if strategy == "interrupt" else TICKET
        run2 = await client.runs.create(
            thread, assistant, input=second_input, multitask_strategy=strategy
        )
        state = await client.runs.join(thread, run2["run_id"])
        runs = await client.runs.list(thread)
    figures = Figures.of(f"double-text {strategy}", mode, provider, 2, started)
    print(figures.line())
    refunds = provider.ledger.refunds()
    assert runs[0]["run_id"] == run2["run_id"] and runs[0]["status"] == "success"
    if mode == "plain":
        assert figures.effects == 2  # the duplicate the library prevents
        return
    assert figures.effects == 1
    assert figures.posts == 1  # reconciled: the tool did not run again
    assert refunds[0]["refund_id"] in last_answer(state)
