"""One refund MCP server ("the bank") for a test, over either transport, and its clients.

``Bank`` starts :mod:`tests.support.mcp_refund_server` (plain, or with McpIdempotency
when ``ours``) over streamable HTTP (a process kept alive: restarted whenever it dies) or
stdio (the adapters spawn one process per session, so a killed server is "restarted" by
the next call). ``await bank.tool(...)`` is the refund tool as an agent would get it:
``MultiServerMCPClient`` with :class:`IdempotencyKeyInterceptor`, wrapped with
``idempotent()`` over its own client-side store (each call of ``tool()`` is another
client host, unless a store is given). ``bank.fastmcp_client()`` is a ``fastmcp.Client``
to the same server (what LangChain's ``langchain.mcp`` calls through); the adapters are
imported only by ``client()``, so the rest works where they are not installed (mcp 2).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from langchain_core.tools import BaseTool

from langchain_idempotent import InMemoryIdempotencyStore, idempotent

from .mcp_servers import (
    READ_TIMEOUT_S,
    SCRIPT,
    RefundMcpServer,
    Rows,
    http_connection,
    stdio_connection,
)

if TYPE_CHECKING:
    from fastmcp import Client
    from langchain_mcp_adapters.client import MultiServerMCPClient

T = TypeVar("T")

__all__ = ["LOST_REPLY_TIMEOUT_S", "Bank", "bank", "retried", "wait_for"]

#: The read timeout of the tests whose server dies before it replies: over streamable HTTP
#: that lost reply is noticed only when the timeout fires, so each such test waits it out
#: once. A healthy call here is a SQLite row (or a 1 s lease waited out), well under it.
LOST_REPLY_TIMEOUT_S = 3.0


class Bank:
    def __init__(
        self,
        directory: Path,
        transport: str,
        args: list[str],
        *,
        read_timeout: float = READ_TIMEOUT_S,
    ) -> None:
        self.dir = directory
        self.rows = Rows(directory / "rows.db")
        self.events = directory / "events.log"
        self.hold = directory / "hold"
        self.server: RefundMcpServer | None = None
        self.args = args
        self.read_timeout = read_timeout
        if transport == "http":
            self.server = RefundMcpServer(directory, args)
            self.server.start()
            self.server.keep_alive()
            self.connection = http_connection(self.server, read_timeout)
        else:
            self.connection = stdio_connection(args)

    def client(self, **kwargs: Any) -> MultiServerMCPClient:
        from langchain_mcp_adapters.client import MultiServerMCPClient

        from langchain_idempotent.integrations.mcp import IdempotencyKeyInterceptor

        client = MultiServerMCPClient({"bank": self.connection})  # type: ignore[dict-item]
        client.tool_interceptors = [IdempotencyKeyInterceptor(client, **kwargs)]
        return client

    def fastmcp_client(self) -> Client[Any]:
        """A ``fastmcp.Client`` to this server: streamable HTTP to the kept-alive process,
        or stdio (the client spawns the server; a killed one is respawned on reconnect)."""
        import os
        import sys

        from fastmcp import Client
        from fastmcp.client.transports import StdioTransport

        if self.server is not None:
            return Client(self.server.url, timeout=self.read_timeout)
        argv = [SCRIPT, "--transport", "stdio", *self.args]
        transport = StdioTransport(sys.executable, argv, env=dict(os.environ), keep_alive=False)
        return Client(transport, timeout=120)

    async def raw_tool(self) -> BaseTool:
        return (await self.client().get_tools())[0]

    async def tool(self, store: Any = None, **policy: Any) -> BaseTool:
        return idempotent(
            await self.raw_tool(), store=store or InMemoryIdempotencyStore(), **policy
        )

    def event_kinds(self) -> list[str]:
        return self.events.read_text().split() if self.events.exists() else []

    def release(self) -> None:
        self.hold.touch()

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


@contextmanager
def bank(
    directory: Path,
    transport: str,
    *,
    ours: bool,
    args: tuple[str, ...] = (),
    read_timeout: float = READ_TIMEOUT_S,
) -> Iterator[Bank]:
    """A bank for one test; ``read_timeout`` is the clients' over HTTP (stdio has its own)."""
    argv = ["--rows", str(directory / "rows.db"), "--events", str(directory / "events.log")]
    if ours:
        argv += ["--store", str(directory / "idem.db")]
    the_bank = Bank(directory, transport, [*argv, *args], read_timeout=read_timeout)
    try:
        yield the_bank
    finally:
        the_bank.close()


async def retried(call: Callable[[], Awaitable[T]], *, attempts: int = 60) -> T:
    """``call()`` until it answers, as a retrying caller would (bounded); re-raises the
    last error. Idempotency errors are final answers, not retried."""
    from langchain_idempotent import IdempotencyError

    for attempt in range(attempts):
        try:
            return await call()
        except IdempotencyError:
            raise
        except Exception:
            if attempt == attempts - 1:
                raise
            await asyncio.sleep(0.25)
    raise AssertionError("unreachable")


async def wait_for(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """Wait (bounded) until ``condition()``: a synchronisation point, not an assertion."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)
