"""The store kinds a campaign runs against, each with its own throwaway server.

``memory`` and ``sqlite`` run on a :class:`~langchain_idempotent.testing.FakeClock` the
scheduler moves (a clock jump is instant); ``redis`` and ``postgres`` on their server's
clock, with a short lease, so an expiry is real time passing. Every backend cleans up what
it made: its keys, its table, its server and its directory.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

from langchain_idempotent.core.store import BaseIdempotencyStore
from langchain_idempotent.stores import InMemoryIdempotencyStore, SqliteIdempotencyStore
from langchain_idempotent.testing import FakeClock

from .sim import Backend

STORES = ("memory", "sqlite", "redis", "postgres")
#: What ``--durability`` means per store: the setting a restart is measured under.
DURABILITY: dict[str, tuple[str, ...]] = {
    "memory": ("none",),
    "sqlite": ("NORMAL", "FULL"),
    "redis": ("rdb-only", "no", "everysec", "always"),
    "postgres": ("off", "local", "on"),
}


class UsageError(Exception):
    """Bad input: the CLI prints it and exits 2."""


class MemoryBackend(Backend):
    name = "memory"
    durable = False

    def __init__(self, durability: str | None = None) -> None:
        self.fake_clock = FakeClock()
        self.store: BaseIdempotencyStore = InMemoryIdempotencyStore(clock=self.fake_clock)

    def now_ms(self) -> int:
        return int(self.fake_clock.now * 1000)

    def restart(self) -> None:
        """A process that held the records in memory died: they are gone."""
        self.store = InMemoryIdempotencyStore(clock=self.fake_clock)

    def close(self) -> None:
        pass


class SqliteBackend(Backend):
    name = "sqlite"

    def __init__(self, durability: str | None = None) -> None:
        self.fake_clock = FakeClock()
        self.synchronous = durability or "NORMAL"
        # On tmpfs when there is one (the same SQLite code, without waiting on the disk),
        # except when a durability setting is what is being measured.
        shm = "/dev/shm" if durability is None and Path("/dev/shm").is_dir() else None
        self.dir = Path(tempfile.mkdtemp(prefix="torture-sqlite-", dir=shm))
        self.store = self._open()

    def _open(self) -> SqliteIdempotencyStore:
        return SqliteIdempotencyStore(
            self.dir / "idem.sqlite",
            clock=self.fake_clock,
            synchronous=self.synchronous,  # type: ignore[arg-type]
        )

    def now_ms(self) -> int:
        return int(self.fake_clock.now * 1000)

    def restart(self) -> None:
        """The process using the database died and another opens it (committed
        transactions are in the file or its WAL; ``synchronous`` matters only for a crash of
        the machine, which this cannot stage)."""
        self.store.close()
        self.store = self._open()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class RedisBackend(Backend):
    name = "redis"
    lease_ms = 25
    durable = False

    def __init__(self, durability: str | None = None, url: str | None = None) -> None:
        from langchain_idempotent.stores import RedisIdempotencyStore
        from tests.support.redis_servers import RedisServer, redis_server_available

        self.server: Any = None
        self.durability = durability or "rdb-only"
        if url is None:
            if not redis_server_available():
                raise UsageError("redis-server is not on PATH")
            if self.durability == "rdb-only":
                self.server = RedisServer(appendonly="no")
            else:
                self.server = RedisServer(appendonly="yes", appendfsync=self.durability)
            url = self.server.url
        self.url = url
        self.prefix = f"torture-{uuid.uuid4().hex[:8]}:"
        self.store = RedisIdempotencyStore.from_url(
            url, prefix=self.prefix, socket_timeout=2.0, retries=1
        )
        try:
            self.store.describe()
        except Exception as exc:
            self.close()
            raise UsageError(f"cannot reach Redis at {url}: {exc}") from exc

    def restart(self) -> None:
        """``kill -9`` the server, start it again on its directory (AOF / RDB)."""
        assert self.server is not None
        self.server.kill()
        self.server.start()
        self.store.close()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            import redis

            client = redis.Redis.from_url(self.url, socket_timeout=2.0)
            for k in client.scan_iter(match=self.prefix + "*", count=500):
                client.delete(k)
            client.close()
        with contextlib.suppress(Exception):
            self.store.close()
        if self.server is not None:
            self.server.stop()
            with contextlib.suppress(Exception):
                shutil.rmtree(self.server.dir, ignore_errors=True)


class PostgresBackend(Backend):
    name = "postgres"
    lease_ms = 30
    durable = False

    def __init__(self, durability: str | None = None, url: str | None = None) -> None:
        from langchain_idempotent.stores import PostgresIdempotencyStore
        from tests.support.postgres_server import PostgresServer, postgres_unavailable_reason

        self.server: Any = None
        self.durability = durability or "off"
        if url is None:
            reason = postgres_unavailable_reason()
            if reason is not None:
                raise UsageError(reason)
            self.server = PostgresServer(synchronous_commit=self.durability)
            url = self.server.url
        self.table = f"torture_{uuid.uuid4().hex[:8]}"
        try:
            self.store = PostgresIdempotencyStore.from_url(url, table=self.table, timeout=3.0)
            self.store.describe()
        except Exception as exc:
            self.close()
            raise UsageError(f"cannot reach PostgreSQL at {url}: {exc}") from exc

    def restart(self) -> None:
        """Kill the postmaster and every backend (a crash: recovery runs on start)."""
        assert self.server is not None
        self.server.kill()
        self.server.start()

    def close(self) -> None:
        store = getattr(self, "store", None)
        if store is not None:
            with contextlib.suppress(Exception):
                store.drop()
            with contextlib.suppress(Exception):
                store.close()
        if self.server is not None:
            self.server.stop()
            shutil.rmtree(self.server.dir, ignore_errors=True)


def open_backend(name: str, durability: str | None = None, url: str | None = None) -> Backend:
    if name not in STORES:
        raise UsageError(f"unknown store {name!r}; choose one of {', '.join(STORES)}")
    if durability is not None and durability not in DURABILITY[name]:
        raise UsageError(
            f"--durability {durability!r} does not apply to {name}; "
            f"choose one of {', '.join(DURABILITY[name])}"
        )
    if url is not None and name in ("memory", "sqlite"):
        raise UsageError(f"--url applies to redis and postgres, not {name}")
    if name == "memory":
        return MemoryBackend(durability)
    if name == "sqlite":
        return SqliteBackend(durability)
    if name == "redis":
        return RedisBackend(durability, url)
    return PostgresBackend(durability, url)
