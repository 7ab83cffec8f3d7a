"""``RedisIdempotencyStore``: many hosts, one Redis (standalone, Sentinel or Cluster).

Spec:

- **Record.** One HASH per key at ``{prefix}{<key>}`` — the braces are a Cluster hash
  tag, so the record and its wake-up channel ``{prefix}{<key>}:done`` share one slot.
  Fields: ``version state owner fence lease_until fingerprint attempt created_at updated_at
  effect`` (one per :class:`~langchain_idempotent.core.record.Record` field; integers in
  decimal), ``m:<name>`` for each ``meta`` entry, and on completed / failed records the
  payload, raw bytes, in pieces of at most 64 bytes (``payload``, ``payload:2``, ...; one
  field above 6 KiB) so that the hash stays a compact listpack under Redis' default
  ``hash-max-listpack-value`` (:data:`._scripts._PRELUDE`). Nothing is JSON or pickle: the
  store hands the payload back as bytes and never decodes it. One layout: a record without
  ``effect`` (written by a development build before 0.1.0) is refused as corrupt.
- **Protocol.** Each operation is **one Lua script, one round trip** (``EVALSHA``; on
  ``NOSCRIPT`` the script is sent once with ``EVAL``, which also caches it). The scripts
  (:mod:`._scripts`) implement the decision table of :mod:`langchain_idempotent.core.protocol`
  exactly; each is headed by comments naming its ``KEYS``, ``ARGV`` and reply. Every write
  is inside a script after an owner-token and fence compare: there is no unconditional
  ``SET`` or ``DEL``, except :meth:`~RedisIdempotencyStore.delete`, an operator action that
  removes a record whoever holds it. Fences strictly increase per key for as long as the
  record exists: release sets ``state=free`` and keeps the fence.
- **Time.** Lease deadlines and ``retry_after_ms`` come from ``redis.call('TIME')`` on the
  server holding the record, never from a client clock; :meth:`~RedisIdempotencyStore.now_ms`
  is ``TIME`` too (what the CLI compares leases with), and
  :meth:`~RedisIdempotencyStore.describe` reports what the servers say about eviction,
  persistence and replication (:mod:`._describe`).
- **Retention.** A claim sets ``PEXPIRE max(ttl, lease)``, a completion ``PEXPIRE ttl``, a
  renewal raises the expiry to at least ``lease`` from now, a release or an abandon leaves
  it alone.
- **Wake-ups.** A completion, a release, an abandon and a delete ``PUBLISH`` on the
  record's channel.
  :meth:`~RedisIdempotencyStore.watch` subscribes *first* (and waits for Redis to confirm),
  then checks the record, and returns at once if it is no longer RUNNING at the waiter's
  fence or its lease has passed; otherwise it waits for a message, at most until the
  timeout or the lease deadline, whichever is sooner. One pub/sub connection per waiter,
  closed afterwards (:mod:`._watch`).
- **Errors.** Every redis-py error (connection refused or reset, socket timeout after the
  configured retries, ``LOADING``, ``CLUSTERDOWN``, ``TRYAGAIN``, ``READONLY``, ``OOM``,
  ``NOPERM``, ...) becomes :class:`~langchain_idempotent.errors.StoreUnavailableError` with
  the key, chained with ``raise ... from``, at one boundary. A record that is not a well-
  formed hash of this format version (wrong type, missing or garbled fields, unknown
  version) raises :class:`~langchain_idempotent.errors.CorruptRecordError`; the scripts
  refuse it with a ``CORRUPT`` error reply before deciding anything. ``list`` skips such
  records with a warning; ``delete`` removes them.
- **Connections.** Constructing a store never connects.
  :meth:`RedisIdempotencyStore.from_url` and :meth:`~RedisIdempotencyStore.from_sentinel`
  build a sync and an async client lazily with explicit socket timeouts and a health-check
  interval (redis-py's own ``from_url`` sets neither; a timeout must be positive and
  finite, an interval not negative, ``0`` turning the checks off; others are refused by
  name when the store is built). Their connections make one attempt each; the store retries
  a whole operation (reconnect, handshake, command) ``retries`` times with exponential
  backoff on connection errors and timeouts, so a refused connection fails within
  milliseconds, and a hung server or a host that drops packets after about ``(retries + 1)
  * (socket_timeout + socket_connect_timeout)`` at most. (redis-py's own ``Retry`` would
  also retry the connect inside every command retry: ``(retries + 1) ** 2`` timeouts.) A
  Cluster client keeps redis-py's retries, which re-learn the slot map after a failover.
  The async client is built once per event loop. Clients passed in are used as they are
  (their timeouts and retries apply) and are never closed by the store.
- **Fast path.** With a sync standalone or Sentinel ``redis.Redis`` (not a single-connection
  client), the store keeps the connections it has used checked out of the client's own
  pool and sends ``EVALSHA`` on them directly: an optimisation that changes no reply and no
  error (:mod:`._fastpath` says what it bypasses). It holds as many connections as
  operations ran at once; an interrupted round trip never hands its reply to a later call;
  after ``fork()`` the child checks out its own; :meth:`~RedisIdempotencyStore.close`
  returns them all. Cluster, async and single-connection clients go through
  ``execute_command``.
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
  acknowledged is given back and raises ``StoreUnavailableError`` — the tool does not run
  (a fresh attempt is released; a takeover, or a re-claim of the caller's own lease, is
  abandoned: the key stays as uncertain as the claim found it);
  a completion fewer than ``N`` acknowledged stays stored on the master and raises it (the
  engine reports it as a ``store_error`` event and still returns the result). A replica
  that acknowledged holds the record if it is promoted; Redis does not promise which
  replica a failover promotes, so ``N`` should be all the replicas that can be promoted
  (:mod:`._durability`).
"""

