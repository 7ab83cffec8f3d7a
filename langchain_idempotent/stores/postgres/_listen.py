"""Wake-ups for the Postgres store's waiters: ``LISTEN``/``NOTIFY``, and a bounded poll.

Completion, release, abandon, delete and purge ``pg_notify('<table>_wake', md5(key))`` in the
writing transaction (see :mod:`._sql`), so a notification is delivered on commit.
:class:`_Waiters` is one store object's waiting room in one process: one
:class:`_Listener` thread on a dedicated connection (never a pooled one) with ``LISTEN
<table>_wake``, started and confirmed *before* a waiter first reads the record, waking the
waiters of that key through an in-process :class:`~langchain_idempotent.stores._wakeup.Wakeup`.
A waiter also re-reads the record on a doubling delay from :data:`_FIRST_POLL` up to
``poll_interval`` (the bounded fallback for a dropped listener), and never sleeps past the
lease deadline it last read (:class:`~langchain_idempotent.stores._wakeup.Poller`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

from ...core.record import Record
from .._wakeup import Poller, Wakeup

_log = logging.getLogger("langchain_idempotent.stores.postgres")
_FIRST_POLL = 0.002

#: Where the listener's connection comes from: ``(conninfo, extra connect() kwargs)``.
ConnInfo = Callable[[], tuple[str, dict[str, Any]]]
#: One read of the record and the server's clock (``_store._probe_op``, run by either driver).
Probe = Callable[[], tuple[Record | None, int]]
AsyncProbe = Callable[[], Awaitable[tuple[Record | None, int]]]


def _hash(key: str) -> str:
    """The notification payload for ``key``: ``md5(key)``, as the SQL computes it."""
    return hashlib.md5(key.encode(), usedforsecurity=False).hexdigest()


class _Waiters:
    """The waiters of one store object in one process, and the listener that wakes them.

    ``conninfo`` is ``None`` when there is nothing to ``LISTEN`` with (a store given only
    an async pool): waiters then poll.
    """

    def __init__(self, table: str, conninfo: ConnInfo | None, poll_interval: float) -> None:
        self._table = table
        self._conninfo = conninfo
        self._poll_interval = poll_interval
        self._lock = threading.Lock()
        self._listener: _Listener | None = None
        self.wakeup = Wakeup()

    def _poller(self) -> Poller:
        return Poller(self.wakeup, _FIRST_POLL, self._poll_interval)

    def watch(self, key: str, fence: int, timeout: float, probe: Probe) -> None:
        self.listen()
        self._poller().watch(_hash(key), fence=fence, timeout=timeout, read=probe)

    async def awatch(self, key: str, fence: int, timeout: float, probe: AsyncProbe) -> None:
        await asyncio.to_thread(self.listen)  # once per store and process
        await self._poller().awatch(_hash(key), fence=fence, timeout=timeout, read=probe)

    def listen(self) -> None:
        """Start the listener unless it runs, and wait (bounded) until it listens."""
        with self._lock:
            listener = self._listener
            if listener is None or not listener.alive:
                if self._conninfo is None:
                    return  # nothing to LISTEN with: waiters poll
                listener = self._listener = _Listener(self._table, self._conninfo, self.wakeup)
        listener.wait_listening()

    def stop(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
        if listener is not None:
            listener.stop()


class _Listener:
    """A thread with its own connection, ``LISTEN <table>_wake``, waking this process."""

    def __init__(self, table: str, conninfo: ConnInfo, wakeup: Wakeup) -> None:
        self._conninfo = conninfo
        self._wakeup = wakeup
        self._channel = f"{table}_wake"
        self._listening = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"idempotency-listen-{table}", daemon=True
        )
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stop.is_set()

    def wait_listening(self, timeout: float = 2.0) -> None:
        """Wait (bounded) until LISTEN is in effect; waiters poll if it never is."""
        self._listening.wait(timeout)

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        backoff = 0.05
        while not self._stop.is_set():
            try:
                conninfo, extra = self._conninfo()
                with psycopg.connect(conninfo, autocommit=True, connect_timeout=5, **extra) as conn:
                    conn.execute(f"LISTEN {self._channel}")
                    self._listening.set()
                    backoff = 0.05
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=0.5):
                            self._wakeup.notify(note.payload)
            except Exception as exc:  # reconnect with backoff; waiters poll meanwhile
                self._listening.clear()
                _log.debug("idempotency listener reconnecting: %s", exc)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 2.0)
