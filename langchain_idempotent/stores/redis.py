"""``RedisIdempotencyStore``: many hosts, one Redis (standalone, Sentinel or Cluster).

Spec:

- **Record.** One HASH per key at ``{prefix}{<key>}`` — the braces are a Cluster hash
  tag, so the record and its wake-up channel ``{prefix}{<key>}:done`` share one slot.
  Fields: ``version state owner fence lease_until fingerprint attempt payload created_at
  updated_at`` (one per :class:`~langchain_idempotent.record.Record` field; integers in
  decimal, ``payload`` raw bytes, only on completed / failed records) and ``m:<name>`` for
  each ``meta`` entry. Nothing is JSON or pickle: the store hands ``payload`` back as bytes
  and never decodes it.
- **Protocol.** Each operation is **one Lua script, one round trip** (``EVALSHA``; on
  ``NOSCRIPT`` the script is sent once with ``EVAL``, which also caches it). The scripts
  below implement the decision table of :mod:`langchain_idempotent.protocol` exactly; each
  is headed by comments naming its ``KEYS``, ``ARGV`` and reply. Every write is inside a
  script after an owner-token and fence compare: there is no unconditional ``SET`` or
  ``DEL``, except :meth:`~RedisIdempotencyStore.delete`, an operator action that removes a
  record whoever holds it. Fences strictly increase per key for as long as the record
  exists: release sets ``state=free`` and keeps the fence.
- **Time.** Lease deadlines and ``retry_after_ms`` come from ``redis.call('TIME')`` on the
  server holding the record, never from a client clock.
- **Retention.** A claim sets ``PEXPIRE max(ttl, lease)``, a completion ``PEXPIRE ttl``, a
  renewal raises the expiry to at least ``lease`` from now, a release leaves it alone.
- **Wake-ups.** A completion, a release and a delete ``PUBLISH`` on the record's channel.
  :meth:`~RedisIdempotencyStore.watch` subscribes *first* (and waits for Redis to confirm),
  then checks the record, and returns at once if it is no longer RUNNING at the waiter's
  fence or its lease has passed; otherwise it waits for a message, at most until the
  timeout or the lease deadline, whichever is sooner. One pub/sub connection per waiter,
  closed afterwards.
- **Errors.** Every redis-py error (connection refused or reset, socket timeout after the
  configured retries, ``LOADING``, ``CLUSTERDOWN``, ``TRYAGAIN``, ``READONLY``, ``OOM``,
  ``NOPERM``, ...) becomes :class:`~langchain_idempotent.errors.StoreUnavailableError` with
  the key, chained with ``raise ... from``, at one boundary. A record that is not a well-
  formed hash of this format version (wrong type, missing or garbled fields, unknown
  version) raises :class:`~langchain_idempotent.errors.CorruptRecordError`; the scripts
  refuse it with a ``CORRUPT`` error reply before deciding anything. ``list`` skips such
  records with a warning; ``delete`` removes them.
- **Connections.** Constructing a store never connects. :meth:`RedisIdempotencyStore.from_url`
  and :meth:`~RedisIdempotencyStore.from_sentinel` build a sync and an async client lazily
  with explicit socket timeouts, a ``Retry(ExponentialBackoff)`` on connection errors and
  timeouts, and a health-check interval (redis-py's own ``from_url`` sets none of these).
  A refused connection fails within milliseconds, a hung server after about
  ``(retries + 1) * socket_timeout``, a host that drops packets after at most
  ``(retries + 1) ** 2 * socket_connect_timeout`` (redis-py retries inside ``connect`` as
  well). The async client is built once per event loop.
  Clients passed in are used as they are (their timeouts and retries apply) and are never
  closed by the store.
- **Fast path.** With a sync standalone or Sentinel ``redis.Redis`` (not a single-connection
  client), each thread keeps one connection checked out of the client's own pool and sends
  ``EVALSHA`` on it directly (packed by hiredis, then ``read_response``), skipping
  redis-py's per-command bookkeeping; the connection's own ``Retry``, timeouts, TLS and
  health checks still apply. An interrupted round trip (``KeyboardInterrupt`` between send
  and read) drops the connection so that no later call reads its reply. After ``fork()``
  the child checks out its own connection; a thread's connection returns to the pool when
  the thread ends or the store is closed. Cluster and async clients go through
  ``execute_command``.
- **Eviction.** On the first successful operation the store asks ``CONFIG GET
  maxmemory-policy`` once and logs a warning on ``langchain_idempotent.stores.redis`` for
  any policy but ``noeviction``: ``allkeys-*`` can evict any record, and ``volatile-*``
  can too, because every record carries a TTL. Servers that refuse ``CONFIG`` are not
  asked again.
- **Durability.** What Redis persists is what survives: without AOF (``appendfsync``) and
  replication acknowledgement, a restart or failover can lose recent records, and the tool
  can run again (with the same key handed downstream).
"""

from __future__ import annotations

import asyncio
import builtins
import codecs
import copy
import hashlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeAlias

import redis
import redis.asyncio
import redis.asyncio.retry
import redis.asyncio.sentinel
import redis.sentinel
from redis.backoff import ExponentialBackoff
from redis.client import NEVER_DECODE
from redis.connection import ConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisClusterException, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from ..errors import CorruptRecordError, StoreUnavailableError
from ..record import FORMAT_VERSION, Claim, ClaimOutcome, Completion, ExpiredPolicy, Record, State
from .base import BaseIdempotencyStore

__all__ = ["RedisIdempotencyStore"]

_log = logging.getLogger("langchain_idempotent.stores.redis")

