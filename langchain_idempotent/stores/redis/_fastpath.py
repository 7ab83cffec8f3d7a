"""The sync fast path: an optimisation, not part of the store's contract.

With a sync standalone or Sentinel ``redis.Redis`` (not a single-connection client), the
store keeps the connections it has used checked out of the client's own pool
(:class:`_HeldConnections`): an operation takes an idle one (or checks out one more), writes
``EVALSHA`` (and, with ``replicas``, ``WAIT``) on it directly, reads the replies, and puts
it back. So the store holds as many connections as operations ran at once, whichever
threads ran them (also the short-lived threads of LangGraph's per-step executors).

What it bypasses: ``Redis.execute_command`` — taking and returning a pool connection per
command, redis-py's per-command option handling, response callbacks and decoding, and
``Redis``-level retries. What still applies: the connection's own ``Retry`` (for the
attempts left after the first), its timeouts, TLS, authentication and health checks, since
every byte still goes through the connection object. Replies are the same raw bytes as on
the slow path; Cluster, async and single-connection clients take the slow path
(:func:`._scripts._execute`, :func:`._scripts._aexecute`), and the store behaves the same
on both.

It relies on these redis-py internals (not documented API; the store's tests exercise each
one, so a redis-py release that moves one fails them):

- ``ConnectionPool.get_connection()`` / ``release(conn)`` to hold connections;
- ``Connection.send_packed_command(bytes | list[bytes])`` to write pipelined commands,
  packed by ``hiredis.pack_command`` when the connection encodes text as UTF-8 (strict),
  else by ``Connection.pack_commands``;
- ``Connection.read_response(disable_decoding=True)`` to read a reply as raw bytes — the
  connection-level counterpart of ``redis.client.NEVER_DECODE``, which the slow path passes
  to ``execute_command`` (:data:`._scripts._RAW`);
- ``Connection.retry`` (copied, with ``get_retries`` / ``update_retries``) and
  ``Connection.disconnect()``.

Failure handling: ``NOSCRIPT`` is answered by sending the script's source once (``EVAL``).
A round trip interrupted between send and read (``KeyboardInterrupt``) disconnects the
connection, so no later call reads its reply. One that failed on a connection error is
disconnected and returned to the pool, and the idle ones are disconnected too (a reset or
restart killed them), so that a retry reconnects. After ``fork()`` the child checks out its
own connections: the module counts forks, and connections checked out before one belong to
the parent.
"""

from __future__ import annotations

import codecs
import copy
import functools
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import redis
from redis.connection import ConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ...core._drive import drive
from ._scripts import _batch_steps, _Script

_T = TypeVar("_T")

_hiredis_pack: Callable[[tuple[Any, ...]], bytes] | None
try:
    import hiredis

    _hiredis_pack = hiredis.pack_command
except ImportError:  # pragma: no cover - redis[hiredis] is a dependency
    _hiredis_pack = None

#: Bumped in a forked child: connections checked out before the fork belong to the parent.
_forks = 0


def _after_fork_in_child() -> None:
    global _forks
    _forks += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class _Held:
    """A connection checked out of the client's pool for this store's fast path."""

    __slots__ = ("conn", "forks", "generation", "pack")

    def __init__(self, conn: Any, generation: int) -> None:
        self.conn = conn
        self.forks = _forks
        self.generation = generation
        self.pack = _packer_for(conn)


