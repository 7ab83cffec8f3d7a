"""Fault injection for the race tests (``tests/test_races.py``) and the fault campaign
(``tests/faults/``).

- :class:`StoreSpec` says how a process opens the store under test; every worker process
  opens its own (nothing is shared with the parent but the address).
- :class:`Ledger` is the downstream system a tool acts on — think of a payments API — kept
  in a SQLite file that every process can write. It logs every *execution* of a tool body
  (outside the idempotency store, so it counts what really ran), and applies *effects*
  the way a careful API does: deduplicated on the idempotency key, and a write carrying a
  lower fence than the highest seen for its key is rejected.
- :class:`FaultProxy` is a TCP proxy on loopback between the store and Redis that drops,
  stalls or resets connections at chosen commands (matched on the bytes a client sends,
  e.g. the SHA of the claim script).
- Process helpers: wait until a process is stopped (SIGSTOP), kill and reap.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import sqlite3
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from langchain_idempotent.core.store import BaseIdempotencyStore
from langchain_idempotent.stores.redis import RedisIdempotencyStore
from langchain_idempotent.stores.sqlite import SqliteIdempotencyStore

__all__ = [
    "FaultProxy",
    "Ledger",
    "LedgerReply",
    "ProxyRule",
    "StoreSpec",
    "Tally",
    "kill_hard",
    "percentile",
    "process_state",
    "wait_stopped",
    "wait_until",
]


# -- the store under test ------------------------------------------------------------------


@dataclass(frozen=True)
class StoreSpec:
    """Everything a process needs to open its own connection to the store under test.

    ``kind`` is ``"redis"`` (``target`` a URL), ``"cluster"`` (a URL naming any node),
    ``"sentinel"`` (``"host:port,host:port/service"``) or ``"sqlite"`` (a file path).
    """

    kind: Literal["redis", "cluster", "sentinel", "sqlite"]
    target: str
    prefix: str = "idem:"
    socket_timeout: float = 2.0
    socket_connect_timeout: float = 1.0
    retries: int = 3

    def open(self) -> BaseIdempotencyStore:
        if self.kind == "sqlite":
            return SqliteIdempotencyStore(self.target)
        timeouts: dict[str, Any] = {
            "prefix": self.prefix,
            "socket_timeout": self.socket_timeout,
            "socket_connect_timeout": self.socket_connect_timeout,
            "retries": self.retries,
        }
        if self.kind == "sentinel":
            hosts, _, service = self.target.partition("/")
            addresses = [(h.split(":")[0], int(h.split(":")[1])) for h in hosts.split(",")]
            return RedisIdempotencyStore.from_sentinel(addresses, service, **timeouts)
        return RedisIdempotencyStore.from_url(
            self.target, cluster=self.kind == "cluster", **timeouts
        )


# -- the downstream system -----------------------------------------------------------------

_LEDGER_SCHEMA = """
CREATE TABLE IF NOT EXISTS executions (
    key TEXT, fence INTEGER, attempt INTEGER, takeover INTEGER, pid INTEGER, at REAL);
CREATE TABLE IF NOT EXISTS effects (
    key TEXT, idempotency_key TEXT, fence INTEGER, value TEXT, at REAL);
