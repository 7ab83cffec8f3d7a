"""The Redis store's clients: how they are built, retried, and what their errors mean.

- **Clients.** :class:`_Clients` holds the store's sync and async clients: given ones as
  they are, or built on first use by the factories behind
  :meth:`RedisIdempotencyStore.from_url` and :meth:`~RedisIdempotencyStore.from_sentinel`
  (:meth:`_Clients.on_url`, :meth:`_Clients.on_sentinel`).
  :func:`_client_options` sets explicit socket timeouts and a health-check interval
  (redis-py's own ``from_url`` sets neither), each checked by
  :func:`~langchain_idempotent.core._durations.to_seconds`.
- **Retries.** Connections the store builds make one attempt each (``_retry(0)``); the store
  retries whole operations with :func:`_retry` / :func:`_async_retry` (redis-py's ``Retry``,
  exponential backoff from 10 ms, at most 0.5 s, on connection errors and timeouts). A
  Cluster client keeps redis-py's retries inside, which re-learn the slot map after a
  failover. :func:`_resend_if_closed_under_a_write` works around a redis-py asyncio bug.
- **Errors.** :func:`_translate` is the one place where a redis-py error becomes
  :class:`~langchain_idempotent.errors.StoreUnavailableError` (or, for a record the scripts
  refused, :class:`~langchain_idempotent.errors.CorruptRecordError`).
- **Eviction.** :meth:`_Clients.check_eviction` reads the server's ``maxmemory-policy``
  once and :func:`_warn_if_evicting` warns for any policy that can evict a record.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any, TypeAlias, TypeVar

import redis
import redis.asyncio
import redis.asyncio.retry
import redis.asyncio.sentinel
import redis.sentinel
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from ...core._durations import to_seconds
from ...errors import CorruptRecordError, StoreUnavailableError
from ._fastpath import _HeldConnections

SyncClient: TypeAlias = "redis.Redis | redis.RedisCluster"
AsyncClient: TypeAlias = "redis.asyncio.Redis | redis.asyncio.RedisCluster"

#: Errors redis-py raises for an unreachable or unwilling server (cluster set-up errors
#: are plain ``Exception`` subclasses in redis-py).
_BACKEND_ERRORS = (RedisError, RedisClusterException)
_CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}

_log = logging.getLogger("langchain_idempotent.stores.redis")
_T = TypeVar("_T")


# -- clients -----------------------------------------------------------------------------


def _client_options(
    socket_timeout: float | timedelta,
    socket_connect_timeout: float | timedelta,
    health_check_interval: float | timedelta,
    max_connections: int | None,
    extra: Mapping[str, Any],
) -> dict[str, Any]:
    """redis-py keyword arguments. Socket timeouts must be positive and finite (``0`` would
    make the socket non-blocking, a negative one fails on connect); a health-check interval
    of ``0`` turns the checks off."""
    options: dict[str, Any] = {
        "socket_timeout": to_seconds(socket_timeout, "socket_timeout"),
        "socket_connect_timeout": to_seconds(socket_connect_timeout, "socket_connect_timeout"),
        "health_check_interval": to_seconds(
            health_check_interval, "health_check_interval", allow_zero=True, allow_inf=True
        ),
    }
    if max_connections is not None:
        options["max_connections"] = max_connections
    options.update(extra)
    return options


#: The schemes redis-py reads as they are (the cluster ones are rewritten to these).
_PLAIN_SCHEMES = ("redis", "rediss", "unix")


def _cluster_url(url: str, cluster: bool | None) -> tuple[str, bool | None]:
    """``redis+cluster://`` / ``rediss+cluster://`` as the plain URL redis-py reads, and
    whether it names a Cluster (``cluster`` as passed for any other scheme)."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in (*_CLUSTER_SCHEMES, *_PLAIN_SCHEMES):
        hint = (
            " (a PostgreSQL URL: use PostgresIdempotencyStore.from_url, or store_from_url for "
            "any store URL)"
            if scheme.lower() in ("postgresql", "postgres")
            else " (use store_from_url for any store URL)"
        )
        raise ValueError(
            f"not a Redis URL (scheme {scheme + sep if sep else 'missing'}): "
            "RedisIdempotencyStore.from_url takes redis://, rediss://, unix://, "
            f"redis+cluster:// or rediss+cluster://{hint}"
        )
    if scheme.lower() not in _CLUSTER_SCHEMES:
        return url, cluster
    if cluster is False:
        raise ValueError(f"{scheme}:// is a cluster URL but cluster=False was passed")
    return f"{_CLUSTER_SCHEMES[scheme.lower()]}://{rest}", True