class _HeldConnections:
    """``EVALSHA`` straight on connections this store keeps checked out of the client's
    pool (see the module docstring): an operation takes an idle one (or checks out one more)
    and puts it back when done, so threads share them one at a time — also the short-lived
    threads of LangGraph's per-step executors, which a connection per thread would make
    check out and return a connection on every call."""

    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool
        self._idle: list[_Held] = []
        self._lock = threading.Lock()  # guards _idle (reset in a forked child)
        self._generation = 0
        self._forks = _forks

    @classmethod
    def for_client(cls, client: object) -> _HeldConnections | None:
        if not isinstance(client, redis.Redis) or client.connection is not None:
            return None  # Cluster, or a single-connection client with its own lock
        pool = client.connection_pool
        return cls(pool) if isinstance(pool, ConnectionPool) else None

    def _after_fork(self) -> None:
        if self._forks != _forks:  # a forked child: the idle ones belong to the parent,
            self._idle, self._lock, self._forks = [], threading.Lock(), _forks  # the lock too

    def _take(self) -> _Held:
        self._after_fork()
        with self._lock:
            if self._idle:
                return self._idle.pop()
            generation = self._generation
        return _Held(self._pool.get_connection(), generation)

    def _put_back(self, held: _Held) -> None:
        if held.forks != _forks:
            return
        with self._lock:
            if held.generation == self._generation:
                self._idle.append(held)
                return
        self._pool.release(held.conn)  # the store was closed meanwhile

    def _disconnect_idle(self) -> None:
        """After a connection error the idle ones are likely dead too (a restart, a reset,
        a failover): close them, so that the retries reconnect instead of failing on them."""
        self._after_fork()
        with self._lock:
            for held in self._idle:
                held.conn.disconnect()

    def _drop(self, held: _Held) -> None:
        if held.forks == _forks:
            self._pool.release(held.conn)

    def evalsha(
        self, script: _Script, rkey: str, args: Sequence[Any], wait: tuple[Any, ...] | None
    ) -> tuple[Any, int | None]:
        return self._on_held(lambda held: _roundtrip(held, script, rkey, args, wait))

    def evalsha_many(
        self, script: _Script, calls: Sequence[tuple[str, Sequence[Any]]], wait: Any
    ) -> tuple[list[Any], int | None]:
        """A batch of ``script`` calls (:func:`._scripts._batch_steps`): each pipeline's
        commands written at once on a held connection, their replies read in order."""
        steps = _batch_steps(script, calls, wait)
        return drive(
            steps, lambda cmds: self._on_held(functools.partial(_pipelined, commands=cmds))
        )

    def _on_held(self, op: Callable[[_Held], _T]) -> _T:
        held = self._take()
        try:
            answer = op(held)
        except (RedisConnectionError, RedisTimeoutError) as exc:
            self._disconnect_idle()
            answer = self._retry(held, op, exc)
        except BaseException:
            self._put_back(held)  # a reply error, or interrupted (then disconnected)
            raise
        self._put_back(held)
        return answer

    def _retry(self, held: _Held, op: Callable[[_Held], _T], first: Exception) -> _T:
        """The client's ``Retry`` for the attempts left after the first one failed (none
        for clients built by ``from_url``: the store retries whole operations)."""
        conn = held.conn
        conn.disconnect()
        retry = copy.copy(conn.retry)
        left = retry.get_retries()
        try:
            if left == 0:
                raise first
            retry.update_retries(left - 1 if left > 0 else left)
            answer: _T = retry.call_with_retry(lambda: op(held), lambda _err: conn.disconnect())
            return answer
        except BaseException:
            self._drop(held)
            raise

    def close(self) -> None:
        self._after_fork()
        with self._lock:
            self._generation += 1
            idle, self._idle = self._idle, []
        for held in idle:
            self._drop(held)


def _packer_for(conn: Any) -> Callable[[tuple[Any, ...]], bytes] | None:
    """hiredis' packer when it encodes text as the connection would (UTF-8, strict)."""
    encoder = getattr(conn, "encoder", None)
    if _hiredis_pack is None or encoder is None or encoder.encoding_errors != "strict":
        return None
    return _hiredis_pack if codecs.lookup(encoder.encoding).name == "utf-8" else None


def _roundtrip(
    held: _Held, script: _Script, rkey: str, args: Sequence[Any], wait: tuple[Any, ...] | None
) -> tuple[Any, int | None]:
    conn, pack = held.conn, held.pack
    try:
        try:
            _send_pipelined(conn, pack, ("EVALSHA", script.sha, 1, rkey, *args), wait)
            return _read_replies(conn, wait)
        except NoScriptError:  # SCRIPT FLUSH, a restart, a failover: send the source once
            _send_pipelined(conn, pack, ("EVAL", script.source, 1, rkey, *args), wait)
            return _read_replies(conn, wait)
    except RedisError:
        raise  # every reply was read (or the connection already dropped): still in step
    except BaseException:
        conn.disconnect()  # interrupted between send and read: the reply would be misread
        raise


def _pipelined(held: _Held, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
    """``commands`` written at once; their raw replies in order, an error reply as its
    exception (as a redis-py pipeline with ``raise_on_error=False`` gives them)."""
    conn, pack = held.conn, held.pack
    try:
        if pack is not None:
            conn.send_packed_command([pack(c) for c in commands])
        else:
            conn.send_packed_command(conn.pack_commands(commands))
        answers: list[Any] = []
        for _ in commands:
            try:
                answers.append(conn.read_response(disable_decoding=True))
            except ResponseError as exc:
                answers.append(exc)
        return answers
    except RedisError:
        raise  # a connection error: redis-py dropped the connection, nothing half-read
    except BaseException:
        conn.disconnect()  # interrupted between send and read: the replies would be misread
        raise


def _send_pipelined(
    conn: Any,
    pack: Callable[[tuple[Any, ...]], bytes] | None,
    command: tuple[Any, ...],
    wait: tuple[Any, ...] | None,
) -> None:
    commands = (command,) if wait is None else (command, wait)
    if pack is not None:
        conn.send_packed_command([pack(c) for c in commands])
    else:
        conn.send_packed_command(conn.pack_commands(commands))


def _read_replies(conn: Any, wait: tuple[Any, ...] | None) -> tuple[Any, int | None]:
    """The script's reply, then ``WAIT``'s (read even when the script's is an error)."""
    if wait is None:
        return conn.read_response(disable_decoding=True), None
    try:
        reply = conn.read_response(disable_decoding=True)
    except ResponseError:
        conn.read_response()
        raise
    return reply, int(conn.read_response())