_hiredis_pack: Callable[[tuple[Any, ...]], bytes] | None
try:
    import hiredis

    _hiredis_pack = hiredis.pack_command
except ImportError:  # pragma: no cover - redis[hiredis] is a dependency
    _hiredis_pack = None

SyncClient: TypeAlias = "redis.Redis | redis.RedisCluster"
AsyncClient: TypeAlias = "redis.asyncio.Redis | redis.asyncio.RedisCluster"

#: Errors redis-py raises for an unreachable or unwilling server (cluster set-up errors
#: are plain ``Exception`` subclasses in redis-py).
_BACKEND_ERRORS = (RedisError, RedisClusterException)
#: Ask redis-py for raw bytes whatever the client's ``decode_responses``.
_RAW: dict[str, Any] = {NEVER_DECODE: True}
_VERSION = str(FORMAT_VERSION)
_STATES = {s.value.encode(): s for s in State}
_OUTCOMES = {o.value.encode(): o for o in ClaimOutcome}
_CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


# -- Lua ---------------------------------------------------------------------------------

_PRELUDE = """
-- Shared by every script.
-- now_ms(): the server clock in milliseconds, never a client's.
-- load(key, version): the record as a table, or nil when the key is absent, or
--   nil plus a reason when the key holds something that is not a record of this format.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function int(s)
  if s and string.match(s, '^%-?%d+$') then return tonumber(s) end
  return nil
end

local function load(key, version)
  local f = redis.pcall('HMGET', key, 'version', 'state', 'owner', 'fence', 'lease_until',
                        'fingerprint', 'attempt', 'payload')
  if f.err then return nil, 'not a hash' end
  if not f[2] then
    if redis.call('EXISTS', key) == 1 then return nil, 'no state field' end
    return nil
  end
  if f[1] ~= version then return nil, 'unknown format version' end
  local state = f[2]
  local done = state == 'completed' or state == 'failed'
  if not (done or state == 'running' or state == 'free') then return nil, 'unknown state' end
  local rec = {state = state, done = done, owner = f[3], fence = int(f[4]), lease_until = int(f[5]),
               fingerprint = f[6], attempt = int(f[7]), payload = f[8]}
  if not (rec.owner and rec.fence and rec.lease_until and rec.fingerprint and rec.attempt) then
    return nil, 'missing or malformed fields'
  end
  if done and not rec.payload then return nil, 'result without payload' end
  return rec
end
"""

_CLAIM = """
-- claim: replay, acquire, take over, or report busy / mismatch / expired, atomically
-- (protocol.decide_claim).
-- KEYS[1]   the record hash
-- ARGV[1]   owner token           ARGV[2] fingerprint of the arguments
-- ARGV[3]   lease in ms           ARGV[4] retention (ttl) in ms
-- ARGV[5]   'takeover' or 'report': what to do with an expired lease
-- ARGV[6]   format version
-- ARGV[7..] meta as name, value pairs (stored as m:<name> when the record is created)
-- Returns {outcome, fence, attempt, retry_after_ms, failed (0/1), payload (replay only)};
-- a 'CORRUPT ...' error when the key holds something else.
local key = KEYS[1]
local rec, bad = load(key, ARGV[6])
if bad then return redis.error_reply('CORRUPT ' .. bad) end
if rec and rec.fingerprint ~= ARGV[2] then
  return {'mismatch', rec.fence, rec.attempt, 0, 0}
end
if rec and rec.done then  -- the fast path: one HMGET, no clock, no write
  return {'replay', rec.fence, rec.attempt, 0, rec.state == 'failed' and 1 or 0, rec.payload}
end
local now = now_ms()
local lease = tonumber(ARGV[3])
local expire = math.max(tonumber(ARGV[4]), lease)

if not rec then
  local fields = {'version', ARGV[6], 'state', 'running', 'owner', ARGV[1], 'fence', 1,
                  'lease_until', now + lease, 'fingerprint', ARGV[2], 'attempt', 1,
                  'created_at', now, 'updated_at', now}
  for i = 7, #ARGV, 2 do
    fields[#fields + 1] = 'm:' .. ARGV[i]
    fields[#fields + 1] = ARGV[i + 1]
  end
  redis.call('HSET', key, unpack(fields))
  redis.call('PEXPIRE', key, expire)
  return {'acquired', 1, 1, 0, 0}
end

local function take(outcome)
  local fence, attempt = rec.fence + 1, rec.attempt + 1
  redis.call('HSET', key, 'state', 'running', 'owner', ARGV[1], 'fence', fence,
             'attempt', attempt, 'lease_until', now + lease, 'updated_at', now)
  redis.call('PEXPIRE', key, expire)
  return {outcome, fence, attempt, 0, 0}
end

if rec.state == 'free' then return take('acquired') end
-- running
if rec.owner == ARGV[1] then
  redis.call('HSET', key, 'lease_until', now + lease, 'updated_at', now)
  redis.call('PEXPIRE', key, expire)
  return {'owned', rec.fence, rec.attempt, 0, 0}
end
if rec.lease_until > now then
  return {'busy', rec.fence, rec.attempt, rec.lease_until - now, 0}
end
if ARGV[5] == 'report' then return {'expired', rec.fence, rec.attempt, 0, 0} end
return take('takeover')
"""