class _Clients:
    """The clients a store talks through, and how it retries on them.

    Clients passed in are used as they are (their timeouts and retries apply) and never
    closed. Clients the store builds (:meth:`on_url`, :meth:`on_sentinel`) are made on
    first use, the async one once per event loop; their connections make one attempt each,
    and :meth:`retrying` / :meth:`aretrying` retry whole operations (``attempts``). The sync
    client's fast path (``fast``, :mod:`._fastpath`) is set up on first use.
    """

    def __init__(
        self,
        *,
        sync_client: SyncClient | None = None,
        async_client: AsyncClient | None = None,
        sync_factory: Callable[[], SyncClient] | None = None,
        async_factory: Callable[[], AsyncClient] | None = None,
        retries: int | None = None,
    ) -> None:
        self._sync_client = sync_client
        self._async_client = async_client
        self._sync_factory = sync_factory
        self._async_factory = async_factory
        self._async_by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncClient]
        self._async_by_loop = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self._sync_ready = False
        self.fast: _HeldConnections | None = None
        self.eviction_checked = False
        self.attempts = None if retries is None else _retry(retries)
        self.aattempts = None if retries is None else _async_retry(retries)

    @classmethod
    def on_url(
        cls, url: str, *, cluster: bool, options: Mapping[str, Any], retries: int
    ) -> _Clients:
        """Clients on ``url``. A Cluster client retries inside (it must re-learn the slot
        map after a failover); otherwise each connection makes one attempt and the store
        retries whole operations."""
        per_connection = retries if cluster else 0

        def sync_factory() -> SyncClient:
            kw = {**options, "retry": _retry(per_connection)}
            if cluster:
                return redis.RedisCluster.from_url(url, **kw)
            return redis.Redis.from_url(url, **kw)

        def async_factory() -> AsyncClient:
            kw = {**options, "retry": _async_retry(per_connection)}
            if cluster:
                return redis.asyncio.RedisCluster.from_url(url, **kw)
            return redis.asyncio.Redis.from_url(url, **kw)

        return cls(
            sync_factory=sync_factory,
            async_factory=async_factory,
            retries=None if cluster else retries,
        )

    @classmethod
    def on_sentinel(
        cls,
        sentinels: Sequence[tuple[str, int]],
        service_name: str,
        *,
        options: Mapping[str, Any],
        sentinel_kwargs: Mapping[str, Any] | None,
        retries: int,
    ) -> _Clients:
        """Clients on the master ``sentinels`` name ``service_name``; the connections to the
        sentinels get the same socket timeouts unless ``sentinel_kwargs`` say otherwise."""
        addresses = [tuple(a) for a in sentinels]
        to_sentinels = {
            "socket_timeout": options["socket_timeout"],
            "socket_connect_timeout": options["socket_connect_timeout"],
            **(sentinel_kwargs or {}),
        }

        def sync_factory() -> SyncClient:
            manager: Any = redis.sentinel.Sentinel
            client: redis.Redis = manager(addresses, sentinel_kwargs=dict(to_sentinels)).master_for(
                service_name, retry=_retry(0), **options
            )
            return client

        def async_factory() -> AsyncClient:
            manager: Any = redis.asyncio.sentinel.Sentinel
            client: redis.asyncio.Redis = manager(
                addresses, sentinel_kwargs=dict(to_sentinels)
            ).master_for(service_name, retry=_async_retry(0), **options)
            return client

        return cls(sync_factory=sync_factory, async_factory=async_factory, retries=retries)

    def sync(self) -> Any:  # SyncClient; redis-py's methods are untyped
        client = self._sync_client
        if client is not None and self._sync_ready:
            return client
        with self._lock:
            if self._sync_client is None:
                if self._sync_factory is None:
                    raise TypeError(
                        "this RedisIdempotencyStore has only an async client: pass "
                        "client=redis.Redis(...) (or redis.RedisCluster) as well, use the "
                        "a-prefixed async methods, or build it with from_url()"
                    )
                self._sync_client = self._sync_factory()
            client = self._sync_client
            if not self._sync_ready:
                self.fast = _HeldConnections.for_client(client)
                self._sync_ready = True
        return client

    def async_(self) -> Any:  # AsyncClient
        if self._async_client is not None:
            return self._async_client
        if self._async_factory is None:
            raise TypeError(
                "this RedisIdempotencyStore has only a sync client: pass "
                "async_client=redis.asyncio.Redis(...) (or redis.asyncio.RedisCluster) as "
                "well, use the sync methods, or build it with from_url()"
            )
        loop = asyncio.get_running_loop()
        client = self._async_by_loop.get(loop)
        if client is None:
            client = self._async_by_loop[loop] = self._async_factory()
        return client

    def retrying(self, op: Callable[[], _T]) -> _T:
        """``op`` under the store's whole-operation retry (clients the store built)."""
        attempts = self.attempts
        return op() if attempts is None else attempts.call_with_retry(op, _ignore)

    async def aretrying(self, op: Callable[[], Awaitable[_T]]) -> _T:
        """:meth:`retrying` for the async face, which also resends once at once when
        redis-py's asyncio connection broke under a write (redis/redis-py#3546)."""

        def guarded() -> Awaitable[_T]:
            return _resend_if_closed_under_a_write(op)

        attempts = self.aattempts
        return await (
            guarded() if attempts is None else attempts.call_with_retry(guarded, _aignore)
        )

    def call(self, key: str | None, op: Callable[[], _T]) -> _T:
        """``op`` under :meth:`retrying`, a redis-py error translated in the one place
        (:func:`_translate`, naming ``key``)."""
        try:
            return self.retrying(op)
        except _BACKEND_ERRORS as exc:
            raise _translate(exc, key) from exc

    async def acall(self, key: str | None, op: Callable[[], Awaitable[_T]]) -> _T:
        """:meth:`call` for the async face (under :meth:`aretrying`)."""
        try:
            return await self.aretrying(op)
        except _BACKEND_ERRORS as exc:
            raise _translate(exc, key) from exc

    def check_eviction(self) -> None:
        """Ask the server's ``maxmemory-policy`` once (see :func:`_warn_if_evicting`)."""
        self.eviction_checked = True
        try:
            reply = self.sync().execute_command("CONFIG", "GET", "maxmemory-policy")
        except _BACKEND_ERRORS as exc:  # NOPERM, CONFIG renamed away, a managed service
            _log.debug("could not read maxmemory-policy: %s", exc)
            return
        _warn_if_evicting(reply)

    async def acheck_eviction(self, client: Any) -> None:
        self.eviction_checked = True
        try:
            reply = await client.execute_command("CONFIG", "GET", "maxmemory-policy")
        except _BACKEND_ERRORS as exc:
            _log.debug("could not read maxmemory-policy: %s", exc)
            return
        _warn_if_evicting(reply)

    def close(self) -> None:
        """Return the held connections; close the sync client if the store built it."""
        with self._lock:
            fast, self.fast = self.fast, None
            self._sync_ready = False
            built = self._sync_client if self._sync_factory is not None else None
            if built is not None:
                self._sync_client = None
        if fast is not None:
            fast.close()
        if built is not None:
            built.close()

    async def aclose(self) -> None:
        """:meth:`close`, plus the async client the store built for the running loop."""
        self.close()
        if self._async_factory is None:
            return
        client = self._async_by_loop.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()


