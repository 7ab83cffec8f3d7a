"""A throwaway ``redis-server`` for one benchmark run, and CPU placement of server and client.

The server listens on a free loopback port with persistence off (``--save "" --appendonly
no``), is started under ``taskset`` when it exists, and is stopped (``SIGTERM``, then
killed if need be) when the run ends. :func:`place` moves the server's threads and
every thread of this process onto chosen vCPUs, so that one run can measure both
placements: client and server sharing a vCPU, and on different vCPUs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass

import redis

__all__ = ["Placement", "RedisServer", "place", "placements", "unpin"]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _tasks(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return [pid]


def _set_affinity(pid: int, cpus: Iterable[int]) -> None:
    """Pin every thread of ``pid`` (``sched_setaffinity`` alone moves one thread)."""
    mask = set(cpus)
    for tid in _tasks(pid):
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(tid, mask)


def can_pin() -> bool:
    return hasattr(os, "sched_setaffinity") and hasattr(os, "sched_getaffinity")


@dataclass(frozen=True)
class Placement:
    """Where the server and the client run. ``None`` means all allowed vCPUs."""

    name: str
    server_cpu: int | None
    client_cpu: int | None

    @property
    def label(self) -> str:
        if self.server_cpu is None:
            return "unpinned"
        if self.server_cpu == self.client_cpu:
            return f"same vCPU (server and client on {self.server_cpu})"
        return f"different vCPUs (server on {self.server_cpu}, client on {self.client_cpu})"


def placements() -> list[Placement]:
    """Both placements where the machine allows them, else one unpinned placement."""
    if not can_pin():
        return [Placement("unpinned", None, None)]
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) == 1:
        return [Placement("same", cpus[0], cpus[0])]
    return [Placement("same", cpus[0], cpus[0]), Placement("split", cpus[0], cpus[1])]


class RedisServer:
    """``redis-server`` on a free loopback port, started and owned by this process."""

    def __init__(self, *, cpu: int | None = None) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not on PATH; the benchmarks need one")
        self.port = _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        argv = [
            exe,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--loglevel",
            "warning",
        ]
        self.taskset = cpu is not None and shutil.which("taskset") is not None
        if self.taskset:
            argv = ["taskset", "-c", str(cpu), *argv]
        self.process = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL
        )
        self._wait_ready()
        info = self.client().info("server")
        self.version = str(info.get("redis_version", "unknown"))
        self.pid = int(info.get("process_id", self.process.pid))

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 10
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.process.returncode}")
            try:
                if self.client().ping():
                    return
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise
                time.sleep(0.02)

    def stop(self) -> None:
        if self.process.poll() is None:
            # SIGTERM: redis-server shuts down at once (nothing to save with --save "").
            # redis-py's SHUTDOWN would retry the lost connection with backoff first.
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)

    def __enter__(self) -> RedisServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def place(placement: Placement, server: RedisServer) -> None:
    """Move the server and every thread of this process to ``placement``."""
    if placement.server_cpu is None or not can_pin():
        return
    _set_affinity(server.pid, [placement.server_cpu])
    _set_affinity(os.getpid(), [placement.client_cpu if placement.client_cpu is not None else 0])


def unpin(server: RedisServer, cpus: Iterable[int]) -> None:
    """Let the server and this process run on ``cpus`` (for the throughput phase)."""
    if not can_pin():
        return
    allowed = list(cpus)
    _set_affinity(server.pid, allowed)
    _set_affinity(os.getpid(), allowed)
