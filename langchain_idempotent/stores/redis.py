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
  with explicit socket timeouts and a health-check interval (redis-py's own ``from_url``
  sets neither). Their connections make one attempt each; the store retries a whole
  operation (reconnect, handshake, command) ``retries`` times with exponential backoff on
  connection errors and timeouts, so a refused connection fails within milliseconds, and a
  hung server or a host that drops packets after about ``(retries + 1) * (socket_timeout
  + socket_connect_timeout)`` at most. (redis-py's own ``Retry`` would also retry the
  connect inside every command retry: ``(retries + 1) ** 2`` timeouts.) A Cluster client
  keeps redis-py's retries, which re-learn the slot map after a failover. The async client
  is built once per event loop.
  Clients passed in are used as they are (their timeouts and retries apply) and are never
  closed by the store.
- **Fast path.** With a sync standalone or Sentinel ``redis.Redis`` (not a single-connection
  client), the store keeps the connections it has used checked out of the client's own
  pool: an operation takes an idle one (or checks out one more), sends ``EVALSHA`` on it
  directly (packed by hiredis, then ``read_response``), skipping redis-py's per-command
  bookkeeping, and puts it back. So the store holds as many connections as operations ran
  at once, whichever threads ran them; the connection's own ``Retry``, timeouts, TLS and
  health checks still apply. An interrupted round trip (``KeyboardInterrupt`` between send
  and read) disconnects the connection so that no later call reads its reply; one that
  failed on a connection error returns to the pool, and the idle ones are disconnected
  (a reset or restart killed them too), so that a retry reconnects. After ``fork()`` the
  child checks out its own connections. :meth:`~RedisIdempotencyStore.close` returns them
  all. Cluster and async clients go through ``execute_command``.
- **Eviction.** On the first successful operation the store asks ``CONFIG GET
  maxmemory-policy`` once and logs a warning on ``langchain_idempotent.stores.redis`` for
  any policy but ``noeviction``: ``allkeys-*`` can evict any record, and ``volatile-*``
  can too, because every record carries a TTL. Servers that refuse ``CONFIG`` are not
  asked again.
- **Durability.** What Redis persists is what survives: without AOF (``appendfsync``) and
  replication acknowledgement, a restart or failover can lose recent records, and the tool
  can run again (with the same key handed downstream). With ``replicas=N`` (standalone or
  Sentinel; refused on a Cluster client, where redis-py cannot send ``WAIT`` on the
  connection that wrote) every claim and completion script is followed, pipelined on the
  same connection, by ``WAIT N replica_timeout``. A claim fewer than ``N`` replicas
  acknowledged is released and raises ``StoreUnavailableError`` — the tool does not run;
  a completion fewer than ``N`` acknowledged stays stored on the master and raises it (the
  engine reports it as a ``store_error`` event and still returns the result). A replica
  that acknowledged holds the record if it is promoted; Redis does not promise which
  replica a failover promotes, so ``N`` should be all the replicas that can be promoted.
