"""What the Redis servers behind a store say about themselves: the facts ``doctor`` reads.

:func:`describe_servers` asks every server the store writes to (the master; on a Cluster,
every primary) for the ``INFO`` fields and ``CONFIG GET`` values that decide whether a
record can be lost (eviction, persistence, replication), through the store's own client.
``CONFIG`` may be refused (ACLs, renamed away, managed services): such values are ``None``.
No password is ever part of the answer. redis-py is untyped here, hence the ``Any``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import redis
import redis.sentinel
from redis.exceptions import ResponseError

__all__ = ["CONFIG_FIELDS", "INFO_FIELDS", "describe_servers", "time_ms"]

#: The ``INFO`` fields reported for each server (``None`` where absent).
INFO_FIELDS = (
    "redis_version",
    "redis_mode",
    "role",
    "connected_slaves",
    "master_link_status",
    "maxmemory",
    "maxmemory_policy",
    "aof_enabled",
    "rdb_changes_since_last_save",
)
#: The ``CONFIG GET`` values reported for each server (``None`` where refused).
CONFIG_FIELDS = ("appendfsync", "save", "min-replicas-to-write")


def time_ms(reply: Any) -> int:
    """A ``TIME`` reply (seconds, microseconds) in milliseconds."""
    seconds, micros = reply[0], reply[1]
    return int(seconds) * 1000 + int(micros) // 1000


def describe_servers(client: Any) -> tuple[str, list[dict[str, Any]]]:
    """The topology (``standalone`` / ``sentinel`` / ``cluster``) and one entry per server
    written to, each with its ``address`` (``host:port`` or the socket path)."""
    pool: Any = getattr(client, "connection_pool", None)
    if isinstance(client, redis.RedisCluster):
        primaries: Any = client.get_primaries
        servers = [_server(client, node.name, {"target_nodes": node}) for node in primaries()]
        return "cluster", sorted(servers, key=lambda s: str(s["address"]))
    if isinstance(pool, redis.sentinel.SentinelConnectionPool):
        master: Any = pool.get_master_address
        host, port = master()
        return "sentinel", [_server(client, f"{host}:{port}", {})]
    conn = pool.connection_kwargs
    address = conn.get("path") or f"{conn.get('host', 'localhost')}:{conn.get('port', 6379)}"
    return "standalone", [_server(client, str(address), {})]


def _server(client: Any, address: str, target: Mapping[str, Any]) -> dict[str, Any]:
    info = client.execute_command("INFO", **target)
    server: dict[str, Any] = {"address": address}
    for name in INFO_FIELDS:
        value = info.get(name)
        server[name] = _text(value) if isinstance(value, bytes) else value
    for name in CONFIG_FIELDS:
        try:
            reply = client.execute_command("CONFIG", "GET", name, **target)
        except ResponseError:  # CONFIG refused (NOPERM, renamed away, a managed service)
            server[name] = None
            continue
        # RESP3 answers a map; RESP2 (protocol=2, and redis-py before 8) a flat list of pairs.
        pairs = (
            reply.items()
            if isinstance(reply, Mapping)
            else zip(reply[::2], reply[1::2], strict=True)
        )
        found = [v for k, v in pairs if _text(k) == name]
        server[name] = _text(found[0]) if found else None
    return server


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