_RENEW = """
-- renew: extend the lease while the caller still owns it (protocol.decide_renew).
-- KEYS[1]  the record hash
-- ARGV[1]  owner token   ARGV[2] fence   ARGV[3] lease in ms   ARGV[4] format version
-- Returns 1 when extended, 0 when the caller no longer owns the lease.
local key = KEYS[1]
local rec, bad = load(key, ARGV[4])
if bad then return redis.error_reply('CORRUPT ' .. bad) end
if not rec or rec.state ~= 'running' or rec.owner ~= ARGV[1]
   or rec.fence ~= tonumber(ARGV[2]) then
  return 0
end
local now, lease = now_ms(), tonumber(ARGV[3])
redis.call('HSET', key, 'lease_until', now + lease, 'updated_at', now)
if redis.call('PTTL', key) < lease then redis.call('PEXPIRE', key, lease) end
return 1
"""

_COMPLETE = """
-- complete: store the first result, write-once (protocol.decide_complete), and wake waiters.
-- KEYS[1]   the record hash (channel KEYS[1]..':done' is published on)
-- ARGV[1]   owner token        ARGV[2] fence        ARGV[3] fingerprint
-- ARGV[4]   payload bytes      ARGV[5] 1 if the payload is a terminal failure, else 0
-- ARGV[6]   retention (ttl) in ms                    ARGV[7] format version
-- ARGV[8..] meta as name, value pairs (used only if the record has vanished)
-- Returns {stored (0/1), stale (0/1), failed (0/1), stored payload (only when not stored)}.
local key = KEYS[1]
local rec, bad = load(key, ARGV[7])
if bad then return redis.error_reply('CORRUPT ' .. bad) end
local fence = tonumber(ARGV[2])
if rec and rec.done then
  local stale = (rec.owner == ARGV[1] and rec.fence == fence) and 0 or 1
  return {0, stale, rec.state == 'failed' and 1 or 0, rec.payload}
end
local now = now_ms()
local state = ARGV[5] == '1' and 'failed' or 'completed'
local stale = 1
if not rec then
  -- expired or evicted while the tool ran: this result is the only one
  local fields = {'version', ARGV[7], 'state', state, 'owner', ARGV[1], 'fence', fence,
                  'lease_until', 0, 'fingerprint', ARGV[3], 'attempt', 1, 'payload', ARGV[4],
                  'created_at', now, 'updated_at', now}
  for i = 8, #ARGV, 2 do
    fields[#fields + 1] = 'm:' .. ARGV[i]
    fields[#fields + 1] = ARGV[i + 1]
  end
  redis.call('HSET', key, unpack(fields))
else
  if rec.state == 'running' and rec.owner == ARGV[1] and rec.fence == fence then stale = 0 end
  redis.call('HSET', key, 'state', state, 'owner', ARGV[1],
             'fence', math.max(rec.fence, fence), 'lease_until', 0, 'payload', ARGV[4],
             'updated_at', now)
end
redis.call('PEXPIRE', key, tonumber(ARGV[6]))
redis.call('PUBLISH', key .. ':done', state)
return {1, stale, ARGV[5] == '1' and 1 or 0}
"""

_RELEASE = """
-- release: back to free after a retryable error, only for the current owner and fence
-- (protocol.decide_release); the fence is kept so that fences keep increasing.
-- KEYS[1]  the record hash (channel KEYS[1]..':done' is published on)
-- ARGV[1]  owner token   ARGV[2] fence   ARGV[3] format version
-- Returns 1 when released, 0 when the caller was not the owner.
local key = KEYS[1]
local rec, bad = load(key, ARGV[3])
if bad then return redis.error_reply('CORRUPT ' .. bad) end
if not rec or rec.state ~= 'running' or rec.owner ~= ARGV[1]
   or rec.fence ~= tonumber(ARGV[2]) then
  return 0
end
redis.call('HSET', key, 'state', 'free', 'owner', '', 'lease_until', 0, 'updated_at', now_ms())
redis.call('PUBLISH', key .. ':done', 'free')
return 1
"""

_PROBE = """
-- probe (for watch): is the record still RUNNING at the waiter's fence with a live lease?
-- KEYS[1]  the record hash
-- ARGV[1]  the fence the waiter saw
-- Returns the milliseconds left on that lease, or -1 when the waiter should stop waiting.
local f = redis.pcall('HMGET', KEYS[1], 'state', 'fence', 'lease_until')
if f.err or f[1] ~= 'running' or int(f[2]) ~= tonumber(ARGV[1]) or not int(f[3]) then
  return -1
end
local left = int(f[3]) - now_ms()
if left <= 0 then return -1 end
return left
"""

_DELETE = """
-- delete (operator action): remove the record whoever holds it, and wake waiters.
-- KEYS[1]  the record hash
-- Returns 1 when a record was removed, else 0.
local n = redis.call('DEL', KEYS[1])
if n == 1 then redis.call('PUBLISH', KEYS[1] .. ':done', 'deleted') end
return n
"""


@dataclass(frozen=True, slots=True)
class _Script:
    source: str
    sha: str

    @classmethod
    def of(cls, body: str) -> _Script:
        source = _PRELUDE + body
        return cls(source, hashlib.sha1(source.encode()).hexdigest())


_CLAIM_SCRIPT = _Script.of(_CLAIM)
_RENEW_SCRIPT = _Script.of(_RENEW)
_COMPLETE_SCRIPT = _Script.of(_COMPLETE)
_RELEASE_SCRIPT = _Script.of(_RELEASE)
_PROBE_SCRIPT = _Script.of(_PROBE)
_DELETE_SCRIPT = _Script.of(_DELETE)


# -- the store ---------------------------------------------------------------------------


