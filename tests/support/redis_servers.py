"""Throwaway Redis servers for tests: one standalone server, a 3+3 Cluster, a Sentinel.

Every server listens on a free loopback port, keeps its files in its own temporary
directory, and dies with the test process (the life cycle is
:class:`tests.support.processes.ServerProcess`), so a crashed test run never leaves a
server behind. Nothing here touches any other Redis on the machine.

    server = RedisServer()            # started; RedisServer(start=False) to start later
    server.url                        # "redis://127.0.0.1:<port>/0"
    server.client()                   # a redis.Redis with short timeouts
    server.pause(); server.resume()   # SIGSTOP / SIGCONT: a hung server
    server.stop(); server.kill()      # SIGTERM / SIGKILL
    server.restart()                  # same port, same directory (AOF/RDB survive)
    server.close()                    # stop and remove the directory

    cluster = RedisCluster()          # 3 masters + 3 replicas, waits for cluster_state:ok
    cluster.url, cluster.client()

    sentinel = RedisSentinel(server)  # one sentinel monitoring ``server`` as "mymaster"
    sentinel.addresses, sentinel.service_name
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis

from .processes import ServerProcess, free_port, live_servers

__all__ = [
    "REDIS_SERVER",
    "RedisCluster",
    "RedisSentinel",
    "RedisServer",
    "free_port",
    "redis_server_available",
    "running_servers",
]

#: Path of the ``redis-server`` binary, or ``None`` when it is not on PATH.
REDIS_SERVER = shutil.which("redis-server")
REDIS_CLI = shutil.which("redis-cli")


def redis_server_available() -> bool:
    return REDIS_SERVER is not None


class RedisServer(ServerProcess):
    """One ``redis-server`` process on 127.0.0.1.

    ``options`` are redis.conf directives (``appendonly="yes"``, ``maxmemory_policy=
    "allkeys-lru"``; underscores become dashes) that override the defaults
    ``--bind 127.0.0.1 --save "" --appendonly no``.
    """

    name = "redis-server"
    log_name = "redis.log"

    def __init__(
        self,
        *,
        port: int | None = None,
        directory: str | Path | None = None,
        start: bool = True,
        start_timeout: float = 10.0,
        config_file: str | Path | None = None,
        sentinel: bool = False,
        **options: str,
    ) -> None:
        if REDIS_SERVER is None:
            raise RuntimeError("redis-server is not on PATH")
        super().__init__(
            Path(directory) if directory else Path(tempfile.mkdtemp(prefix="redis-test-")),
            port=port,
            own_dir=directory is None,
            start_timeout=start_timeout,
        )
        self.config_file = config_file
        self.sentinel = sentinel
        self.options: dict[str, str] = {"bind": "127.0.0.1"}
        if not sentinel:
            self.options.update({"save": "", "appendonly": "no"})
        self.options.update({k.replace("_", "-"): v for k, v in options.items()})
        if start:
            self.start()

    # -- addresses ---------------------------------------------------------------------

    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self, **kwargs: Any) -> redis.Redis:
        """A plain client for setting up and inspecting state (short timeouts)."""
        kwargs.setdefault("socket_timeout", 2.0)
        kwargs.setdefault("socket_connect_timeout", 1.0)
        return redis.Redis(host=self.host, port=self.port, **kwargs)

    # -- what ServerProcess needs --------------------------------------------------------

    def _argv(self) -> list[str]:
        assert REDIS_SERVER is not None
        argv = [REDIS_SERVER]
        if self.config_file is not None:
            argv.append(str(self.config_file))
        if self.sentinel:
            argv.append("--sentinel")
        argv += ["--port", str(self.port), "--dir", str(self.dir)]
        for name, value in self.options.items():
            argv += [f"--{name}", *value.split(" ")] if name != "save" else ["--save", value]
        return argv

    def _ready(self) -> bool:
        """It answers PING (not still loading its data)."""
        probe = redis.Redis(
            host=self.host, port=self.port, socket_timeout=0.5, socket_connect_timeout=0.5
        )
        try:
            return bool(probe.ping())
        except (redis.BusyLoadingError, redis.ConnectionError):
            return False
        finally:
            probe.close()


class RedisCluster:
    """A Redis Cluster of ``masters`` primaries with ``replicas`` replicas each.

    Built with ``redis-cli --cluster create``; ready once every node reports
    ``cluster_state:ok`` and the full slot map, and every replica's link to its master is
    up (replication starts at once: ``repl-diskless-sync-delay 0`` unless overridden).
    """

    def __init__(
        self,
        *,
        masters: int = 3,
        replicas: int = 1,
        node_timeout_ms: int = 2000,
        ready_timeout: float = 30.0,
        **options: str,
    ) -> None:
        if REDIS_CLI is None:
            raise RuntimeError("redis-cli is not on PATH")
        options.setdefault("repl_diskless_sync_delay", "0")
        self.dir = Path(tempfile.mkdtemp(prefix="redis-cluster-test-"))
        self.nodes: list[RedisServer] = []
        try:
            for i in range(masters * (1 + replicas)):
                node_dir = self.dir / f"node{i}"
                node_dir.mkdir()
                self.nodes.append(
                    RedisServer(
                        directory=node_dir,
                        cluster_enabled="yes",
                        cluster_config_file="nodes.conf",
                        cluster_node_timeout=str(node_timeout_ms),
                        cluster_port=str(free_port()),
                        **options,
                    )
                )
            addresses = [f"127.0.0.1:{n.port}" for n in self.nodes]
            create = ["--cluster", "create", *addresses, "--cluster-replicas", str(replicas)]
            subprocess.run(
                [REDIS_CLI, *create, "--cluster-yes"],
                check=True,
                capture_output=True,
                timeout=ready_timeout,
            )
            self._wait_ok(ready_timeout)
        except BaseException:
            self.close()
            raise

    def _wait_ok(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        pending = list(self.nodes)
        while pending:
            node = pending[0]
            with contextlib.closing(node.client()) as c:
                info = c.execute_command("CLUSTER", "INFO")
                text = info.decode() if isinstance(info, bytes) else str(info)
            if "cluster_state:ok" in text and "cluster_slots_assigned:16384" in text:
                with contextlib.closing(node.client()) as c:
                    replication = c.info("replication")
                if replication.get("role") != "slave" or (
                    replication.get("master_link_status") == "up"
                ):
                    pending.pop(0)
                    continue
            if time.monotonic() > deadline:
                raise RuntimeError(f"cluster not ready: {text}")
            time.sleep(0.05)

    @property
    def url(self) -> str:
        return self.nodes[0].url

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        return [(n.host, n.port) for n in self.nodes]

    def client(self, **kwargs: Any) -> redis.RedisCluster:
        kwargs.setdefault("socket_timeout", 2.0)
        kwargs.setdefault("socket_connect_timeout", 1.0)
        return redis.RedisCluster(host="127.0.0.1", port=self.nodes[0].port, **kwargs)

    def close(self) -> None:
        for node in self.nodes:
            node.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RedisSentinel:
    """One ``redis-server --sentinel`` monitoring ``master`` under ``service_name``."""

    def __init__(self, master: RedisServer, *, service_name: str = "mymaster") -> None:
        self.service_name = service_name
        self.dir = Path(tempfile.mkdtemp(prefix="redis-sentinel-test-"))
        conf = self.dir / "sentinel.conf"
        conf.write_text(
            f"sentinel monitor {service_name} 127.0.0.1 {master.port} 1\n"
            f"sentinel down-after-milliseconds {service_name} 1000\n"
        )
        self.server = RedisServer(directory=self.dir, config_file=conf, sentinel=True)

    @property
    def addresses(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", self.server.port)]

    def close(self) -> None:
        self.server.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisSentinel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def wait_replicating(primary: RedisServer, replica: RedisServer, timeout: float = 20.0) -> None:
    """Wait until ``replica``'s link to its master is up and it acknowledges a write to
    ``primary`` within 100 ms (one that has just synced acknowledges nothing for up to a
    second or so)."""
    deadline = time.monotonic() + timeout
    with contextlib.closing(replica.client()) as probe:
        while probe.info("replication").get("master_link_status") != "up":
            if time.monotonic() > deadline:
                raise RuntimeError(f"{replica} did not sync:\n{replica.log_tail()}")
            time.sleep(0.02)
    with contextlib.closing(primary.client()) as writer:
        while writer.set("test-replication-probe", "1") and (
            writer.execute_command("WAIT", 1, 100) != 1
        ):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{replica} does not acknowledge writes to {primary}")


def running_servers() -> Iterator[RedisServer]:
    """The servers this process started and has not stopped (for leak checks)."""
    return iter([s for s in live_servers() if isinstance(s, RedisServer)])
