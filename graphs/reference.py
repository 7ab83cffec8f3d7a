"""The reference approach the library replaces, rebuilt faithfully as a baseline.

This is the lock-and-cache recipe users start from, step for step; it is the only copy
of it in the repository (the demo wraps tools with it, :mod:`benchmarks.reference` times
it)::

    key = "idempotency:" + sha256(
        f"{workflow_run_id}:{step_name}:{json.dumps(payload, sort_keys=True)}")
    GET key                              → a result is there: return it
    SET lock:key LOCKED EX 45 NX         → not set: raise RuntimeError("Lock contention …")
    run the action
    MULTI  SET key <json result> EX 86400  DEL lock:key  EXEC
    on an exception: a plain DEL lock:key, re-raise

"On an exception" is read as *any* way out of the action (``except BaseException``), the
way a lock is released by ``with redis_client.lock(...)`` or a ``finally:``: a
``KeyboardInterrupt`` or a cancelled task releases the lock too. That gives the baseline
its strongest faithful form; none of the faults below depend on the choice.

Its known faults are kept, not fixed: the window between ``GET`` and ``SET NX`` (a second
worker can run after the first has finished), the unconditional ``DEL`` (it removes another
worker's lock once a lock has expired), the late finisher's ``SET`` (it overwrites the
result), and a crash after the side effect leaves no result, so the action runs again once
the lock expires. Nothing is handed downstream: the provider sees no idempotency key.

The lock TTL is a parameter (``lock_ttl``, 45 s in the recipe). The demo passes the same
lease as the library gets, so that both recover from a dead worker within the run.

Two backends give the steps the same meaning:

- :class:`RedisKV` — real Redis, the commands above verbatim (``--store redis://…``);
- :class:`SqliteKV` — one SQLite file shared by the worker processes, for the default run
  without Redis. Mapping: a table ``kv(key PRIMARY KEY, value, expires_at)``; every command
  is one transaction, as every Redis command is atomic; ``GET`` ignores rows whose
  ``expires_at`` has passed, as Redis hides expired keys; ``SET … EX t NX`` is
  ``BEGIN IMMEDIATE``, check for a live row, insert or replace with ``expires_at = now + t``,
  ``COMMIT``; ``MULTI SET … DEL … EXEC`` is one ``BEGIN IMMEDIATE … COMMIT`` holding both
  writes; ``DEL`` is an unconditional ``DELETE``. "now" is this host's wall clock, which is
  the clock Redis would use on a single host.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from langchain_core.callbacks import CallbackManagerForToolRun
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from pydantic import ConfigDict

from langchain_idempotent.stores.sqlite import switch_to_wal

if TYPE_CHECKING:
    import redis

__all__ = [
    "RedisKV",
    "ReferenceIdempotency",
    "ReferenceIdempotentTool",
    "ReferenceKV",
    "SqliteKV",
    "reference_key",
]


class ReferenceKV(Protocol):
    """The four Redis operations the reference approach uses."""

    def get(self, key: str) -> str | None: ...

    def set_nx_ex(self, key: str, value: str, ex: float) -> bool: ...

    def set_ex_and_delete(self, key: str, value: str, ex: float, delete: str) -> None: ...

    def delete(self, key: str) -> None: ...


class SqliteKV:
    """The reference's Redis commands over one SQLite file (mapping in the module docstring)."""

    def __init__(self, path: str | Path) -> None:
        self._conn = sqlite3.connect(
            str(path), check_same_thread=False, isolation_level=None, timeout=30.0
        )
        switch_to_wal(self._conn, timeout=30.0)  # workers open a fresh file at once
        self._conn.executescript(
            "CREATE TABLE IF NOT EXISTS kv "
            "(key TEXT PRIMARY KEY, value TEXT NOT NULL, expires_at REAL);"
        )

    def close(self) -> None:
        self._conn.close()

    def get(self, key: str) -> str | None:  # GET key
        row = self._conn.execute(
            "SELECT value FROM kv WHERE key = ? AND (expires_at IS NULL OR expires_at > ?)",
            (key, time.time()),
        ).fetchone()
        return None if row is None else str(row[0])

    def set_nx_ex(self, key: str, value: str, ex: float) -> bool:  # SET key value EX ex NX
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            now = time.time()
            live = conn.execute(
                "SELECT 1 FROM kv WHERE key = ? AND (expires_at IS NULL OR expires_at > ?)",
                (key, now),
            ).fetchone()
            if live is None:
                conn.execute("INSERT OR REPLACE INTO kv VALUES (?, ?, ?)", (key, value, now + ex))
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return live is None

    def set_ex_and_delete(self, key: str, value: str, ex: float, delete: str) -> None:
        conn = self._conn  # MULTI; SET key value EX ex; DEL delete; EXEC
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(
                "INSERT OR REPLACE INTO kv VALUES (?, ?, ?)", (key, value, time.time() + ex)
            )
            conn.execute("DELETE FROM kv WHERE key = ?", (delete,))
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def delete(self, key: str) -> None:  # DEL key
        self._conn.execute("DELETE FROM kv WHERE key = ?", (key,))


