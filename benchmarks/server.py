"""A throwaway ``redis-server`` for one benchmark run, and CPU placement of server and client.

The server is the repository's one launcher (``tests/support/redis_servers.py``: a free
loopback port, persistence off, its own temporary directory, dies with this process),
started under ``taskset`` when a vCPU is given and ``taskset`` exists. :func:`place` moves
the server's threads and every thread of this process onto chosen vCPUs, so that one run
can measure both placements: client and server sharing a vCPU, and on different vCPUs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import redis

from tests.support.redis_servers import RedisServer as ThrowawayRedisServer
from tests.support.redis_servers import redis_server_available

__all__ = ["Placement", "RedisServer", "place", "placements", "unpin"]


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


class RedisServer(ThrowawayRedisServer):
    """The shared launcher, pinned to ``cpu`` from its start (``taskset -c``) if given.

    Adds what the report needs (``version``, ``pid``), and :meth:`client` without socket
    timeouts, so that a timed command is a plain blocking read.
    """

    def __init__(self, *, cpu: int | None = None) -> None:
        if not redis_server_available():
            raise RuntimeError("redis-server is not on PATH; the benchmarks need one")
        self.cpu = cpu
        self.taskset = cpu is not None and shutil.which("taskset") is not None
        super().__init__(loglevel="warning")
        with contextlib.closing(self.client()) as c:
            info = c.info("server")
        assert self.proc is not None
        self.version = str(info.get("redis_version", "unknown"))
        self.pid = int(info.get("process_id", self.proc.pid))

    def _argv(self) -> list[str]:
        argv = super()._argv()
        return ["taskset", "-c", str(self.cpu), *argv] if self.taskset else argv

    def client(self, **kwargs: Any) -> redis.Redis:
        kwargs.setdefault("socket_timeout", None)
        kwargs.setdefault("socket_connect_timeout", None)
        return super().client(**kwargs)


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