from __future__ import annotations

import builtins
import contextlib
import time
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import redis
import redis.asyncio

from ...core._drive import adrive, drive
from ...core.record import (
    Claim,
    Completion,
    Record,
    UncertainReason,
    uncertain_kwargs,
)
from ...core.store import BaseIdempotencyStore, ClaimRequest, CompleteRequest, Held
from ...errors import StoreUnavailableError
from ._clients import (
    AsyncClient,
    SyncClient,
    _check_retries,
    _client_options,
    _Clients,
    _cluster_url,
)
from ._describe import describe_servers, time_ms
from ._durability import CLEAN, _Durability
from ._listing import ascan, oldest_first, scan
from ._scripts import (
    _ABANDON_SCRIPT,
    _CLAIM_SCRIPT,
    _COMPLETE_SCRIPT,
    _DELETE_SCRIPT,
    _MARK_EFFECT_SCRIPT,
    _PROBE_SCRIPT,
    _RAW,
    _RELEASE_SCRIPT,
    _RENEW_SCRIPT,
    _abandon_args,
    _aexecute,
    _aexecute_many,
    _claim_args,
    _complete_args,
    _execute,
    _execute_many,
    _held_args,
    _Script,
    _to_record,
)
from ._watch import awatch_once, watch_once

__all__ = ["RedisIdempotencyStore"]


@dataclass(frozen=True, slots=True)
class _Eval:
    """A round trip of :meth:`RedisIdempotencyStore._claims`: one script on one key, and
    the ``WAIT`` sent right behind it; answered ``(reply, acknowledgements)``."""

    script: _Script
    key: str
    args: Sequence[Any]
    wait: tuple[Any, ...] | None = None


@dataclass(frozen=True, slots=True)
class _EvalMany:
    """The claim script once per ``(redis key, args)`` in one pipeline (``key``: the first
    request's, for retries and errors); answered ``(replies, acknowledgements)``."""

    key: str
    calls: Sequence[tuple[str, Sequence[Any]]]
    wait: tuple[Any, ...] | None


