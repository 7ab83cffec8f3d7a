"""A refund MCP server for the MCP tests: real process, real SQLite "bank", killable.

    python -m tests.support.mcp_refund_server --rows ROWS.db [--store IDEM.db]
        [--transport http --port N | --transport stdio] [--sdk]
        [--die-after effect|record --die-marker FILE] [--hold FILE]
        [--reconcile] [--on-busy wait|reject] [--lease S] [--require-key]
        [--store-url REDIS_URL] [--events FILE] [--elicit]

Without ``--store`` the server is plain (no McpIdempotency). ``refund`` inserts one row in
``ROWS.db`` (with the idempotency key the server's engine handed the tool, if any) and
returns ``{"refund_id", "order_id", "amount"}`` as structured content (a non-positive
amount is an error, nothing inserted: an ``isError`` result).

Faults: ``--die-after effect`` SIGKILLs the server right after the row commits (before a
record or a reply); ``--die-after record`` right after the result is recorded (plain, or
a call without a key: after the row), before the reply. ``--die-marker FILE``: die only if
FILE does not exist yet (it is created first), so a restarted server runs normally.
``--hold FILE``: after the row commits, wait until FILE exists before answering (two calls
at once).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sqlite3
from pathlib import Path
from typing import Any


def die_once(marker: str | None) -> None:
    if marker is None:
        return
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)


def rows_db(path: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, timeout=30, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(
        "CREATE TABLE IF NOT EXISTS refunds (id INTEGER PRIMARY KEY, order_id TEXT, "
        "amount REAL, idem_key TEXT)"
    )
    return db


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", required=True)
    parser.add_argument("--store")
    parser.add_argument("--transport", choices=["http", "stdio"], default="http")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--sdk", action="store_true", help="the mcp SDK's FastMCP")
    parser.add_argument("--die-after", choices=["effect", "record"])
    parser.add_argument("--die-marker")
    parser.add_argument("--hold")
    parser.add_argument("--reconcile", action="store_true")
    parser.add_argument("--on-busy", choices=["wait", "reject"], default="wait")
    parser.add_argument("--lease", type=float, default=30.0)
    parser.add_argument("--require-key", action="store_true")
    parser.add_argument("--store-url", help="a Redis URL for the idempotency store")
    parser.add_argument("--events", help="append the engine's event kinds to this file")
    parser.add_argument("--elicit", action="store_true", help="add confirmed_refund (fastmcp 4)")
    opts = parser.parse_args()

    from langchain_idempotent import get_idempotency_context

    rows = rows_db(opts.rows)

    async def refund(order_id: str, amount: float) -> dict[str, Any]:
        """Refund `amount` on order `order_id`."""
        if amount <= 0:
            raise ValueError(f"refund amount must be positive, got {amount}")
        ctx = get_idempotency_context()
        cur = rows.execute(
            "INSERT INTO refunds (order_id, amount, idem_key) VALUES (?, ?, ?)",
            (order_id, amount, ctx.key if ctx else None),
        )
        # "record" with no record to wait for (a plain server, or a call without a key):
        # right after the row.
        unrecorded = opts.store is None or ctx is None
        if opts.die_after == "effect" or (opts.die_after == "record" and unrecorded):
            die_once(opts.die_marker)
        if opts.hold:
            while not Path(opts.hold).exists():
                await asyncio.sleep(0.01)
        return {"refund_id": cur.lastrowid, "order_id": order_id, "amount": amount}

    sdk_run: dict[str, Any] = {}
    if opts.sdk:
        try:  # mcp 1
            from mcp.server.fastmcp import FastMCP as SdkFastMCP

            server: Any = SdkFastMCP(
                "refunds", host="127.0.0.1", port=opts.port, log_level="WARNING"
            )
        except ModuleNotFoundError:  # mcp 2 renamed it MCPServer; host and port go to run()
            from mcp.server.mcpserver import MCPServer

            server = MCPServer("refunds", log_level="WARNING")
            sdk_run = {"host": "127.0.0.1", "port": opts.port}
        server.tool()(refund)
    else:
        from fastmcp import FastMCP

        server = FastMCP("refunds")
        server.tool(refund)

    if opts.elicit:
        # A tool that asks for the amount first, SEP-2322's way (protocol 2026-07-28,
        # fastmcp 4): it returns an InputRequiredResult, and the client re-sends the
        # tools/call with the answer, which re-runs the tool from the start.
        from fastmcp import Context
        from mcp import types

        async def confirmed_refund(order_id: str, ctx: Any) -> Any:
            """Refund order `order_id`, asking how much."""
            answers = ctx.input_responses
            if not answers:
                question = types.ElicitRequestFormParams(
                    message=f"How much to refund on {order_id}?",
                    requested_schema={
                        "type": "object",
                        "properties": {"amount": {"type": "number"}},
                        "required": ["amount"],
                    },
                )
                return types.InputRequiredResult(
                    input_requests={"amount": types.ElicitRequest(params=question)}
                )
            answer: Any = answers["amount"]
            return await refund(order_id, float(answer.content["amount"]))

        # (annotations are strings here: FastMCP resolves them in this module's globals)
        confirmed_refund.__annotations__.update(ctx=Context, order_id=str, return_=Any)
        confirmed_refund.__annotations__["return"] = confirmed_refund.__annotations__.pop("return_")
        server.tool(confirmed_refund)

    if opts.store or opts.store_url:
        from langchain_idempotent.integrations.mcp import McpIdempotency

        if opts.store_url:
            from langchain_idempotent import RedisIdempotencyStore

            store: Any = RedisIdempotencyStore.from_url(opts.store_url)
        else:
            from langchain_idempotent import SqliteIdempotencyStore

            store = SqliteIdempotencyStore(opts.store)

        def on_event(event: Any) -> None:
            if opts.events:
                with open(opts.events, "a") as log:
                    log.write(event.kind + "\n")
            if opts.die_after == "record" and event.kind == "complete":
                die_once(opts.die_marker)

        def found(call: Any) -> dict[str, Any] | None:
            row = rows.execute(
                "SELECT id, order_id, amount FROM refunds WHERE idem_key = ?", (call.key,)
            ).fetchone()
            if row is None:
                return None
            return {"refund_id": row[0], "order_id": row[1], "amount": row[2]}

        idempotency = McpIdempotency(
            store,
            tools=["refund", *(["confirmed_refund"] if opts.elicit else [])],
            on_busy=opts.on_busy,
            require_key=opts.require_key,
            lease=opts.lease,
            ttl=max(opts.lease, 3600),
            reconcile=found if opts.reconcile else None,
            on_event=on_event,
        )
        if opts.sdk:
            idempotency.install(server)  # the SDK's FastMCP has no middleware
        else:
            server.add_middleware(idempotency)

    if opts.transport == "stdio":
        server.run("stdio") if opts.sdk else server.run(transport="stdio", show_banner=False)
    elif opts.sdk:
        server.run("streamable-http", **sdk_run)
    else:
        server.run(
            transport="http",
            host="127.0.0.1",
            port=opts.port,
            show_banner=False,
            log_level="warning",
        )


if __name__ == "__main__":
    main()