# -- retries -----------------------------------------------------------------------------


def _check_retries(retries: int) -> None:
    # redis-py reads a negative count as "retry forever": a hung server would hang callers.
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"retries must be an int >= 0, got {retries!r}")


def _backoff() -> ExponentialBackoff:
    return ExponentialBackoff(cap=0.5, base=0.01)


def _retry(retries: int) -> Retry:
    _check_retries(retries)
    return Retry(_backoff(), retries, supported_errors=(RedisConnectionError, RedisTimeoutError))


def _async_retry(retries: int) -> redis.asyncio.retry.Retry:
    _check_retries(retries)
    return redis.asyncio.retry.Retry(
        _backoff(), retries, supported_errors=(RedisConnectionError, RedisTimeoutError)
    )


def _ignore(_error: Exception) -> None:
    """Failure callback of the store's retries: the connection already cleaned up."""


async def _aignore(_error: Exception) -> None:
    """:func:`_ignore` for redis-py's async ``Retry``, which awaits its failure callback."""


async def _resend_if_closed_under_a_write(op: Callable[[], Awaitable[_T]]) -> _T:
    """``op``, once more at once if redis-py's asyncio connection was closed under its write
    (see :func:`_closed_under_a_write`), on any client (Cluster too) and whatever the store's
    ``retries``: a stale pooled connection is not the server being down, and a resent
    claim or completion is recognised as the same owner's. A second such failure is a
    ``ConnectionError``, which the store's retries and error translation understand."""
    try:
        return await op()
    except (AttributeError, TypeError, RedisConnectionError) as exc:
        if not _closed_under_a_write(exc):
            raise
    try:
        return await op()
    except (AttributeError, TypeError) as exc:
        if _closed_under_a_write(exc):
            raise RedisConnectionError(f"the connection was closed under a write ({exc})") from exc
        raise


