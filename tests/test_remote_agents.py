"""Remote agents as effects: a caller agent on one real ``langgraph dev`` server runs the
refund agent on a second one, through a proxy that drops the connection after the remote
run was created. With :mod:`langchain_idempotent.integrations.remote` the caller's retry joins
that run (1 remote run, 1 refund); without it the retry starts another (2 runs, 2 refunds).

Two servers per module (startup is slow): ``billing`` (server B, the plain refund agent,
whose tools are not protected, so every remote run that reaches the provider pays) and
``caller`` (server A, ``graphs.remote_agents``), which reaches B through a
:class:`~tests.support.faults.FaultProxy`. Each test uses its own invoice.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from graphs.provider import Invoice, PaymentProvider
from langchain_idempotent import PayloadMismatchError
from langchain_idempotent.integrations.remote import (
    FINGERPRINT_METADATA,
    KEY_METADATA,
    RemoteRunError,
    fingerprint,
    idempotent_remote,
    plan_from_runs,
    remote_thread_id,
)
from tests.support.agent_server import REPO, AgentServer, langgraph_cli
from tests.support.faults import FaultProxy

pytestmark = pytest.mark.skipif(langgraph_cli() is None, reason="langgraph-cli not installed")
langgraph_sdk = pytest.importorskip("langgraph_sdk")

CALLERS = {"protected": "remote_caller", "plain": "remote_caller_plain"}
BILLING = "refund_agent_plain"
INVOICES = [Invoice(f"INV-81{i:02d}", f"C-81{i:02d}", 14000) for i in range(10)]
#: The request that creates a remote run (``POST /threads/<id>/runs``; not ``/runs/wait``).
CREATE_RUN = (b"POST /threads/", b"/runs HTTP/1.1")


def _ticket(i: int) -> str:
    inv = INVOICES[i]
    return (
        f"Ticket T-81{i:02d} from customer {inv.customer_id}: please refund $140 of invoice "
        f"{inv.invoice_id}."
    )


def _input(i: int) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": _ticket(i)}]}


@dataclass
class Servers:
    provider: PaymentProvider
    billing: AgentServer
    caller: AgentServer
    proxy: FaultProxy

    def refunds(self, i: int) -> int:
        return sum(
            1 for r in self.provider.ledger.refunds() if r["invoice_id"] == INVOICES[i].invoice_id
        )

    async def settled_billing_runs(self, i: int, timeout: float = 60.0) -> list[dict[str, Any]]:
        """Once no run on server B is pending or running: the runs on the threads that
        hold ticket ``i``."""
        client = langgraph_sdk.get_client(url=self.billing.url)
        deadline = time.monotonic() + timeout
        while True:
            threads = await client.threads.search(limit=1000)
            runs = {
                t["thread_id"]: await client.runs.list(t["thread_id"], limit=100) for t in threads
            }
            active = [
                r for rs in runs.values() for r in rs if r["status"] in ("pending", "running")
            ]
            if not active:
                return [
                    r
                    for t in threads
                    if INVOICES[i].invoice_id in json.dumps(t.get("values"))
                    for r in runs[t["thread_id"]]
                ]
            if time.monotonic() > deadline:
                raise AssertionError(f"runs on B did not finish: {active}")
            await asyncio.sleep(0.2)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    base = tmp_path_factory.mktemp("remote-agents")
    config = base / "langgraph.json"
    graphs = json.loads((REPO / "langgraph.json").read_text())["graphs"]
    graphs |= {
        "remote_caller": "graphs.remote_agents:caller",
        "remote_caller_plain": "graphs.remote_agents:caller_plain",
    }
    config.write_text(json.dumps({"dependencies": ["."], "graphs": graphs}))
    (base / "b").mkdir()
    (base / "a").mkdir()
    with PaymentProvider(base / "ledger.db", invoices=INVOICES) as provider:
        billing = AgentServer(
            base / "b",
            env={
                "REFUND_PROVIDER_URL": provider.url,
                "IDEMPOTENCY_STORE_URL": f"sqlite:///{base / 'b' / 'idempotency.db'}",
            },
            config=config,
        )
        proxy = FaultProxy(billing.port)
        caller = AgentServer(
            base / "a",
            env={
                "REFUND_PROVIDER_URL": provider.url,
                "BILLING_AGENT_URL": f"http://127.0.0.1:{proxy.port}",
                "BILLING_ASSISTANT": BILLING,
                "IDEMPOTENCY_STORE_URL": f"sqlite:///{base / 'a' / 'idempotency.db'}",
            },
            config=config,
        )
        with concurrent.futures.ThreadPoolExecutor(2) as pool:  # start both at once
            for started in [pool.submit(billing.start), pool.submit(caller.start)]:
                started.result()
        try:
            yield Servers(provider, billing, caller, proxy)
        finally:
            caller.stop()
            billing.stop()
            proxy.close()


@pytest.mark.parametrize("mode", ["protected", "plain"])
async def test_a_dropped_connection_and_a_retry_run_the_remote_agent_once_with_the_helper(
    servers: Servers, mode: str
) -> None:
    """The caller's billing node creates the remote run; the reply is lost (the proxy
    resets the connection); its RetryPolicy runs it again. Protected: the retry finds the
    key's run on the key's thread and joins it: 1 remote run, 1 refund. Plain: 2, 2."""
    i = {"protected": 0, "plain": 1}[mode]
    rule = servers.proxy.add_rule(CREATE_RUN, "drop_reply", times=1)
    client = langgraph_sdk.get_client(url=servers.caller.url)
    thread = await client.threads.create()
    answer = await client.runs.wait(
        thread["thread_id"], CALLERS[mode], input=_input(i), raise_error=False
    )
    servers.proxy.clear_rules()
    runs = await servers.settled_billing_runs(i)
    refunds = servers.refunds(i)
    print(
        f"FIGURES | remote agent, dropped connection + retry | {mode} | remote runs "
        f"{len(runs)} | refunds {refunds}"
    )
    assert rule.hits == 1  # the fault fired
    [caller_run] = await client.runs.list(thread["thread_id"])
    assert caller_run["status"] == "success", (answer, servers.caller.log_text()[-3000:])
    assert all(r["status"] == "success" for r in runs)
    assert "BlockingError" not in servers.caller.log_text()  # async end to end
    if mode == "plain":
        assert (len(runs), refunds) == (2, 2)  # the duplicate the helper prevents
        return
    assert (len(runs), refunds) == (1, 1)
    [run] = runs
    assert run["metadata"][KEY_METADATA]  # the key rides in the run's metadata
    assert run["thread_id"] == remote_thread_id(run["metadata"][KEY_METADATA], BILLING)
    assert INVOICES[i].invoice_id in answer["messages"][-1]["content"]


@pytest.mark.parametrize("mode", ["protected", "plain"])
async def test_concurrent_calls_with_one_key_share_one_remote_run(
    servers: Servers, mode: str
) -> None:
    """Two callers at once (a duplicate delivery), the remote run busy for 2 s: the second
    joins the first's run (found running, or refused with 409 and joined). A third call,
    later, is answered from the finished run. Plain ``runs.wait`` calls: 2 runs, 2 refunds."""
    i = {"protected": 2, "plain": 3}[mode]
    remote = langgraph_sdk.get_client(url=servers.billing.url)
    config = {"configurable": {"settle_seconds": 2}}
    if mode == "plain":
        await asyncio.gather(
            *(remote.runs.wait(None, BILLING, input=_input(i), config=config) for _ in range(2))
        )
        assert servers.refunds(i) == 2
        return
    from langchain_idempotent.integrations.remote import aidempotent_remote

    first, second = await asyncio.gather(
        *(
            aidempotent_remote(remote, BILLING, _input(i), key="T-8102", config=config)
            for _ in range(2)
        )
    )
    later = await aidempotent_remote(remote, BILLING, _input(i), key="T-8102")
    assert sorted([first.outcome, second.outcome]) == ["created", "joined"]
    assert first.run_id == second.run_id == later.run_id and later.outcome == "finished"
    assert first.values == second.values == later.values
    assert len(await servers.settled_billing_runs(i)) == 1
    assert servers.refunds(i) == 1


def test_the_sync_helper_answers_a_finished_run_and_refuses_the_key_for_another_input(
    servers: Servers,
) -> None:
    """``idempotent_remote`` with a sync client: the second call with the key is answered
    from the first's run (no new run, no refund); the key with another input is refused."""
    i = 4
    remote = langgraph_sdk.get_sync_client(url=servers.billing.url)
    first = idempotent_remote(remote, BILLING, _input(i), key="T-8104")
    again = idempotent_remote(remote, BILLING, _input(i), key="T-8104")
    assert (first.outcome, again.outcome) == ("created", "finished")
    assert again.run_id == first.run_id and again.values == first.values
    with pytest.raises(PayloadMismatchError, match="another input"):
        idempotent_remote(remote, BILLING, _input(5), key="T-8104")
    assert servers.refunds(i) == 1 and servers.refunds(5) == 0
    # without the helper, the same two calls are two runs and two refunds
    for _ in range(2):
        remote.runs.wait(None, BILLING, input=_input(6))
    assert servers.refunds(6) == 2


