"""A real ``langgraph dev`` server (the LangGraph Agent Server, in-memory runtime) for tests.

``AgentServer(workdir, env=...)`` serves this repository's ``langgraph.json`` (or
``config=``) on a free loopback port, from ``workdir``: the in-memory runtime keeps its
``.langgraph_api`` files there, so a restart in the same directory finds the threads it
had flushed. The worktree is first on ``PYTHONPATH``. The blocking-call detector stays on
(no ``--allow-blocking``); four runs at a time (``langgraph dev`` defaults to one).
``kill()`` is a SIGKILL of the process group; ``start()`` again restarts it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

import httpx

__all__ = ["REPO", "AgentServer", "free_port", "langgraph_cli"]

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def langgraph_cli() -> str | None:
    """The ``langgraph`` command next to this interpreter, or on PATH (None: not installed)."""
    beside = Path(sys.executable).with_name("langgraph")
    return str(beside) if beside.exists() else shutil.which("langgraph")


class AgentServer:
    def __init__(
        self,
        workdir: Path,
        *,
        env: Mapping[str, str],
        port: int | None = None,
        config: Path = REPO / "langgraph.json",
    ) -> None:
        self.workdir = workdir
        self.config = config
        self.port = port or free_port()
        self.env = dict(env)
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.workdir / f"server-{self.port}.log"

    def start(self, timeout: float = 120.0) -> AgentServer:
        cli = langgraph_cli()
        if cli is None:
            raise RuntimeError(
                "langgraph-cli is not installed: pip install 'langchain-idempotent[server]'"
            )
        env = {
            **os.environ,
            "LANGSMITH_TRACING": "false",
            "LANGCHAIN_TRACING_V2": "false",
            "LANGGRAPH_CLI_NO_ANALYTICS": "1",
            **self.env,
        }
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
        self.starts += 1
        with self.log.open("ab") as log:
            log.write(f"\n--- start {self.starts} ---\n".encode())
            self.proc = subprocess.Popen(
                [
                    cli,
                    "dev",
                    "--port",
                    str(self.port),
                    "--no-browser",
                    "--no-reload",
                    "--n-jobs-per-worker",
                    "4",
                    "--config",
                    str(self.config),
                ],
                cwd=self.workdir,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"langgraph dev exited ({self.proc.returncode}); see {self.log}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/ok", timeout=1.0).status_code == 200:
                    return self
            time.sleep(0.2)
        self.kill()
        raise RuntimeError(f"langgraph dev did not answer within {timeout:g}s; see {self.log}")

    def kill(self) -> None:
        """SIGKILL the server (and anything it started): no shutdown, no final flush."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        self.proc = None

    def stop(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.kill()
        self.proc = None

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def __enter__(self) -> AgentServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