CREATE TABLE IF NOT EXISTS requests (key TEXT, fence INTEGER, status TEXT, at REAL);
CREATE TABLE IF NOT EXISTS fences (idempotency_key TEXT PRIMARY KEY, fence INTEGER);
CREATE TABLE IF NOT EXISTS calls (key TEXT, result TEXT, error TEXT, pid INTEGER, at REAL);
CREATE INDEX IF NOT EXISTS effects_key ON effects (idempotency_key);
"""


#: Every connection a :class:`Ledger` opened, kept referenced for good: a forked child must
#: never close, or even free, a SQLite connection it inherited (freeing one closes it, which
#: SQLite forbids after fork() and which deadlocks on locks held by the parent's threads).
_CONNECTIONS: list[sqlite3.Connection] = []


@dataclass(frozen=True)
class LedgerReply:
    #: ``"applied"``, ``"duplicate"`` (the key was applied before: its stored value is
    #: returned) or ``"stale_fence"`` (a higher fence was seen for this key: rejected).
    status: str
    value: str | None


class Ledger:
    """A deduplicating downstream system in a SQLite file (see the module docstring).

    Safe for threads and processes: each thread of each process opens its own connection,
    and every write is one ``BEGIN IMMEDIATE`` transaction.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._local = threading.local()
        self._db().executescript(_LEDGER_SCHEMA)

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.path = state["path"]
        self._local = threading.local()

    def _open(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=60, isolation_level=None)
        _CONNECTIONS.append(db)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        return db

    def _db(self) -> sqlite3.Connection:
        pid, db = getattr(self._local, "conn", (None, None))
        if pid != os.getpid() or db is None:
            db = self._open()
            self._local.conn = (os.getpid(), db)
        return db

    @contextlib.contextmanager
    def _txn(self) -> Iterator[sqlite3.Connection]:
        db = self._db()
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    # -- what tools call ---------------------------------------------------------------

    def executed(self, key: str, fence: int = 0, attempt: int = 0, takeover: bool = False) -> None:
        """Log that a tool body started running for ``key``."""
        with self._txn() as db:
            db.execute(
                "INSERT INTO executions VALUES (?, ?, ?, ?, ?, ?)",
                (key, fence, attempt, int(takeover), os.getpid(), time.time()),
            )

    def apply(
        self,
        key: str,
        fence: int,
        value: str,
        *,
        idempotency_key: str | None = "",
        pause: Any = None,
    ) -> LedgerReply:
        """Apply an effect for the call ``key``; deduplicate on ``idempotency_key``.

        ``idempotency_key`` is what the caller sent downstream: ``""`` (default) means
        ``key`` itself, ``None`` that the caller sent none (the effect is always applied,
        as by an API without idempotency keys). A ``fence`` lower than the highest seen for
        the idempotency key is rejected. ``pause`` (a callable) runs inside the open
        transaction, before it commits: a worker killed there never applied the effect
        (SQLite rolls the transaction back).
        """
        dedupe = key if idempotency_key == "" else idempotency_key
        with self._txn() as db:
            status, stored = self._decide(db, dedupe, fence)
            if status == "applied":
                db.execute(
                    "INSERT INTO effects VALUES (?, ?, ?, ?, ?)",
                    (key, dedupe, fence, value, time.time()),
                )
                stored = value
            db.execute(
                "INSERT INTO requests VALUES (?, ?, ?, ?)", (key, fence, status, time.time())
            )
            if pause is not None:
                pause()
        return LedgerReply(status, stored)

    @staticmethod
    def _decide(db: sqlite3.Connection, dedupe: str | None, fence: int) -> tuple[str, str | None]:
        if dedupe is None:
            return "applied", None
        seen = db.execute(
            "SELECT fence FROM fences WHERE idempotency_key = ?", (dedupe,)
        ).fetchone()
        if seen is not None and seen[0] > fence:
            return "stale_fence", None
        db.execute("INSERT OR REPLACE INTO fences VALUES (?, ?)", (dedupe, fence))
        row = db.execute(
            "SELECT value FROM effects WHERE idempotency_key = ? ORDER BY rowid LIMIT 1",
            (dedupe,),
        ).fetchone()
        if row is not None:
            return "duplicate", str(row[0])
        return "applied", None

    def calls(self, rows: list[tuple[str, str | None, str | None]]) -> None:
        """Log what callers got back: ``(key, result, error type)`` per call."""
        now, pid = time.time(), os.getpid()
        with self._txn() as db:
            db.executemany(
                "INSERT INTO calls VALUES (?, ?, ?, ?, ?)",
                [(k, r, e, pid, now) for k, r, e in rows],
            )

    # -- what tests read ---------------------------------------------------------------

    def _count(self, sql: str) -> dict[str, int]:
        return {k: n for k, n in self._db().execute(sql).fetchall()}

    def executions(self) -> dict[str, int]:
        """Tool bodies started, per key."""
        return self._count("SELECT key, COUNT(*) FROM executions GROUP BY key")

    def execution_fences(self) -> list[tuple[str, int, int, int]]:
        """``(key, fence, attempt, takeover)`` of every execution, in order."""
        return list(
            self._db().execute(
                "SELECT key, fence, attempt, takeover FROM executions ORDER BY rowid"
            )
        )

    def execution_times(self) -> list[float]:
        """Wall-clock times (``time.time()``) at which tool bodies started."""
        return [at for (at,) in self._db().execute("SELECT at FROM executions ORDER BY at")]

    def effects(self) -> dict[str, int]:
        """Effects applied, per key (more than 1 is a duplicate effect)."""
        return self._count("SELECT key, COUNT(*) FROM effects GROUP BY key")

    def effect_value(self, key: str) -> str | None:
        row = (
            self._db()
            .execute("SELECT value FROM effects WHERE key = ? ORDER BY rowid LIMIT 1", (key,))
            .fetchone()
        )
        return None if row is None else str(row[0])

    def requests(self) -> dict[str, int]:
        """Requests that reached the downstream system, by status."""
        return self._count("SELECT status, COUNT(*) FROM requests GROUP BY status")

    def results(self) -> dict[str, set[str]]:
        """The distinct results callers got, per key (more than 1 is a divergence)."""
        out: dict[str, set[str]] = {}
        for key, result in self._db().execute(
            "SELECT key, result FROM calls WHERE result IS NOT NULL"
        ):
            out.setdefault(key, set()).add(result)
        return out

    def errors(self) -> dict[str, int]:
        """Errors callers got, by type."""
        return self._count(
            "SELECT error, COUNT(*) FROM calls WHERE error IS NOT NULL GROUP BY error"
        )

    def call_count(self) -> int:
        return int(self._db().execute("SELECT COUNT(*) FROM calls").fetchone()[0])