"""

from __future__ import annotations

import asyncio
import builtins
import codecs
import contextlib
import copy
import hashlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeAlias, TypeVar

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
#: Claim outcomes that wrote a lease (and so are worth a replica's acknowledgement).
_WRITTEN = frozenset({ClaimOutcome.ACQUIRED, ClaimOutcome.TAKEOVER, ClaimOutcome.OWNED})
_T = TypeVar("_T")


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
-- ARGV[5]   'takeover' or 'raise': what to do with an expired lease
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
if ARGV[5] == 'raise' then return {'expired', rec.fence, rec.attempt, 0, 0} end
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


@dataclass(frozen=True, slots=True)
class _Durability:
    """How many replicas must acknowledge a claim or a completion (``WAIT``), and how long
    to wait for them. ``replicas == 0``: no ``WAIT`` at all."""

    replicas: int
    timeout_ms: int

    @property
    def wait(self) -> tuple[Any, ...] | None:
        return ("WAIT", self.replicas, self.timeout_ms) if self.replicas else None

    def short(self, acks: int | None) -> bool:
        return acks is not None and acks < self.replicas

    def error(self, what: str, key: str, acks: int | None) -> StoreUnavailableError:
        after = (
            "the claim was released and the tool was not run"
            if what == "claim"
            else "the result is stored on the master, but a failover now could lose it"
        )
        return StoreUnavailableError(
            f"Redis acknowledged the {what} of idempotency key {key!r} on {acks} of the "
            f"{self.replicas} replica(s) required (replicas={self.replicas}) within "
            f"{self.timeout_ms} ms; {after}",
            key=key,
        )

    @classmethod
    def of(cls, replicas: int, timeout: float | timedelta, *, cluster: bool) -> _Durability:
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
            raise ValueError(f"replicas must be an int >= 0, got {replicas!r}")
        timeout_ms = round(_seconds(timeout) * 1000)
        if timeout_ms < 1:
            raise ValueError(
                f"replica_timeout must be at least 1 ms (WAIT 0 would block forever), "
                f"got {timeout!r}"
            )
        if replicas and cluster:
            raise ValueError(
                "replicas= (WAIT after each claim and completion) is not supported on a "
                "Redis Cluster client: redis-py cannot send WAIT on the connection that "
                "wrote the record; use a standalone or Sentinel-managed Redis, or AOF"
            )
        return cls(replicas, timeout_ms)


# -- the store ---------------------------------------------------------------------------


class RedisIdempotencyStore(BaseIdempotencyStore):
    """Records in Redis. See the module docstring for the full contract.

    Pass a sync ``client`` (``redis.Redis``, ``redis.RedisCluster``, or a Sentinel
    ``master_for`` client), an ``async_client`` (their ``redis.asyncio`` twins), or both;
    or build both lazily with :meth:`from_url` / :meth:`from_sentinel`. A store given only
    one of them raises :class:`TypeError` on the other path. ``prefix`` starts every key
    this store writes (no braces: they would change the Cluster hash tag). ``replicas``
    and ``replica_timeout``: see "Durability" in the module docstring.
    """

    def __init__(
        self,
        client: SyncClient | None = None,
        *,
        async_client: AsyncClient | None = None,
        prefix: str = "idem:",
        replicas: int = 0,
        replica_timeout: float | timedelta = 0.1,
    ) -> None:
        if client is None and async_client is None:
            raise TypeError(
                "RedisIdempotencyStore needs client=redis.Redis(...) and/or "
                "async_client=redis.asyncio.Redis(...); or use "
                "RedisIdempotencyStore.from_url(url)"
            )
        cluster = isinstance(client, redis.RedisCluster) or isinstance(
            async_client, redis.asyncio.RedisCluster
        )
        self._setup(
            prefix,
            _Durability.of(replicas, replica_timeout, cluster=cluster),
            sync_client=client,
            async_client=async_client,
        )

    def _setup(
        self,
        prefix: str,
        durability: _Durability,
        *,
        sync_client: SyncClient | None = None,
        async_client: AsyncClient | None = None,
        sync_factory: Callable[[], SyncClient] | None = None,
        async_factory: Callable[[], AsyncClient] | None = None,
        retries: int | None = None,
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
        self._fast: _HeldConnections | None = None
        self._sync_ready = False
        self._policy_checked = False
        self._durability = durability
        # Whole operations retried by the store (clients it built make one attempt each).
        self._attempts = None if retries is None else _retry(retries)
        self._aattempts = None if retries is None else _async_retry(retries)

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
        replicas: int = 0,
        replica_timeout: float | timedelta = 0.1,
        **client_kwargs: Any,
    ) -> RedisIdempotencyStore:
        """A store on ``url``, with a sync and an async client built on first use.

        Schemes: ``redis://``, ``rediss://`` (TLS), ``unix://``, and ``redis+cluster://`` /
        ``rediss+cluster://`` for a Redis Cluster (or pass ``cluster=True`` with a plain
        scheme; the URL names any one node). ``socket_timeout`` bounds every read,
        ``socket_connect_timeout`` every connect; an operation that hits a connection error
        or a timeout is retried whole (reconnect, handshake, command) ``retries`` times
        with exponential backoff (10 ms doubling, at most 0.5 s) before
        :class:`~langchain_idempotent.errors.StoreUnavailableError` (on a Cluster,
        redis-py's cluster client does the retrying). ``replicas`` > 0 makes every claim
        and completion wait (``WAIT``) until that many replicas have it, at most
        ``replica_timeout``; see the module docstring, "Durability". ``client_kwargs`` go
        to redis-py (``password``, ``ssl_ca_certs``, ...).
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

        _check_retries(retries)
        durability = _Durability.of(replicas, replica_timeout, cluster=bool(cluster))
        # A Cluster client retries inside (it must re-learn the slot map after a failover);
        # otherwise each connection makes one attempt and the store retries whole operations.
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

        store = cls.__new__(cls)
        store._setup(
            prefix,
            durability,
            sync_factory=sync_factory,
            async_factory=async_factory,
            retries=None if cluster else retries,
        )
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
        replicas: int = 0,
        replica_timeout: float | timedelta = 0.1,
        sentinel_kwargs: Mapping[str, Any] | None = None,
        **client_kwargs: Any,
    ) -> RedisIdempotencyStore:
        """A store on the master that ``sentinels`` name ``service_name``, built on first use.

        Follows failovers (redis-py's ``SentinelConnectionPool``: a retried operation
        asks the sentinels for the master again). Timeouts, retries and ``replicas`` as in
        :meth:`from_url`; ``sentinel_kwargs`` configure the connections to the sentinels
        themselves (default: the same socket timeouts).
        """
        _check_retries(retries)
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
                service_name, retry=_retry(0), **options
            )
            return client

        def async_factory() -> AsyncClient:
            manager: Any = redis.asyncio.sentinel.Sentinel
            client: redis.asyncio.Redis = manager(
                addresses, sentinel_kwargs=dict(to_sentinels)
            ).master_for(service_name, retry=_async_retry(0), **options)
            return client

        store = cls.__new__(cls)
        store._setup(
            prefix,
            _Durability.of(replicas, replica_timeout, cluster=False),
            sync_factory=sync_factory,
            async_factory=async_factory,
            retries=retries,
        )
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
                self._fast = _HeldConnections.for_client(client)
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

    def _retrying(self, op: Callable[[], _T]) -> _T:
        """``op`` under the store's whole-operation retry (clients built by ``from_url``)."""
        attempts = self._attempts
        return op() if attempts is None else attempts.call_with_retry(op, _ignore)

    async def _aretrying(self, op: Callable[[], Awaitable[_T]]) -> _T:
        async def guarded() -> _T:
            try:
                return await op()
            except (AttributeError, TypeError) as exc:
                if not _closed_under_a_write(exc):
                    raise
            try:  # once more at once, on any client (Cluster too): a resent claim or
                # completion is recognised as the same owner's
                return await op()
            except (AttributeError, TypeError) as exc:
                if _closed_under_a_write(exc):
                    raise RedisConnectionError(
                        f"the connection was closed under a write ({exc})"
                    ) from exc
                raise

        attempts = self._aattempts
        return await (
            guarded() if attempts is None else attempts.call_with_retry(guarded, _aignore)
        )

    def _eval(self, script: _Script, key: str, args: Sequence[Any]) -> Any:
        return self._eval_acked(script, key, args, wait=None)[0]

    def _eval_acked(
        self, script: _Script, key: str, args: Sequence[Any], wait: tuple[Any, ...] | None
    ) -> tuple[Any, int | None]:
        """The script's reply, and the replicas' acknowledgement count when ``wait`` is a
        ``WAIT`` command (sent right behind the script on the same connection)."""
        rkey = f"{self._head}{key}}}"
        try:
            answer = self._retrying(lambda: self._send(script, rkey, args, wait))
        except _BACKEND_ERRORS as exc:
            raise _translate(exc, key) from exc
        if not self._policy_checked:
            self._check_policy()
        return answer

    def _send(
        self, script: _Script, rkey: str, args: Sequence[Any], wait: tuple[Any, ...] | None
    ) -> tuple[Any, int | None]:
        """One attempt: no retry, redis-py's errors as they are."""
        client: Any = self._sync_client if self._sync_ready else self._sync()
        fast = self._fast
        if fast is not None:
            return fast.evalsha(script, rkey, args, wait)
        return _execute(client, script, rkey, args, wait)

    async def _aeval(self, script: _Script, key: str, args: Sequence[Any]) -> Any:
        return (await self._aeval_acked(script, key, args, wait=None))[0]

    async def _aeval_acked(
        self, script: _Script, key: str, args: Sequence[Any], wait: tuple[Any, ...] | None
    ) -> tuple[Any, int | None]:
        client = self._async()
        try:
            answer = await self._aretrying(
                lambda: _aexecute(client, script, self._rkey(key), args, wait)
            )
        except _BACKEND_ERRORS as exc:
            raise _translate(exc, key) from exc
        if not self._policy_checked:
            await self._acheck_policy(client)
        return answer

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
        wait = self._durability.wait
        reply, acks = self._eval_acked(_CLAIM_SCRIPT, key, args, wait)
        claim = _to_claim(reply, key)
        if self._durability.short(acks) and claim.outcome in _WRITTEN:
            with contextlib.suppress(StoreUnavailableError):
                self.release(key, owner=owner, fence=claim.fence)
            raise self._durability.error("claim", key, acks)
        return claim

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
        wait = self._durability.wait
        reply, acks = await self._aeval_acked(_CLAIM_SCRIPT, key, args, wait)
        claim = _to_claim(reply, key)
        if self._durability.short(acks) and claim.outcome in _WRITTEN:
            with contextlib.suppress(StoreUnavailableError):
                await self.arelease(key, owner=owner, fence=claim.fence)
            raise self._durability.error("claim", key, acks)
        return claim

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
        wait = self._durability.wait
        reply, acks = self._eval_acked(_COMPLETE_SCRIPT, key, args, wait)
        completion = _to_completion(reply, payload, key)
        if self._durability.short(acks) and completion.stored:
            raise self._durability.error("completion", key, acks)
        return completion

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
        wait = self._durability.wait
        reply, acks = await self._aeval_acked(_COMPLETE_SCRIPT, key, args, wait)
        completion = _to_completion(reply, payload, key)
        if self._durability.short(acks) and completion.stored:
            raise self._durability.error("completion", key, acks)
        return completion

    def release(self, key: str, *, owner: str, fence: int) -> bool:
        return bool(self._eval(_RELEASE_SCRIPT, key, (owner, fence, _VERSION)))

    async def arelease(self, key: str, *, owner: str, fence: int) -> bool:
        return bool(await self._aeval(_RELEASE_SCRIPT, key, (owner, fence, _VERSION)))

    def get(self, key: str) -> Record | None:
        try:
            client = self._sync()
            fields = self._retrying(
                lambda: client.execute_command("HGETALL", self._rkey(key), **_RAW)
            )
        except _BACKEND_ERRORS as exc:
            raise _translate(exc, key) from exc
        return _to_record(key, fields) if fields else None

    async def aget(self, key: str) -> Record | None:
        client = self._async()
        try:
            fields = await self._aretrying(
                lambda: client.execute_command("HGETALL", self._rkey(key), **_RAW)
            )
        except _BACKEND_ERRORS as exc:
            raise _translate(exc, key) from exc
        return _to_record(key, fields) if fields else None

    # -- wake-ups -----------------------------------------------------------------------

    def watch(self, key: str, *, fence: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout

        def once() -> None:
            pubsub = self._sync().pubsub()
            try:
                pubsub.subscribe(self._rkey(key) + ":done")
                if not _await_confirmation(pubsub.get_message, deadline):
                    return
                left_ms = self._send(_PROBE_SCRIPT, self._rkey(key), (fence,), None)[0]
                if left_ms < 0:
                    return
                end = min(deadline, time.monotonic() + left_ms / 1000 + 0.001)
                while (left := end - time.monotonic()) > 0:
                    message = pubsub.get_message(timeout=left)
                    if message is not None and message["type"] == "message":
                        return
            finally:
                pubsub.close()

        try:
            self._retrying(once)
        except _BACKEND_ERRORS as exc:
            raise _translate(exc, key) from exc

    async def awatch(self, key: str, *, fence: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout

        async def once() -> None:
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
                probe = _aexecute(client, _PROBE_SCRIPT, self._rkey(key), (fence,), None)
                left_ms = (await probe)[0]
                if left_ms < 0:
                    return
                end = min(deadline, time.monotonic() + left_ms / 1000 + 0.001)
                while (left := end - time.monotonic()) > 0:
                    message = await pubsub.get_message(timeout=left)
                    if message is not None and message["type"] == "message":
                        return
            finally:
                await pubsub.aclose()

        try:
            await self._aretrying(once)
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

        def scan() -> builtins.list[Record]:
            out: builtins.list[Record] = []
            client = self._sync()
            batch: builtins.list[Any] = []
            for rkey in client.scan_iter(match=self._pattern(), count=500, _type="hash"):
                batch.append(rkey)
                if len(batch) >= 256:
                    out += self._fetch(client, batch, namespace, thread_id)
                    batch = []
            if batch:
                out += self._fetch(client, batch, namespace, thread_id)
            return out

        try:
            return _oldest_first(self._retrying(scan), limit)
        except _BACKEND_ERRORS as exc:
            raise _translate(exc, None) from exc

    async def alist(
        self,
        *,
        namespace: str | None = None,
        thread_id: str | None = None,
        limit: int | None = None,
    ) -> builtins.list[Record]:

        async def scan() -> builtins.list[Record]:
            out: builtins.list[Record] = []
            client = self._async()
            batch: builtins.list[Any] = []
            async for rkey in client.scan_iter(match=self._pattern(), count=500, _type="hash"):
                batch.append(rkey)
                if len(batch) >= 256:
                    out += await self._afetch(client, batch, namespace, thread_id)
                    batch = []
            if batch:
                out += await self._afetch(client, batch, namespace, thread_id)
            return out

        try:
            return _oldest_first(await self._aretrying(scan), limit)
        except _BACKEND_ERRORS as exc:
            raise _translate(exc, None) from exc

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

    # == BEGIN the store's clock and facts: now_ms, anow_ms, describe (issue 11) =========
    # One self-contained block (OPERATOR), to port as it is. It relies on the store's
    # ``_sync``/``_async`` clients, ``_retrying``/``_aretrying``, ``_prefix``, ``_durability``,
    # the error boundary (``_BACKEND_ERRORS``, ``_translate``) and the module's imports
    # (``redis``, ``redis.sentinel``, ``ResponseError``, ``builtins``, ``Mapping``, ``Any``).

    #: The ``INFO`` fields ``describe`` reports for each server.
    _INFO_FIELDS = (
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
    #: The ``CONFIG GET`` values ``describe`` reports (``None`` where ``CONFIG`` is refused).
    _CONFIG_FIELDS = ("appendfsync", "save", "min-replicas-to-write")

    def now_ms(self) -> int:
        """The server's clock in milliseconds (``TIME``): the clock leases are written on.

        On a Cluster, the clock of redis-py's default node (each record's lease is judged
        by the node that holds it; keep the nodes' clocks in sync). Retried and translated
        like every operation: an unreachable server raises
        :class:`~langchain_idempotent.errors.StoreUnavailableError`.
        """
        try:
            client = self._sync()
            reply = self._retrying(lambda: client.execute_command("TIME"))
        except _BACKEND_ERRORS as exc:
            raise _translate(exc, None) from exc
        return self._time_ms(reply)

    async def anow_ms(self) -> int:
        client = self._async()
        try:
            reply = await self._aretrying(lambda: client.execute_command("TIME"))
        except _BACKEND_ERRORS as exc:
            raise _translate(exc, None) from exc
        return self._time_ms(reply)

    @staticmethod
    def _time_ms(reply: Any) -> int:
        seconds, micros = reply[0], reply[1]  # redis-py: (seconds, microseconds)
        return int(seconds) * 1000 + int(micros) // 1000

    def describe(self) -> dict[str, Any]:
        """What the servers behind this store say about themselves, for ``doctor``.

        ``{"kind": "redis", "topology": "standalone" | "sentinel" | "cluster", "prefix",
        "replicas" (the ``replicas=`` this store waits for), "servers": [...]}``: one entry
        per server the store writes to (the master; on a Cluster, every primary), each with
        its ``address`` (``host:port``, or the socket path), the ``INFO`` fields of
        :attr:`_INFO_FIELDS` (``None`` where absent) and the ``CONFIG GET`` values of
        :attr:`_CONFIG_FIELDS` (``None`` where ``CONFIG`` is refused, as on managed
        services). No password. Uses the store's own sync client.
        """
        try:
            client = self._sync()
            topology, servers = self._retrying(lambda: self._describe_servers(client))
        except _BACKEND_ERRORS as exc:
            raise _translate(exc, None) from exc
        return {
            "kind": "redis",
            "topology": topology,
            "prefix": self._prefix,
            "replicas": self._durability.replicas,
            "servers": servers,
        }

    def _describe_servers(self, client: Any) -> tuple[str, builtins.list[dict[str, Any]]]:
        """The topology, and one entry per server written to (redis-py is untyped here)."""
        pool: Any = getattr(client, "connection_pool", None)
        if isinstance(client, redis.RedisCluster):
            primaries: Any = client.get_primaries
            servers = [
                self._describe_server(client, node.name, {"target_nodes": node})
                for node in primaries()
            ]
            return "cluster", sorted(servers, key=lambda s: str(s["address"]))
        if isinstance(pool, redis.sentinel.SentinelConnectionPool):
            master: Any = pool.get_master_address
            host, port = master()
            return "sentinel", [self._describe_server(client, f"{host}:{port}", {})]
        conn = pool.connection_kwargs
        address = conn.get("path") or f"{conn.get('host', 'localhost')}:{conn.get('port', 6379)}"
        return "standalone", [self._describe_server(client, str(address), {})]

    def _describe_server(
        self, client: Any, address: str, target: Mapping[str, Any]
    ) -> dict[str, Any]:
        info = client.execute_command("INFO", **target)
        server: dict[str, Any] = {"address": address}
        for name in self._INFO_FIELDS:
            value = info.get(name)
            server[name] = self._text(value) if isinstance(value, bytes) else value
        for name in self._CONFIG_FIELDS:
            try:
                reply = client.execute_command("CONFIG", "GET", name, **target)
            except ResponseError:  # CONFIG refused (NOPERM, renamed away, a managed service)
                server[name] = None
                continue
            found = [v for k, v in dict(reply).items() if self._text(k) == name]
            server[name] = self._text(found[0]) if found else None
        return server

    @staticmethod
    def _text(value: Any) -> str:
        return value.decode(errors="replace") if isinstance(value, bytes) else str(value)

    # == END the store's clock and facts ================================================


# -- the sync fast path ------------------------------------------------------------------


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
    pool (see "Fast path" above): an operation takes an idle one (or checks out one more)
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
    def for_client(cls, client: SyncClient) -> _HeldConnections | None:
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
        held = self._take()
        try:
            answer = _roundtrip(held, script, rkey, args, wait)
        except (RedisConnectionError, RedisTimeoutError) as exc:
            self._disconnect_idle()
            answer = self._retry(held, script, rkey, args, wait, exc)
        except BaseException:
            self._put_back(held)  # a reply error, or interrupted (then disconnected)
            raise
        self._put_back(held)
        return answer

    def _retry(
        self,
        held: _Held,
        script: _Script,
        rkey: str,
        args: Sequence[Any],
        wait: tuple[Any, ...] | None,
        first: Exception,
    ) -> tuple[Any, int | None]:
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
            answer: tuple[Any, int | None] = retry.call_with_retry(
                lambda: _roundtrip(held, script, rkey, args, wait), lambda _err: conn.disconnect()
            )
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


def _execute(
    client: Any, script: _Script, rkey: str, args: Sequence[Any], wait: tuple[Any, ...] | None
) -> tuple[Any, int | None]:
    """One attempt through ``execute_command`` (Cluster, single-connection clients). With
    ``wait`` the client holds one connection (Cluster refuses ``replicas``)."""
    try:
        reply = client.execute_command("EVALSHA", script.sha, 1, rkey, *args, **_RAW)
    except NoScriptError:
        reply = client.execute_command("EVAL", script.source, 1, rkey, *args, **_RAW)
    return reply, None if wait is None else int(client.execute_command(*wait))


async def _aexecute(
    client: Any, script: _Script, rkey: str, args: Sequence[Any], wait: tuple[Any, ...] | None
) -> tuple[Any, int | None]:
    """One attempt on an async client; with ``wait``, a pipeline holds one connection for
    the script and its ``WAIT``."""
    if wait is None:
        try:
            reply = await client.execute_command("EVALSHA", script.sha, 1, rkey, *args, **_RAW)
        except NoScriptError:
            reply = await client.execute_command("EVAL", script.source, 1, rkey, *args, **_RAW)
        return reply, None
    for command, body in (("EVALSHA", script.sha), ("EVAL", script.source)):
        pipe = client.pipeline(transaction=False)
        pipe.execute_command(command, body, 1, rkey, *args, **_RAW)
        pipe.execute_command(*wait)
        reply, acks = await pipe.execute(raise_on_error=False)
        if isinstance(reply, NoScriptError) and command == "EVALSHA":
            continue
        for answer in (reply, acks):
            if isinstance(answer, Exception):
                raise answer
        return reply, int(acks)
    raise AssertionError("unreachable")  # pragma: no cover


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


def _closed_under_a_write(exc: BaseException) -> bool:
    """redis-py's asyncio connections can leak the transport's internals — ``'NoneType'
    object has no attribute 'writelines'``, ``'NoneType' object is not callable`` — when
    the connection is closed while a command is written (redis/redis-py#3546, #4287):
    an error raised inside redis-py's or asyncio's own I/O code, not ours."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return False
    where = tb.tb_frame.f_code.co_filename.replace("\\", "/")
    return "/redis/asyncio/" in where or where.endswith(
        ("/asyncio/streams.py", "/asyncio/selector_events.py", "/asyncio/proactor_events.py")
    )


def _ignore(_error: Exception) -> None:
    """Failure callback of the store's retries: the connection already cleaned up."""


async def _aignore(_error: Exception) -> None:
    """:func:`_ignore` for redis-py's async ``Retry``, which awaits its failure callback."""


def _backoff() -> ExponentialBackoff:
    return ExponentialBackoff(cap=0.5, base=0.01)


def _retry(retries: int) -> Retry:
    _check_retries(retries)
    return Retry(_backoff(), retries, supported_errors=(RedisConnectionError, RedisTimeoutError))


def _check_retries(retries: int) -> None:
    # redis-py reads a negative count as "retry forever": a hung server would hang callers.
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"retries must be an int >= 0, got {retries!r}")


def _async_retry(retries: int) -> redis.asyncio.retry.Retry:
    return redis.asyncio.retry.Retry(
        _backoff(), retries, supported_errors=(RedisConnectionError, RedisTimeoutError)
    )


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
            "it was not used. Inspect it, then delete it to start over "
            f"(`langchain-idempotent delete {key}`).",
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
