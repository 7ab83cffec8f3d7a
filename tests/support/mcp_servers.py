"""The refund MCP server (:mod:`tests.support.mcp_refund_server`) as a test process.

:class:`RefundMcpServer` runs it over streamable HTTP on a free loopback port (with the
life cycle of :class:`~tests.support.processes.ServerProcess`: kill, restart on the same
port) and can keep it alive (restart it whenever it dies, as a supervisor would);
:func:`stdio_connection` gives the adapters' stdio connection that spawns it per session.
``Rows`` counts what the "bank" paid.
"""

from __future__ import annotations

import contextlib
import socket
import sqlite3
import sys
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

from . import forked
from .processes import ServerProcess

__all__ = ["SCRIPT", "RefundMcpServer", "Rows", "http_connection", "stdio_connection"]

SCRIPT = str(Path(__file__).with_name("mcp_refund_server.py"))
#: The timeout advice of docs/mcp.md: a call to a server that died mid-call fails after
#: this instead of hanging (over streamable HTTP the client does not notice the death).
READ_TIMEOUT_S = 8.0
#: Over stdio a dead server is noticed at once (end of its stdout); the timeout only has
#: to outlast a slow start (it bounds ``initialize`` too).
STDIO_SESSION_KWARGS: dict[str, Any] = {"read_timeout_seconds": timedelta(seconds=120)}


class Rows:
    """The refunds the server's "bank" (a SQLite file) holds."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def count(self, order_id: str | None = None) -> int:
        if not self.path.exists():
            return 0
        with contextlib.closing(sqlite3.connect(self.path, timeout=30)) as db:
            try:
                if order_id is None:
                    return int(db.execute("SELECT count(*) FROM refunds").fetchone()[0])
                return int(
                    db.execute(
                        "SELECT count(*) FROM refunds WHERE order_id = ?", (order_id,)
                    ).fetchone()[0]
                )
            except sqlite3.OperationalError:  # no table yet
                return 0


class RefundMcpServer(ServerProcess):
    name = "refund MCP server"
    log_name = "mcp.log"

    def __init__(self, directory: Path, args: list[str], *, start_timeout: float = 60.0) -> None:
        super().__init__(directory, port=None, own_dir=False, start_timeout=start_timeout)
        self.args = args
        self._keeper: threading.Thread | None = None
        self._closing = threading.Event()
        self.restarts = 0

    def _argv(self) -> list[str]:
        return [sys.executable, SCRIPT, "--transport", "http", "--port", str(self.port), *self.args]

    def _spawn(self) -> forked.ForkedProcess:
        # Forked from a warm process: a server start costs no imports (MCP's alone are ~1 s
        # of CPU), and the tests start dozens.
        return forked.start(self._argv()[1:], cwd=self.dir, stdout=self.log_path)

    def _ready(self) -> bool:
        with socket.socket() as s:
            s.settimeout(0.2)
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def keep_alive(self) -> None:
        """Restart the server (same port) whenever it dies, until :meth:`close`."""

        def watch() -> None:
            while not self._closing.wait(0.01):
                proc = self.proc
                if proc is not None and proc.poll() is not None:
                    self.proc = None
                    fixed, self._fixed_port = self._fixed_port, True
                    try:
                        self.start()
                        self.restarts += 1
                    finally:
                        self._fixed_port = fixed

        self._keeper = threading.Thread(target=watch, daemon=True)
        self._keeper.start()

    def close(self) -> None:
        self._closing.set()
        if self._keeper is not None:
            self._keeper.join()
        super().close()


def http_connection(
    server: RefundMcpServer, read_timeout: float = READ_TIMEOUT_S
) -> dict[str, Any]:
    """The adapters' connection to ``server``; ``read_timeout`` (seconds) bounds each request
    (``initialize`` too), and is how long a call to a server that died mid-call waits."""
    kwargs = {"read_timeout_seconds": timedelta(seconds=read_timeout)}
    return {"transport": "streamable_http", "url": server.url, "session_kwargs": kwargs}


def stdio_connection(args: list[str]) -> dict[str, Any]:
    import os

    return {
        "transport": "stdio",
        "command": sys.executable,
        "args": [SCRIPT, "--transport", "stdio", *args],
        "env": dict(os.environ),
        "session_kwargs": STDIO_SESSION_KWARGS,
    }