class RedisIdempotencyStore(BaseIdempotencyStore):
    """Records in Redis. See the module docstring for the full contract.

    Pass a sync ``client`` (``redis.Redis``, ``redis.RedisCluster``, or a Sentinel
    ``master_for`` client), an ``async_client`` (their ``redis.asyncio`` twins), or both;
    or build both lazily with :meth:`from_url` / :meth:`from_sentinel`. A store given only
    one of them raises :class:`TypeError` on the other path. ``prefix`` starts every key
    this store writes (no braces: they would change the Cluster hash tag).
    """

    def __init__(
        self,
        client: SyncClient | None = None,
        *,
        async_client: AsyncClient | None = None,
        prefix: str = "idem:",
    ) -> None:
        if client is None and async_client is None:
            raise TypeError(
                "RedisIdempotencyStore needs client=redis.Redis(...) and/or "
                "async_client=redis.asyncio.Redis(...); or use "
                "RedisIdempotencyStore.from_url(url)"
            )
        self._setup(prefix, sync_client=client, async_client=async_client)

    def _setup(
        self,
        prefix: str,
        *,
        sync_client: SyncClient | None = None,
        async_client: AsyncClient | None = None,
        sync_factory: Callable[[], SyncClient] | None = None,
        async_factory: Callable[[], AsyncClient] | None = None,
    ) -> None:
        if "{" in prefix or "}" in prefix:
            raise ValueError(f"prefix must not contain braces (Cluster hash tags): {prefix!r}")
        self._prefix = prefix
        self._head = prefix + "{"
        self._sync_client = sync_client
        self._async_client = async_client
        self._sync_factory = sync_factory
        self._async_factory = async_factory
        self._async_by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncClient]
        self._async_by_loop = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self._fast: _ConnectionPerThread | None = None
        self._sync_ready = False
        self._policy_checked = False

    # -- construction -------------------------------------------------------------------

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        prefix: str = "idem:",
        cluster: bool | None = None,
        socket_timeout: float | timedelta = 5.0,
        socket_connect_timeout: float | timedelta = 2.0,
        retries: int = 3,
        health_check_interval: float | timedelta = 30,
        max_connections: int | None = None,
        **client_kwargs: Any,
    ) -> RedisIdempotencyStore:
        """A store on ``url``, with a sync and an async client built on first use.

        Schemes: ``redis://``, ``rediss://`` (TLS), ``unix://``, and ``redis+cluster://`` /
        ``rediss+cluster://`` for a Redis Cluster (or pass ``cluster=True`` with a plain
        scheme; the URL names any one node). ``socket_timeout`` bounds every read,
        ``socket_connect_timeout`` every connect; connection errors and timeouts are
        retried ``retries`` times with exponential backoff (20 ms doubling, at most
        0.5 s) before :class:`~langchain_idempotent.errors.StoreUnavailableError`.
        ``client_kwargs`` go to redis-py (``password``, ``ssl_ca_certs``, ...).
        """
        scheme, sep, rest = url.partition("://")
        if sep and scheme.lower() in _CLUSTER_SCHEMES:
            url = f"{_CLUSTER_SCHEMES[scheme.lower()]}://{rest}"
            if cluster is False:
                raise ValueError(f"{scheme}:// is a cluster URL but cluster=False was passed")
            cluster = True
        options = _client_options(
            socket_timeout,
            socket_connect_timeout,
            health_check_interval,
            max_connections,
            client_kwargs,
        )

        def sync_factory() -> SyncClient:
            kw = {**options, "retry": _retry(retries)}
            if cluster:
                return redis.RedisCluster.from_url(url, **kw)
            return redis.Redis.from_url(url, **kw)

        def async_factory() -> AsyncClient:
            kw = {**options, "retry": _async_retry(retries)}
            if cluster:
                return redis.asyncio.RedisCluster.from_url(url, **kw)
            return redis.asyncio.Redis.from_url(url, **kw)

        store = cls.__new__(cls)
        store._setup(prefix, sync_factory=sync_factory, async_factory=async_factory)
        return store

    @classmethod
    def from_sentinel(
        cls,
        sentinels: Sequence[tuple[str, int]],
        service_name: str,
        *,
        prefix: str = "idem:",
        socket_timeout: float | timedelta = 5.0,
        socket_connect_timeout: float | timedelta = 2.0,
        retries: int = 3,
        health_check_interval: float | timedelta = 30,
        max_connections: int | None = None,
        sentinel_kwargs: Mapping[str, Any] | None = None,
        **client_kwargs: Any,
    ) -> RedisIdempotencyStore:
        """A store on the master that ``sentinels`` name ``service_name``, built on first use.

        Follows failovers (redis-py's ``SentinelConnectionPool``). Timeouts and retries as
        in :meth:`from_url`; ``sentinel_kwargs`` configure the connections to the sentinels
        themselves (default: the same socket timeouts).
        """
        addresses = [tuple(a) for a in sentinels]
        options = _client_options(
            socket_timeout,
            socket_connect_timeout,
            health_check_interval,
            max_connections,
            client_kwargs,
        )
        to_sentinels = {
            "socket_timeout": options["socket_timeout"],
            "socket_connect_timeout": options["socket_connect_timeout"],
            **(sentinel_kwargs or {}),
        }

        def sync_factory() -> SyncClient:
            manager: Any = redis.sentinel.Sentinel
            client: redis.Redis = manager(addresses, sentinel_kwargs=dict(to_sentinels)).master_for(
                service_name, retry=_retry(retries), **options
            )
            return client

        def async_factory() -> AsyncClient:
            manager: Any = redis.asyncio.sentinel.Sentinel
            client: redis.asyncio.Redis = manager(
                addresses, sentinel_kwargs=dict(to_sentinels)
            ).master_for(service_name, retry=_async_retry(retries), **options)
            return client

        store = cls.__new__(cls)
        store._setup(prefix, sync_factory=sync_factory, async_factory=async_factory)
        return store

    @property
    def prefix(self) -> str:
        return self._prefix

    # -- clients ------------------------------------------------------------------------

    def _sync(self) -> Any:  # SyncClient; redis-py's methods are untyped
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
                self._fast = _ConnectionPerThread.for_client(client)
                self._sync_ready = True
        return client

    def _async(self) -> Any:  # AsyncClient
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

    def _rkey(self, key: str) -> str:
        return f"{self._head}{key}}}"

    # -- one round trip -----------------------------------------------------------------

    def _eval(self, script: _Script, key: str, args: Sequence[Any]) -> Any:
        rkey = f"{self._head}{key}}}"
        try:
            client: Any = self._sync_client if self._sync_ready else self._sync()
            fast = self._fast
            if fast is not None:
                reply = fast.evalsha(script, rkey, args)
            else:
                assert client is not None
                try:
                    reply = client.execute_command("EVALSHA", script.sha, 1, rkey, *args, **_RAW)
                except NoScriptError:
                    reply = client.execute_command("EVAL", script.source, 1, rkey, *args, **_RAW)
        except _BACKEND_ERRORS as exc:
            raise _translate(exc, key) from exc
        if not self._policy_checked:
            self._check_policy()
        return reply

    async def _aeval(self, script: _Script, key: str, args: Sequence[Any]) -> Any:
        rkey = f"{self._head}{key}}}"
        client = self._async()
        try:
            try:
                reply = await client.execute_command("EVALSHA", script.sha, 1, rkey, *args, **_RAW)
            except NoScriptError:
                reply = await client.execute_command("EVAL", script.source, 1, rkey, *args, **_RAW)
        except _BACKEND_ERRORS as exc:
            raise _translate(exc, key) from exc
        if not self._policy_checked:
            await self._acheck_policy(client)
        return reply

    # -- record operations --------------------------------------------------------------

    def claim(
        self,
        key: str,
        *,
        owner: str,
        fingerprint: str,
        lease_ms: int,
        ttl_ms: int,
        on_expired: ExpiredPolicy = "takeover",
        meta: Mapping[str, str] | None = None,
    ) -> Claim:
        args = _claim_args(owner, fingerprint, lease_ms, ttl_ms, on_expired, meta)
        return _to_claim(self._eval(_CLAIM_SCRIPT, key, args), key)

    async def aclaim(
        self,
        key: str,
        *,
        owner: str,
        fingerprint: str,
        lease_ms: int,
        ttl_ms: int,
        on_expired: ExpiredPolicy = "takeover",
        meta: Mapping[str, str] | None = None,
    ) -> Claim:
        args = _claim_args(owner, fingerprint, lease_ms, ttl_ms, on_expired, meta)
        return _to_claim(await self._aeval(_CLAIM_SCRIPT, key, args), key)

    def renew(self, key: str, *, owner: str, fence: int, lease_ms: int) -> bool:
        return bool(self._eval(_RENEW_SCRIPT, key, (owner, fence, lease_ms, _VERSION)))

    async def arenew(self, key: str, *, owner: str, fence: int, lease_ms: int) -> bool:
        return bool(await self._aeval(_RENEW_SCRIPT, key, (owner, fence, lease_ms, _VERSION)))

    def complete(
        self,
        key: str,
        *,
        owner: str,
        fence: int,
        fingerprint: str,
        payload: bytes,
        failed: bool,
        ttl_ms: int,
        meta: Mapping[str, str] | None = None,
    ) -> Completion:
        args = _complete_args(owner, fence, fingerprint, payload, failed, ttl_ms, meta)
        return _to_completion(self._eval(_COMPLETE_SCRIPT, key, args), payload, key)

    async def acomplete(
        self,
        key: str,
        *,
        owner: str,
        fence: int,
        fingerprint: str,
        payload: bytes,
        failed: bool,
        ttl_ms: int,
        meta: Mapping[str, str] | None = None,
    ) -> Completion:
        args = _complete_args(owner, fence, fingerprint, payload, failed, ttl_ms, meta)
        return _to_completion(await self._aeval(_COMPLETE_SCRIPT, key, args), payload, key)

    def release(self, key: str, *, owner: str, fence: int) -> bool:
        return bool(self._eval(_RELEASE_SCRIPT, key, (owner, fence, _VERSION)))

    async def arelease(self, key: str, *, owner: str, fence: int) -> bool:
        return bool(await self._aeval(_RELEASE_SCRIPT, key, (owner, fence, _VERSION)))

    def get(self, key: str) -> Record | None:
        try:
            fields = self._sync().execute_command("HGETALL", self._rkey(key), **_RAW)
        except _BACKEND_ERRORS as exc:
            raise _translate(exc, key) from exc
        return _to_record(key, fields) if fields else None

    async def aget(self, key: str) -> Record | None:
        client = self._async()
        try:
            fields = await client.execute_command("HGETALL", self._rkey(key), **_RAW)
        except _BACKEND_ERRORS as exc:
            raise _translate(exc, key) from exc
        return _to_record(key, fields) if fields else None

    # -- wake-ups -----------------------------------------------------------------------

    def watch(self, key: str, *, fence: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        try:
            pubsub = self._sync().pubsub()
            try:
                pubsub.subscribe(self._rkey(key) + ":done")
                if not _await_confirmation(pubsub.get_message, deadline):
                    return
                left_ms = self._eval(_PROBE_SCRIPT, key, (fence,))
                if left_ms < 0:
                    return
                deadline = min(deadline, time.monotonic() + left_ms / 1000 + 0.001)
                while (left := deadline - time.monotonic()) > 0:
                    message = pubsub.get_message(timeout=left)
                    if message is not None and message["type"] == "message":
                        return
            finally:
                pubsub.close()
        except _BACKEND_ERRORS as exc:
            raise _translate(exc, key) from exc

    async def awatch(self, key: str, *, fence: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        try:
            client = self._async()
            if isinstance(client, redis.asyncio.RedisCluster):
                await client.initialize()  # the pub/sub node is chosen from the slot map
            pubsub = client.pubsub()
            try:
                await pubsub.subscribe(self._rkey(key) + ":done")
                while (left := deadline - time.monotonic()) > 0:
                    message = await pubsub.get_message(timeout=left)
                    if message is not None and message["type"] == "subscribe":
                        break
                else:
                    return
                left_ms = await self._aeval(_PROBE_SCRIPT, key, (fence,))
                if left_ms < 0:
                    return
                deadline = min(deadline, time.monotonic() + left_ms / 1000 + 0.001)
                while (left := deadline - time.monotonic()) > 0:
                    message = await pubsub.get_message(timeout=left)
                    if message is not None and message["type"] == "message":
                        return
            finally:
                await pubsub.aclose()
        except _BACKEND_ERRORS as exc:
            raise _translate(exc, key) from exc

    # -- operator helpers ---------------------------------------------------------------

    def delete(self, key: str) -> bool:
        """Remove the record whoever holds it (an operator action: a plain ``DEL``)."""
        return bool(self._eval(_DELETE_SCRIPT, key, ()))

    async def adelete(self, key: str) -> bool:
        return bool(await self._aeval(_DELETE_SCRIPT, key, ()))

    def list(
        self,
        *,
        namespace: str | None = None,
        thread_id: str | None = None,
        limit: int | None = None,
    ) -> builtins.list[Record]:
        """Records whose meta match, oldest first: ``SCAN`` (every primary on a Cluster)."""
        out: builtins.list[Record] = []
        try:
            client = self._sync()
            batch: builtins.list[Any] = []
            for rkey in client.scan_iter(match=self._pattern(), count=500, _type="hash"):
                batch.append(rkey)
                if len(batch) >= 256:
                    out += self._fetch(client, batch, namespace, thread_id)
                    batch = []
            if batch:
                out += self._fetch(client, batch, namespace, thread_id)
        except _BACKEND_ERRORS as exc:
            raise _translate(exc, None) from exc
        return _oldest_first(out, limit)

    async def alist(
        self,
        *,
        namespace: str | None = None,
        thread_id: str | None = None,
        limit: int | None = None,
    ) -> builtins.list[Record]:
        out: builtins.list[Record] = []
        try:
            client = self._async()
            batch: builtins.list[Any] = []
            async for rkey in client.scan_iter(match=self._pattern(), count=500, _type="hash"):
                batch.append(rkey)
                if len(batch) >= 256:
                    out += await self._afetch(client, batch, namespace, thread_id)
                    batch = []
            if batch:
                out += await self._afetch(client, batch, namespace, thread_id)
        except _BACKEND_ERRORS as exc:
            raise _translate(exc, None) from exc
        return _oldest_first(out, limit)

    async def apurge(self, *, thread_id: str, namespace: str | None = None) -> int:
        n = 0
        for rec in await self.alist(namespace=namespace, thread_id=thread_id):
            n += await self.adelete(rec.key)
        return n

    def _pattern(self) -> str:
        return _glob_escape(self._head) + "*}"

    def _fetch(
        self, client: Any, rkeys: builtins.list[Any], namespace: str | None, thread_id: str | None
    ) -> builtins.list[Record]:
        pipe = client.pipeline(transaction=False)
        for rkey in rkeys:
            pipe.execute_command("HGETALL", rkey, **_RAW)
        return self._matching(rkeys, pipe.execute(raise_on_error=False), namespace, thread_id)

    async def _afetch(
        self, client: Any, rkeys: builtins.list[Any], namespace: str | None, thread_id: str | None
    ) -> builtins.list[Record]:
        pipe = client.pipeline(transaction=False)
        for rkey in rkeys:
            pipe.execute_command("HGETALL", rkey, **_RAW)
        replies = await pipe.execute(raise_on_error=False)
        return self._matching(rkeys, replies, namespace, thread_id)

    def _matching(
        self,
        rkeys: builtins.list[Any],
        replies: Iterable[Any],
        namespace: str | None,
        thread_id: str | None,
    ) -> builtins.list[Record]:
        out = []
        for rkey, fields in zip(rkeys, replies, strict=True):
            name = rkey.decode(errors="surrogateescape") if isinstance(rkey, bytes) else rkey
            key = name[len(self._head) : -1]
            if isinstance(fields, Exception):
                if isinstance(fields, ResponseError):  # e.g. WRONGTYPE: replaced meanwhile
                    _log.warning("skipping unreadable idempotency record %r: %s", key, fields)
                    continue
                raise fields
            if not fields:
                continue  # expired or deleted since SCAN saw it
            try:
                rec = _to_record(key, fields)
            except CorruptRecordError as exc:
                _log.warning("skipping corrupt idempotency record %r: %s", key, exc)
                continue
            if namespace is not None and rec.meta.get("namespace") != namespace:
                continue
            if thread_id is not None and rec.meta.get("thread_id") != thread_id:
                continue
            out.append(rec)
        return out

    # -- eviction policy ----------------------------------------------------------------

    def _check_policy(self) -> None:
        self._policy_checked = True
        try:
            reply = self._sync().execute_command("CONFIG", "GET", "maxmemory-policy")
        except _BACKEND_ERRORS as exc:  # NOPERM, CONFIG renamed away, a managed service
            _log.debug("could not read maxmemory-policy: %s", exc)
            return
        _warn_if_evicting(reply)

    async def _acheck_policy(self, client: Any) -> None:
        self._policy_checked = True
        try:
            reply = await client.execute_command("CONFIG", "GET", "maxmemory-policy")
        except _BACKEND_ERRORS as exc:
            _log.debug("could not read maxmemory-policy: %s", exc)
            return
        _warn_if_evicting(reply)

    # -- closing ------------------------------------------------------------------------

    def close(self) -> None:
        """Return this store's connections; clients it built are closed (and rebuilt on use).

        Call it when no operation is in flight. Clients passed in are left open.
        """
        with self._lock:
            fast, self._fast = self._fast, None
            self._sync_ready = False
            built = self._sync_client if self._sync_factory is not None else None
            if built is not None:
                self._sync_client = None
        if fast is not None:
            fast.close()
        if built is not None:
            built.close()

    async def aclose(self) -> None:
        """:meth:`close`, plus the async client this store built for the running loop."""
        self.close()
        if self._async_factory is None:
            return
        client = self._async_by_loop.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()


# -- the sync fast path ------------------------------------------------------------------


#: Bumped in a forked child: connections checked out before the fork belong to the parent.
_forks = 0


def _after_fork_in_child() -> None:
    global _forks
    _forks += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class _Held:
    """A connection checked out by one thread, returned to the pool when dropped."""

    __slots__ = ("__weakref__", "conn", "forks", "generation", "pack", "returned")

    def __init__(self, conn: Any, pool: ConnectionPool, generation: int) -> None:
        self.conn = conn
        self.forks = _forks
        self.generation = generation
        self.pack = _packer_for(conn)
        self.returned = weakref.finalize(self, pool.release, conn)
        self.returned.atexit = False


class _Local(threading.local):
    held: _Held | None = None


class _ConnectionPerThread:
    """``EVALSHA`` straight on one pooled connection per thread (see "Fast path" above)."""

    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool
        self._local = _Local()
        self._all: weakref.WeakSet[_Held] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._generation = 0

    @classmethod
    def for_client(cls, client: SyncClient) -> _ConnectionPerThread | None:
        if not isinstance(client, redis.Redis) or client.connection is not None:
            return None  # Cluster, or a single-connection client with its own lock
        pool = client.connection_pool
        return cls(pool) if isinstance(pool, ConnectionPool) else None

    def _held(self) -> _Held:
        held = self._local.held
        if held is not None and held.forks == _forks and held.generation == self._generation:
            return held
        if held is not None and held.forks == _forks:
            held.returned()
        held = _Held(self._pool.get_connection(), self._pool, self._generation)
        with self._lock:
            self._all.add(held)
        self._local.held = held
        return held

    def _connection(self) -> Any:  # redis.connection.AbstractConnection
        return self._held().conn

    def _drop(self) -> None:
        held, self._local.held = self._local.held, None
        if held is not None and held.forks == _forks:
            held.returned()

    def evalsha(self, script: _Script, rkey: str, args: Sequence[Any]) -> Any:
        held = self._held()
        try:
            return _roundtrip(held, script, rkey, args)
        except (RedisConnectionError, RedisTimeoutError) as exc:
            return self._retry(held, script, rkey, args, exc)

    def _retry(
        self, held: _Held, script: _Script, rkey: str, args: Sequence[Any], first: Exception
    ) -> Any:
        """The client's ``Retry`` for the attempts left after the first one failed."""
        conn = held.conn
        conn.disconnect()
        retry = copy.copy(conn.retry)
        left = retry.get_retries()
        try:
            if left == 0:
                raise first
            retry.update_retries(left - 1 if left > 0 else left)
            return retry.call_with_retry(
                lambda: _roundtrip(held, script, rkey, args), lambda _err: conn.disconnect()
            )
        except (RedisConnectionError, RedisTimeoutError):
            self._drop()
            raise

    def close(self) -> None:
        with self._lock:
            self._generation += 1
            everything, self._all = list(self._all), weakref.WeakSet()
        for held in everything:
            if held.forks == _forks:
                held.returned()


def _packer_for(conn: Any) -> Callable[[tuple[Any, ...]], bytes] | None:
    """hiredis' packer when it encodes text as the connection would (UTF-8, strict)."""
    encoder = getattr(conn, "encoder", None)
    if _hiredis_pack is None or encoder is None or encoder.encoding_errors != "strict":
        return None
    return _hiredis_pack if codecs.lookup(encoder.encoding).name == "utf-8" else None


def _roundtrip(held: _Held, script: _Script, rkey: str, args: Sequence[Any]) -> Any:
    conn, pack = held.conn, held.pack
    try:
        try:
            if pack is not None:
                conn.send_packed_command((pack(("EVALSHA", script.sha, 1, rkey, *args)),))
            else:
                conn.send_command("EVALSHA", script.sha, 1, rkey, *args)
            return conn.read_response(disable_decoding=True)
        except NoScriptError:  # SCRIPT FLUSH, a restart, a failover: send the source once
            conn.send_command("EVAL", script.source, 1, rkey, *args)
            return conn.read_response(disable_decoding=True)
    except RedisError:
        raise  # a reply was read (or the connection already dropped): still in step
    except BaseException:
        conn.disconnect()  # interrupted between send and read: the reply would be misread
        raise


# -- helpers -----------------------------------------------------------------------------


def _seconds(value: float | timedelta) -> float:
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


def _client_options(
    socket_timeout: float | timedelta,
    socket_connect_timeout: float | timedelta,
    health_check_interval: float | timedelta,
    max_connections: int | None,
    extra: Mapping[str, Any],
) -> dict[str, Any]:
    options: dict[str, Any] = {
        "socket_timeout": _seconds(socket_timeout),
        "socket_connect_timeout": _seconds(socket_connect_timeout),
        "health_check_interval": _seconds(health_check_interval),
    }
    if max_connections is not None:
        options["max_connections"] = max_connections
    options.update(extra)
    return options


def _backoff() -> ExponentialBackoff:
    return ExponentialBackoff(cap=0.5, base=0.01)


def _retry(retries: int) -> Retry:
    return Retry(_backoff(), retries, supported_errors=(RedisConnectionError, RedisTimeoutError))


def _async_retry(retries: int) -> redis.asyncio.retry.Retry:
    return redis.asyncio.retry.Retry(
        _backoff(), retries, supported_errors=(RedisConnectionError, RedisTimeoutError)
    )


def _translate(exc: Exception, key: str | None) -> StoreUnavailableError | CorruptRecordError:
    message = str(exc)
    if isinstance(exc, ResponseError) and message.startswith(("CORRUPT", "WRONGTYPE")):
        return CorruptRecordError(
            f"the Redis record for idempotency key {key!r} is not a record this store can "
            f"read ({message}); it was not used. Inspect it, then delete it to start over.",
            key=key,
        )
    return StoreUnavailableError(
        f"Redis idempotency store unavailable ({type(exc).__name__}: {message})", key=key
    )


def _claim_args(
    owner: str,
    fingerprint: str,
    lease_ms: int,
    ttl_ms: int,
    on_expired: ExpiredPolicy,
    meta: Mapping[str, str] | None,
) -> list[Any]:
    args: list[Any] = [owner, fingerprint, lease_ms, ttl_ms, on_expired, _VERSION]
    if meta:
        for name, value in meta.items():
            args += (name, value)
    return args


def _complete_args(
    owner: str,
    fence: int,
    fingerprint: str,
    payload: bytes,
    failed: bool,
    ttl_ms: int,
    meta: Mapping[str, str] | None,
) -> list[Any]:
    args: list[Any] = [owner, fence, fingerprint, payload, 1 if failed else 0, ttl_ms, _VERSION]
    if meta:
        for name, value in meta.items():
            args += (name, value)
    return args


def _to_claim(reply: Any, key: str) -> Claim:
    try:
        outcome = _OUTCOMES[reply[0]]
        return Claim(
            outcome,
            fence=reply[1],
            attempt=reply[2],
            retry_after_ms=reply[3],
            failed=reply[4] == 1,
            payload=reply[5] if len(reply) > 5 else None,
        )
    except (KeyError, IndexError, TypeError) as exc:
        raise CorruptRecordError(f"unexpected claim reply {reply!r}", key=key) from exc


def _to_completion(reply: Any, payload: bytes, key: str) -> Completion:
    try:
        stored = reply[0] == 1
        return Completion(
            stored=stored,
            stale=reply[1] == 1,
            failed=reply[2] == 1,
            payload=payload if stored else reply[3],
        )
    except (IndexError, TypeError) as exc:
        raise CorruptRecordError(f"unexpected completion reply {reply!r}", key=key) from exc


_INT_FIELDS = (b"fence", b"lease_until", b"attempt", b"created_at", b"updated_at")


def _to_record(key: str, fields: Mapping[bytes, bytes]) -> Record:
    """Decode an ``HGETALL`` reply; anything but a well-formed record is corrupt."""
    try:
        if fields.get(b"version") != _VERSION.encode():
            raise ValueError(f"unknown format version {fields.get(b'version')!r}")
        state = _STATES[fields[b"state"]]
        ints = {name: _int(fields[name]) for name in _INT_FIELDS}
        payload = fields.get(b"payload")
        if state in (State.COMPLETED, State.FAILED) and payload is None:
            raise ValueError("a result without a payload")
        meta = {
            name[2:].decode(): value.decode()
            for name, value in fields.items()
            if name.startswith(b"m:")
        }
        return Record(
            key=key,
            state=state,
            owner=fields[b"owner"].decode(),
            fence=ints[b"fence"],
            lease_until=ints[b"lease_until"],
            fingerprint=fields[b"fingerprint"].decode(),
            attempt=ints[b"attempt"],
            payload=payload,
            created_at=ints[b"created_at"],
            updated_at=ints[b"updated_at"],
            version=FORMAT_VERSION,
            meta=meta,
        )
    except (KeyError, ValueError, AttributeError, TypeError) as exc:
        raise CorruptRecordError(
            f"the Redis record for idempotency key {key!r} cannot be read ({exc!r}); "
            "it was not used. Inspect it, then delete it to start over.",
            key=key,
        ) from exc


def _int(raw: bytes) -> int:
    if not raw.lstrip(b"-").isdigit():
        raise ValueError(f"not an integer: {raw!r}")
    return int(raw)


def _oldest_first(records: list[Record], limit: int | None) -> list[Record]:
    records.sort(key=lambda r: r.created_at)
    return records[:limit] if limit is not None else records


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def _await_confirmation(get_message: Callable[..., Any], deadline: float) -> bool:
    """Read until Redis confirms the subscription; ``False`` if the deadline passed."""
    while (left := deadline - time.monotonic()) > 0:
        message = get_message(timeout=left)
        if message is not None and message["type"] == "subscribe":
            return True
    return False


def _warn_if_evicting(reply: Any) -> None:
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