def _run(status: str, key: str, fp: str = "fp", run_id: str = "r1") -> dict[str, Any]:
    return {
        "run_id": run_id,
        "status": status,
        "metadata": {KEY_METADATA: key, FINGERPRINT_METADATA: fp},
    }


def test_the_plan_joins_answers_creates_or_refuses_by_the_keys_newest_run() -> None:
    """The decision both drivers share, on the runs a server lists (newest first)."""
    other = _run("success", "another key", run_id="r0")
    assert plan_from_runs([], "k", "fp", "t").action == "create"
    assert plan_from_runs([other], "k", "fp", "t").action == "create"  # type: ignore[list-item]
    assert plan_from_runs([_run("running", "k")], "k", "fp", "t").action == "join"  # type: ignore[list-item]
    assert plan_from_runs([_run("pending", "k")], "k", "fp", "t").action == "join"  # type: ignore[list-item]
    answered = plan_from_runs([_run("success", "k")], "k", "fp", "t")  # type: ignore[list-item]
    assert (answered.action, answered.run_id) == ("answer", "r1")
    with pytest.raises(RemoteRunError, match="status 'error'") as failed:
        plan_from_runs([_run("error", "k")], "k", "fp", "t")  # type: ignore[list-item]
    assert (failed.value.run_id, failed.value.thread_id, failed.value.key) == ("r1", "t", "k")
    with pytest.raises(PayloadMismatchError):
        plan_from_runs([_run("success", "k", fp="other")], "k", "fp", "t")  # type: ignore[list-item]


def test_remote_thread_ids_are_stable_per_key_and_assistant() -> None:
    assert remote_thread_id("k", "billing") == remote_thread_id("k", "billing")
    assert remote_thread_id("k", "billing") != remote_thread_id("k", "comms")
    assert remote_thread_id("k", "billing") != remote_thread_id("k2", "billing")
    assert fingerprint("a", {"x": 140}) == fingerprint("a", {"x": 140.0})
    with pytest.raises(ValueError, match="non-empty"):
        remote_thread_id("", "billing")


def test_the_helper_outside_an_idempotent_call_without_a_key_says_how_to_give_one() -> None:
    from langchain_idempotent import MissingScopeError

    remote = langgraph_sdk.get_sync_client(url="http://127.0.0.1:9")
    with pytest.raises(MissingScopeError, match="pass key="):
        idempotent_remote(remote, BILLING, _input(0))