#: How redis-py >= 8.2 reports a write on a connection closed under it (redis/redis-py#4288).
_CLOSED_UNDER_A_WRITE = (
    "Connection closed by the server before write",
    "Connection closed by the server while writing",
)


def _closed_under_a_write(exc: BaseException) -> bool:
    """Whether ``exc`` is a connection closed while a command was written. redis-py >= 8.2
    says so with a ``ConnectionError`` (:data:`_CLOSED_UNDER_A_WRITE`); earlier releases leak
    the transport's internals — ``'NoneType' object has no attribute 'writelines'``,
    ``'NoneType' object is not callable`` (redis/redis-py#3546, #4287): an error raised
    inside redis-py's or asyncio's own I/O code, not ours."""
    if isinstance(exc, RedisConnectionError):
        return str(exc).startswith(_CLOSED_UNDER_A_WRITE)
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return False
    where = tb.tb_frame.f_code.co_filename.replace("\\", "/")
    return "/redis/asyncio/" in where or where.endswith(
        ("/asyncio/streams.py", "/asyncio/selector_events.py", "/asyncio/proactor_events.py")
    )


# -- errors ------------------------------------------------------------------------------


def _translate(exc: Exception, key: str | None) -> StoreUnavailableError | CorruptRecordError:
    message = str(exc)
    if isinstance(exc, ResponseError) and message.startswith(("CORRUPT", "WRONGTYPE")):
        return CorruptRecordError(
            f"the Redis record for idempotency key {key!r} is not a record this store can "
            f"read ({message}); it was not used. Inspect it, then delete it to start over "
            f"(`langchain-idempotent delete {key}`).",
            key=key,
        )
    return StoreUnavailableError(
        f"Redis idempotency store unavailable ({type(exc).__name__}: {message})", key=key
    )


# -- eviction ----------------------------------------------------------------------------


def _warn_if_evicting(reply: Any) -> None:
    """Log a warning if a ``CONFIG GET maxmemory-policy`` reply names any policy but
    ``noeviction``."""
    for policy in _strings(reply):
        if policy != "noeviction" and policy != "maxmemory-policy":
            _log.warning(
                "Redis maxmemory-policy is %s: under memory pressure the server can evict "
                "idempotency records (live leases and stored results; every record carries a "
                "TTL, so volatile-* policies can evict them too), and an evicted record lets a "
                "tool run again. Use noeviction, or size maxmemory so eviction never happens.",
                policy,
            )
            return


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, bytes):
        yield value.decode(errors="replace")
    elif isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)