# -- the misbehaving network ---------------------------------------------------------------

ProxyAction = Literal["reset_request", "stall_request", "drop_reply", "stall_reply"]


@dataclass
class ProxyRule:
    """What the proxy does to the next request(s) whose bytes contain ``match`` (every
    one of them, when it is a tuple: e.g. a script's SHA and a key).

    - ``reset_request``: the request never reaches the server; the connection is reset.
    - ``stall_request``: the request never reaches the server; the client hears nothing.
    - ``drop_reply``: the server runs the request; its reply is dropped and the
      connection reset (a lost reply).
    - ``stall_reply``: the server runs the request; the reply never comes (the client's
      socket timeout fires).

    ``times`` counts the requests still to fault (``None``: all of them); ``hits`` those
    faulted so far.
    """

    match: bytes | tuple[bytes, ...]
    action: ProxyAction
    times: int | None = 1
    hits: int = 0


@dataclass
class _Pair:
    client: socket.socket
    upstream: socket.socket
    #: Drop everything the server sends from now on, then reset (drop_reply).
    drop_reply: bool = False
    #: Hold the server's replies (stall_reply) / the client's requests (stall_request).
    hold_reply: bool = False
    hold_request: bool = False
    closed: bool = False


class FaultProxy:
    """A TCP proxy on 127.0.0.1 in front of ``upstream`` that misbehaves on cue.

    One thread runs a selector over every connection, so a fault is applied between two
    reads without races. Besides per-request :class:`ProxyRule` s it has two global modes:
    ``down`` (new connections are reset at once: "connection refused" to a client) and
    ``blackhole`` (connections are accepted and nothing is forwarded, in either direction,
    on new or open connections: a partitioned network).
    """

    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._rules: list[ProxyRule] = []
        self._pairs: dict[socket.socket, _Pair] = {}
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ, None)
        self.down = False
        self.blackhole = False
        self.connections = 0
        self._wake_r, self._wake_w = socket.socketpair()
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="fault-proxy", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def add_rule(
        self, match: bytes | tuple[bytes, ...], action: ProxyAction, times: int | None = 1
    ) -> ProxyRule:
        rule = ProxyRule(match, action, times)
        with self._lock:
            self._rules.append(rule)
        return rule

    def clear_rules(self) -> None:
        with self._lock:
            self._rules.clear()

    def set_down(self, down: bool) -> None:
        """``True``: reset every open connection and every new one."""
        self.down = down
        if down:
            self.reset_all()

    def reset_all(self) -> None:
        """Reset every open connection (both sides)."""
        with self._lock:
            for pair in list(self._pairs.values()):
                pair.closed = True
        self._wake_w.send(b"x")

    def close(self) -> None:
        self._stop = True
        self._wake_w.send(b"x")
        self._thread.join(5)
        for s in (self._listener, self._wake_r, self._wake_w):
            s.close()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the loop ------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop:
            for sel_key, _ in self._sel.select(timeout=0.05):
                sock = sel_key.fileobj
                assert isinstance(sock, socket.socket)
                if sel_key.data == "wake":
                    sock.recv(4096)
                elif sock is self._listener:
                    self._accept()
                else:
                    self._pump(sock)
            self._reap()
        for pair in list(self._pairs.values()):
            self._close(pair)

    def _accept(self) -> None:
        with contextlib.suppress(BlockingIOError):
            client, _ = self._listener.accept()
            self.connections += 1
            if self.down:
                _reset(client)
                return
            try:
                upstream = socket.create_connection(self.upstream, timeout=1.0)
            except OSError:
                _reset(client)
                return
            for s in (client, upstream):  # as Redis does: no Nagle delay on small replies
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                s.setblocking(False)
            pair = _Pair(client, upstream, hold_request=self.blackhole)
            with self._lock:
                self._pairs[client] = pair
                self._pairs[upstream] = pair
            self._sel.register(client, selectors.EVENT_READ, "c")
            self._sel.register(upstream, selectors.EVENT_READ, "u")

    def _pump(self, sock: socket.socket) -> None:
        pair = self._pairs.get(sock)
        if pair is None or pair.closed:
            return
        try:
            data = sock.recv(1 << 20)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            pair.closed = True
            return
        if sock is pair.client:
            self._from_client(pair, data)
        else:
            self._from_server(pair, data)

    def _from_client(self, pair: _Pair, data: bytes) -> None:
        if pair.hold_request or self.blackhole:
            return
        action = self._match(data)
        if action == "reset_request":
            pair.closed = True
            return
        if action == "stall_request":
            pair.hold_request = True
            return
        if action == "drop_reply":
            pair.drop_reply = True
        elif action == "stall_reply":
            pair.hold_reply = True
        _send_all(pair.upstream, data)

    def _from_server(self, pair: _Pair, data: bytes) -> None:
        if pair.drop_reply:
            pair.closed = True  # the reply is read and thrown away; the client is reset
            return
        if pair.hold_reply or self.blackhole:
            return
        _send_all(pair.client, data)

    def _match(self, data: bytes) -> ProxyAction | None:
        with self._lock:
            for rule in self._rules:
                if rule.times is not None and rule.hits >= rule.times:
                    continue
                needles = rule.match if isinstance(rule.match, tuple) else (rule.match,)
                if all(needle in data for needle in needles):
                    rule.hits += 1
                    return rule.action
        return None

    def _reap(self) -> None:
        with self._lock:
            doomed = {id(p): p for p in self._pairs.values() if p.closed}
        for pair in doomed.values():
            self._close(pair)

    def _close(self, pair: _Pair) -> None:
        for s in (pair.client, pair.upstream):
            with self._lock:
                self._pairs.pop(s, None)
            with contextlib.suppress(KeyError, ValueError):
                self._sel.unregister(s)
            _reset(s)