_Trip = _Eval | _EvalMany
T = TypeVar("T")


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
        durability = _Durability.of(replicas, replica_timeout, cluster=cluster)
        self._setup(prefix, durability, _Clients(sync_client=client, async_client=async_client))

    def _setup(self, prefix: str, durability: _Durability, clients: _Clients) -> None:
        if "{" in prefix or "}" in prefix:
            raise ValueError(f"prefix must not contain braces (Cluster hash tags): {prefix!r}")
        self._prefix = prefix
        self._head = prefix + "{"
        self._durability = durability
        self._clients = clients

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
        url, cluster = _cluster_url(url, cluster)
        options = _client_options(
            socket_timeout,
            socket_connect_timeout,
            health_check_interval,
            max_connections,
            client_kwargs,
        )
        _check_retries(retries)
        durability = _Durability.of(replicas, replica_timeout, cluster=bool(cluster))
        store = cls.__new__(cls)
        clients = _Clients.on_url(url, cluster=bool(cluster), options=options, retries=retries)
        store._setup(prefix, durability, clients)
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
        options = _client_options(
            socket_timeout,
            socket_connect_timeout,
            health_check_interval,
            max_connections,
            client_kwargs,
        )
        durability = _Durability.of(replicas, replica_timeout, cluster=False)
        store = cls.__new__(cls)
        clients = _Clients.on_sentinel(
            sentinels,
            service_name,
            options=options,
            sentinel_kwargs=sentinel_kwargs,
            retries=retries,
        )
        store._setup(prefix, durability, clients)
        return store

    @property
    def prefix(self) -> str:
        return self._prefix

    # -- clients ------------------------------------------------------------------------

    def _sync(self) -> Any:  # SyncClient; redis-py's methods are untyped
        return self._clients.sync()

    def _async(self) -> Any:  # AsyncClient
        return self._clients.async_()

    def _rkey(self, key: str) -> str:
        return f"{self._head}{key}}}"

    # -- one round trip -----------------------------------------------------------------

    def _eval(self, script: _Script, key: str, args: Sequence[Any]) -> Any:
        return self._eval_acked(script, key, args, wait=None)[0]

    def _eval_acked(
        self, script: _Script, key: str, args: Sequence[Any], wait: tuple[Any, ...] | None
    ) -> tuple[Any, int | None]:
        """The script's reply, and the replicas' acknowledgement count when ``wait`` is a
        ``WAIT`` command (sent right behind the script on the same connection)."""
        rkey = self._rkey(key)
        answer = self._clients.call(key, lambda: self._send(script, rkey, args, wait))
        if not self._clients.eviction_checked:
            self._clients.check_eviction()
        return answer

    def _send(
        self, script: _Script, rkey: str, args: Sequence[Any], wait: tuple[Any, ...] | None
    ) -> tuple[Any, int | None]:
        """One attempt: no retry, redis-py's errors as they are."""
        client = self._clients.sync()
        fast = self._clients.fast
        if fast is not None:
            return fast.evalsha(script, rkey, args, wait)
        return _execute(client, script, rkey, args, wait)

    async def _aeval(self, script: _Script, key: str, args: Sequence[Any]) -> Any:
        return (await self._aeval_acked(script, key, args, wait=None))[0]

    async def _aeval_acked(
        self, script: _Script, key: str, args: Sequence[Any], wait: tuple[Any, ...] | None
    ) -> tuple[Any, int | None]:
        client = self._async()
        answer = await self._clients.acall(
            key, lambda: _aexecute(client, script, self._rkey(key), args, wait)
        )
        if not self._clients.eviction_checked:
            await self._clients.acheck_eviction(client)
        return answer

    # -- the claims: one flow, two runners -----------------------------------------------

    # A claim, a batch and the give-back of a claim too few replicas acknowledged are one
    # generator (:meth:`_claims`) that yields the round trips it needs (:class:`_Eval`,
    # :class:`_EvalMany`) and decides on their replies; :meth:`_run` / :meth:`_arun`
    # perform them through the library's one driver (:mod:`...core._drive`), with the same
    # retries and error translation as every operation, and throw a store error back into
    # the flow.

    def _run(self, flow: Generator[_Trip, Any, T]) -> T:
        return drive(flow, self._trip, Exception)

    async def _arun(self, flow: Generator[_Trip, Any, T]) -> T:
        return await adrive(flow, self._atrip, Exception)

    def _trip(self, trip: _Trip) -> tuple[Any, int | None]:
        if isinstance(trip, _Eval):
            return self._eval_acked(trip.script, trip.key, trip.args, trip.wait)
        answer = self._clients.call(trip.key, lambda: self._send_many(trip))
        if not self._clients.eviction_checked:
            self._clients.check_eviction()
        return answer

    async def _atrip(self, trip: _Trip) -> tuple[Any, int | None]:
        if isinstance(trip, _Eval):
            return await self._aeval_acked(trip.script, trip.key, trip.args, trip.wait)
        client = self._async()
        answer = await self._clients.acall(
            trip.key, lambda: _aexecute_many(client, _CLAIM_SCRIPT, trip.calls, trip.wait)
        )
        if not self._clients.eviction_checked:
            await self._clients.acheck_eviction(client)
        return answer

    def _send_many(self, trip: _EvalMany) -> tuple[builtins.list[Any], int | None]:
        """One attempt of a batch, on the fast path where the client has one."""
        fast = self._clients.fast
        if fast is not None:
            return fast.evalsha_many(_CLAIM_SCRIPT, trip.calls, trip.wait)
        return _execute_many(self._sync(), _CLAIM_SCRIPT, trip.calls, trip.wait)

    def _claims(self, requests: Sequence[ClaimRequest]) -> Generator[_Trip, Any, list[Claim]]:
        """Every claim, answered in order as sequential claims would be. One request is one
        script call (on the fast path); more are the claim script once per request in one
        pipeline (one round trip per node a Cluster spreads the keys over), under the same
        whole-operation retry, error translation and ``WAIT``. A retry resends every claim:
        a claim the first attempt made is then OWNED by the same owner token (same fence)."""
        wait, first = self._durability.wait, requests[0]
        unacked: StoreUnavailableError | None
        if len(requests) == 1:
            reply = yield _Eval(_CLAIM_SCRIPT, first.key, _claim_args(first), wait)
            claim, unacked = self._durability.claim(first.key, *reply)
            claims, written = [claim], [(first, claim)]
        else:
            calls = [(self._rkey(r.key), _claim_args(r)) for r in requests]
            replies, acks = yield _EvalMany(first.key, calls, wait)
            claims, short = self._durability.claims(requests, replies, acks)
            written = short or []
            given_back = [claim for _, claim in written]
            unacked = (
                None
                if short is None
                else self._durability.error("claim", first.key, acks, given_back)
            )
        if unacked is not None:
            for r, claim in written:
                yield from self._give_back(r, claim)
            raise unacked
        return claims

    def _give_back(self, request: ClaimRequest, claim: Claim) -> Generator[_Trip, Any, None]:
        """A claim too few replicas acknowledged is given back before the error is raised:
        a fresh attempt (ACQUIRED, RETRY: nothing ran since the key was clean) is released;
        a TAKEOVER (or OWNED: a re-claim that may repeat one) is abandoned, which keeps its
        effect mark, so the next claim is as uncertain as this one was, never a clean
        start."""
        held = Held(request.key, request.owner, claim.fence)
        with contextlib.suppress(StoreUnavailableError):
            if claim.outcome in CLEAN:
                yield _Eval(_RELEASE_SCRIPT, request.key, _held_args(held))
            else:
                args = _abandon_args(held, **uncertain_kwargs(claim))
                yield _Eval(_ABANDON_SCRIPT, request.key, args)

    # -- record operations --------------------------------------------------------------

    def claim(self, request: ClaimRequest) -> Claim:
        return self._run(self._claims([request]))[0]

    async def aclaim(self, request: ClaimRequest) -> Claim:
        return (await self._arun(self._claims([request])))[0]

    def claim_many(self, requests: Sequence[ClaimRequest]) -> builtins.list[Claim]:
        return self._run(self._claims(requests)) if requests else []

    async def aclaim_many(self, requests: Sequence[ClaimRequest]) -> builtins.list[Claim]:
        return await self._arun(self._claims(requests)) if requests else []

    def renew(self, held: Held, lease_ms: int) -> bool:
        return bool(self._eval(_RENEW_SCRIPT, held.key, _held_args(held, lease_ms)))

    async def arenew(self, held: Held, lease_ms: int) -> bool:
        return bool(await self._aeval(_RENEW_SCRIPT, held.key, _held_args(held, lease_ms)))

    def complete(self, request: CompleteRequest) -> Completion:
        key, wait = request.key, self._durability.wait
        reply, acks = self._eval_acked(_COMPLETE_SCRIPT, key, _complete_args(request), wait)
        return self._durability.completion(key, request.payload, reply, acks)

    async def acomplete(self, request: CompleteRequest) -> Completion:
        key, wait = request.key, self._durability.wait
        reply, acks = await self._aeval_acked(_COMPLETE_SCRIPT, key, _complete_args(request), wait)
        return self._durability.completion(key, request.payload, reply, acks)

    def release(self, held: Held) -> bool:
        return bool(self._eval(_RELEASE_SCRIPT, held.key, _held_args(held)))

    async def arelease(self, held: Held) -> bool:
        return bool(await self._aeval(_RELEASE_SCRIPT, held.key, _held_args(held)))

    def abandon(
        self, held: Held, reason: UncertainReason = "cancelled", error_type: str | None = None
    ) -> bool:
        args = _abandon_args(held, reason, error_type)
        return bool(self._eval(_ABANDON_SCRIPT, held.key, args))

    async def aabandon(
        self, held: Held, reason: UncertainReason = "cancelled", error_type: str | None = None
    ) -> bool:
        args = _abandon_args(held, reason, error_type)
        return bool(await self._aeval(_ABANDON_SCRIPT, held.key, args))

    def mark_effect(self, held: Held) -> bool:
        args, wait = _held_args(held), self._durability.wait
        reply, acks = self._eval_acked(_MARK_EFFECT_SCRIPT, held.key, args, wait)
        return self._durability.mark(held.key, reply, acks)

    async def amark_effect(self, held: Held) -> bool:
        args, wait = _held_args(held), self._durability.wait
        reply, acks = await self._aeval_acked(_MARK_EFFECT_SCRIPT, held.key, args, wait)
        return self._durability.mark(held.key, reply, acks)

    def get(self, key: str) -> Record | None:
        fields = self._clients.call(
            key, lambda: self._sync().execute_command("HGETALL", self._rkey(key), **_RAW)
        )
        return _to_record(key, fields) if fields else None

    async def aget(self, key: str) -> Record | None:
        client = self._async()
        fields = await self._clients.acall(
            key, lambda: client.execute_command("HGETALL", self._rkey(key), **_RAW)
        )
        return _to_record(key, fields) if fields else None

    # -- wake-ups -----------------------------------------------------------------------

    def watch(self, key: str, *, fence: int, timeout: float) -> None:
        deadline, rkey = time.monotonic() + timeout, self._rkey(key)

        def probe() -> Any:
            return self._send(_PROBE_SCRIPT, rkey, (fence,), None)

        self._clients.call(key, lambda: watch_once(self._sync(), rkey, deadline, probe))

    async def awatch(self, key: str, *, fence: int, timeout: float) -> None:
        deadline, rkey = time.monotonic() + timeout, self._rkey(key)

        async def once() -> None:
            client = self._async()
            probe = lambda: _aexecute(client, _PROBE_SCRIPT, rkey, (fence,), None)  # noqa: E731
            await awatch_once(client, rkey, deadline, probe)

        await self._clients.acall(key, once)

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
        found = self._clients.call(
            None, lambda: scan(self._sync(), self._head, namespace, thread_id)
        )
        return oldest_first(found, limit)

    async def alist(
        self,
        *,
        namespace: str | None = None,
        thread_id: str | None = None,
        limit: int | None = None,
    ) -> builtins.list[Record]:
        found = await self._clients.acall(
            None, lambda: ascan(self._async(), self._head, namespace, thread_id)
        )
        return oldest_first(found, limit)

    async def apurge(self, *, thread_id: str, namespace: str | None = None) -> int:
        n = 0
        for rec in await self.alist(namespace=namespace, thread_id=thread_id):
            n += await self.adelete(rec.key)
        return n

    # -- closing ------------------------------------------------------------------------

    def close(self) -> None:
        """Return this store's connections; clients it built are closed (and rebuilt on use).

        Call it when no operation is in flight. Clients passed in are left open.
        """
        self._clients.close()

    async def aclose(self) -> None:
        """:meth:`close`, plus the async client this store built for the running loop."""
        await self._clients.aclose()

    # -- the store's clock and facts (for the CLI and ``doctor``) ----------------------

    def now_ms(self) -> int:
        """The server's clock in milliseconds (``TIME``): the clock leases are written on.

        On a Cluster, the clock of redis-py's default node (each record's lease is judged
        by the node that holds it; keep the nodes' clocks in sync). Retried and translated
        like every operation: an unreachable server raises
        :class:`~langchain_idempotent.errors.StoreUnavailableError`.
        """
        reply = self._clients.call(None, lambda: self._sync().execute_command("TIME"))
        return time_ms(reply)

    async def anow_ms(self) -> int:
        client = self._async()
        reply = await self._clients.acall(None, lambda: client.execute_command("TIME"))
        return time_ms(reply)

    def describe(self) -> dict[str, Any]:
        """What the servers behind this store say about themselves, for ``doctor``.

        ``{"kind": "redis", "topology": "standalone" | "sentinel" | "cluster", "prefix",
        "replicas" (the ``replicas=`` this store waits for), "servers": [...]}``: one entry
        per server the store writes to (see :mod:`._describe`). No password. Uses the
        store's own sync client.
        """
        topology, servers = self._clients.call(None, lambda: describe_servers(self._sync()))
        return {
            "kind": "redis",
            "topology": topology,
            "prefix": self._prefix,
            "replicas": self._durability.replicas,
            "servers": servers,
        }
