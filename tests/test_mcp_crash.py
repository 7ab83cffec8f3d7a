"""MCP tools across a real wire: the key reaches the server, and the server dedupes by it.

Each test runs a real refund MCP server (:mod:`tests.support.mcp_refund_server`, a
process whose "bank" is a SQLite file) and real ``langchain-mcp-adapters`` clients, over
streamable HTTP and stdio, once with a plain server and once with ``McpIdempotency``
(the client is the same: ``idempotent()`` + ``IdempotencyKeyInterceptor``). Servers die
by SIGKILL at the named point. The plain runs show the duplicate these tests prevent.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langchain_mcp_adapters")
pytest.importorskip("fastmcp")

from langchain_idempotent import (
    InMemoryIdempotencyStore,
    InProgressError,
    PayloadMismatchError,
    idempotency_scope,
)
from tests.support.mcp_bank import LOST_REPLY_TIMEOUT_S, bank, retried, wait_for

#: stdio spawns a server process per session (seconds each on a busy machine): slow.
TRANSPORTS = ["http", pytest.param("stdio", marks=pytest.mark.slow)]
REFUND = {"order_id": "A-1", "amount": 140}


def text(answer: Any) -> str:
    """The text the model sees (the adapters give each content block a fresh id)."""
    return "".join(block["text"] for block in answer)


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize(("ours", "rows"), [(False, 2), (True, 1)], ids=["plain", "ours"])
async def test_a_reply_lost_after_the_commit_is_paid_once_when_the_server_dedupes_the_key(
    tmp_path: Path, transport: str, ours: bool, rows: int
) -> None:
    # The server records the result (plain: commits the row), then is SIGKILLed before
    # it replies; the client's retry reaches the restarted server with the same key.
    args = ("--die-after", "record", "--die-marker", str(tmp_path / "died"))
    with bank(
        tmp_path, transport, ours=ours, args=args, read_timeout=LOST_REPLY_TIMEOUT_S
    ) as the_bank:
        tool = await the_bank.tool()
        with idempotency_scope("ticket-1"):
            with pytest.raises(Exception) as lost:
                await tool.ainvoke(REFUND)
            answer = await retried(lambda: tool.ainvoke(REFUND))
        assert (tmp_path / "died").exists(), lost.value
        assert the_bank.rows.count() == rows
        assert '"order_id":"A-1"' in text(answer)


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("mode", ["plain", "wait", "reject"])
async def test_two_clients_sending_one_key_at_once_get_one_refund(
    tmp_path: Path, transport: str, mode: str
) -> None:
    # Two client hosts (each its own client-side store) send the same call at once: the
    # first holds the server until released; the second arrives while it runs.
    args: tuple[str, ...] = ("--hold", str(tmp_path / "hold"))
    if mode == "reject":
        args += ("--on-busy", "reject")
    with bank(tmp_path, transport, ours=mode != "plain", args=args) as the_bank:
        first, second = await the_bank.tool(), await the_bank.tool()
        with idempotency_scope("ticket-2"):
            a = asyncio.create_task(first.ainvoke(REFUND))
            await wait_for(lambda: the_bank.rows.count() == 1, "the first refund's row")
            b = asyncio.create_task(second.ainvoke(REFUND))
            if mode == "plain":
                await wait_for(lambda: the_bank.rows.count() == 2, "the second refund's row")
            elif mode == "wait":
                await wait_for(lambda: "wait" in the_bank.event_kinds(), "the server-side wait")
            else:
                with pytest.raises(InProgressError, match="still running"):
                    await b
            the_bank.release()
            answer_a = await a
            answer_b = await b if mode != "reject" else None
        if mode == "plain":
            assert the_bank.rows.count() == 2
            assert text(answer_a) != text(answer_b)  # two refund ids
        else:
            assert the_bank.rows.count() == 1
            if mode == "wait":
                assert text(answer_a) == text(answer_b)


def one_key(info: Any) -> str:
    return "refund-order-A-1"  # a key the application chose, whatever the arguments


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("ours", [False, True], ids=["plain", "ours"])
async def test_one_key_with_other_arguments_is_a_conflict_and_pays_nothing(
    tmp_path: Path, transport: str, ours: bool
) -> None:
    with bank(tmp_path, transport, ours=ours) as the_bank:
        first = await the_bank.tool(scope=one_key)
        second_store = InMemoryIdempotencyStore()
        second = await the_bank.tool(store=second_store, scope=one_key)
        with idempotency_scope("ticket-3"):
            await first.ainvoke(REFUND)
            other = {"order_id": "A-1", "amount": 150}
            if not ours:
                await second.ainvoke(other)
                assert the_bank.rows.count() == 2
                return
            with pytest.raises(PayloadMismatchError, match="MCP server answered"):
                await second.ainvoke(other)
            # Stored on the client: asked again, it answers without asking the server.
            with pytest.raises(PayloadMismatchError):
                await second.ainvoke(other)
        assert the_bank.rows.count() == 1
        assert the_bank.event_kinds().count("payload_mismatch") == 1


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize(
    ("ours", "reconcile", "rows"),
    [(False, False, 2), (True, False, 2), (True, True, 1)],
    ids=["plain", "ours-no-reconcile", "ours-reconcile"],
)
async def test_a_server_killed_after_its_effect_is_reconciled_instead_of_paid_twice(
    tmp_path: Path, transport: str, ours: bool, reconcile: bool, rows: int
) -> None:
    # SIGKILL right after the row commits, before the result is recorded: the record is
    # left running under a dead owner. The retry waits out its lease (1 s), takes over,
    # and asks reconcile= (the bank's rows by key) before refunding again.
    args: tuple[str, ...] = ("--die-after", "effect", "--die-marker", str(tmp_path / "died"))
    args += ("--lease", "1") + (("--reconcile",) if reconcile else ())
    with bank(
        tmp_path, transport, ours=ours, args=args, read_timeout=LOST_REPLY_TIMEOUT_S
    ) as the_bank:
        tool = await the_bank.tool()
        with idempotency_scope("ticket-4"):
            with pytest.raises(Exception):  # noqa: B017
                await tool.ainvoke(REFUND)
            await retried(lambda: tool.ainvoke(REFUND))
        assert (tmp_path / "died").exists()
        assert the_bank.rows.count() == rows
        if ours:
            assert "takeover" in the_bank.event_kinds()