class RedisKV:
    """The reference's commands on a real Redis.

    ``client`` is a ``redis.Redis`` (the benchmarks pass their own); :meth:`from_url` makes
    one with explicit timeouts. ``prefix`` is prepended to every key, as a client-side key
    prefix: the recipe's keys are unchanged, and a demo run can delete exactly its own keys
    afterwards.
    """

    def __init__(self, client: redis.Redis, *, prefix: str = "") -> None:
        self._client = client
        self._prefix = prefix

    @classmethod
    def from_url(cls, url: str, *, prefix: str = "") -> RedisKV:
        import redis

        return cls(
            redis.Redis.from_url(url, socket_timeout=5.0, socket_connect_timeout=2.0),
            prefix=prefix,
        )

    def close(self) -> None:
        self._client.close()

    def get(self, key: str) -> str | None:
        value = self._client.get(self._prefix + key)
        return value.decode() if isinstance(value, bytes) else value

    def set_nx_ex(self, key: str, value: str, ex: float) -> bool:
        ms = max(1, int(ex * 1000))
        return bool(self._client.set(self._prefix + key, value, px=ms, nx=True))

    def set_ex_and_delete(self, key: str, value: str, ex: float, delete: str) -> None:
        pipe = self._client.pipeline(transaction=True)  # MULTI ... EXEC
        pipe.set(self._prefix + key, value, px=max(1, int(ex * 1000)))
        pipe.delete(self._prefix + delete)
        pipe.execute()

    def delete(self, key: str) -> None:
        self._client.delete(self._prefix + key)


def reference_key(workflow_run_id: str, step_name: str, payload: dict[str, Any]) -> str:
    blob = f"{workflow_run_id}:{step_name}:{json.dumps(payload, sort_keys=True)}"
    return "idempotency:" + hashlib.sha256(blob.encode()).hexdigest()


class ReferenceIdempotency:
    """The reference recipe around one action. ``on_event`` hears ``"replay"`` (a ``GET``
    hit) and ``"contention"`` (``SET NX`` refused)."""

    def __init__(
        self,
        kv: ReferenceKV,
        *,
        lock_ttl: float = 45.0,
        result_ttl: float = 86400.0,
        on_event: Callable[[str], None] | None = None,
    ) -> None:
        self.kv = kv
        self.lock_ttl = lock_ttl
        self.result_ttl = result_ttl
        self.on_event = on_event

    def _event(self, kind: str) -> None:
        if self.on_event is not None:
            self.on_event(kind)

    def run(
        self,
        workflow_run_id: str,
        step_name: str,
        payload: dict[str, Any],
        action: Callable[[], Any],
    ) -> Any:
        """The recipe for one step: its key from the run, the step and the payload."""
        return self.run_key(reference_key(workflow_run_id, step_name, payload), action)

    def run_key(self, key: str, action: Callable[[], Any]) -> Any:
        """The recipe around ``action`` under an already derived ``key``."""
        cached = self.kv.get(key)
        if cached is not None:
            self._event("replay")
            return json.loads(cached)
        lock = f"lock:{key}"
        if not self.kv.set_nx_ex(lock, "LOCKED", self.lock_ttl):
            self._event("contention")
            raise RuntimeError(f"Lock contention on {key}: another worker is running this step")
        try:
            result = action()
        except BaseException:  # any way out of the action (module docstring)
            self.kv.delete(lock)
            raise
        self.kv.set_ex_and_delete(key, json.dumps(result), self.result_ttl, lock)
        return result


class ReferenceIdempotentTool(BaseTool):
    """``inner`` behind :class:`ReferenceIdempotency`; same name, description and schema.

    ``workflow_run_id`` is the LangGraph thread id, ``step_name`` the tool name and the
    payload the validated arguments the tool function receives.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    inner: BaseTool
    guard: ReferenceIdempotency

    def _run(
        self,
        *args: Any,
        config: RunnableConfig,
        run_manager: CallbackManagerForToolRun | None = None,
        **kwargs: Any,
    ) -> Any:
        thread_id = str(config.get("configurable", {}).get("thread_id", ""))
        child = RunnableConfig(callbacks=run_manager.get_child()) if run_manager else None
        return self.guard.run(
            thread_id, self.inner.name, kwargs, lambda: self.inner.invoke(kwargs, config=child)
        )

    @classmethod
    def wrap(cls, tools: Sequence[BaseTool], guard: ReferenceIdempotency) -> list[BaseTool]:
        return [
            cls(
                name=t.name,
                description=t.description,
                args_schema=t.args_schema,
                inner=t,
                guard=guard,
            )
            for t in tools
        ]