def _send_all(sock: socket.socket, data: bytes) -> None:
    sock.setblocking(True)
    try:
        sock.sendall(data)
    except OSError:
        pass
    finally:
        sock.setblocking(False)


def _reset(sock: socket.socket) -> None:
    """Close with RST (SO_LINGER 0), not FIN: the peer sees "connection reset"."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


# -- processes -----------------------------------------------------------------------------


def process_state(pid: int) -> str:
    """The one-letter state of ``pid`` from ``/proc`` (``T``: stopped), ``""`` if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[0]


def wait_stopped(pid: int, timeout: float = 10.0) -> None:
    """Block until ``pid`` is stopped by a signal (after SIGSTOP)."""
    wait_until(lambda: process_state(pid) in ("T", "t"), timeout, f"process {pid} to stop")


def wait_until(condition: Any, timeout: float, what: str, every: float = 0.005) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)


def kill_hard(pid: int) -> None:
    """SIGKILL, ignoring a process that is already gone."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def percentile(values: list[float], q: float) -> float:
    """The ``q``-quantile (0..1) of ``values`` by nearest rank."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(0, min(len(ordered) - 1, round(q * (len(ordered) - 1))))
    return ordered[rank]


@dataclass
class Tally:
    """What callers got, counted in one process before being written to the ledger."""

    rows: list[tuple[str, str | None, str | None]] = field(default_factory=list)

    def ok(self, key: str, result: object) -> None:
        self.rows.append((key, str(result), None))

    def error(self, key: str, exc: BaseException) -> None:
        self.rows.append((key, None, type(exc).__name__))
