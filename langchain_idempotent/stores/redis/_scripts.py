"""The wire contract of the Redis store: the Lua scripts, how they are sent, what they return.

Each script is one store operation, run atomically on the server that holds the record
(claim, renew, complete, release, abandon and mark_effect implement the decision table of
:mod:`langchain_idempotent.core.protocol`): the shared :data:`_PRELUDE` (the server clock, and
``load``, which refuses anything that is not a record of this format) followed by one body,
headed by comments naming its ``KEYS``, ``ARGV`` and reply. The argument builders
(:func:`_claim_args`, :func:`_complete_args`) write ``ARGV`` in that order; the decoders
(:func:`_to_claim`, :func:`_to_completion`, :func:`_to_record`, :func:`_to_records`) read
the replies, and turn anything unexpected into
:class:`~langchain_idempotent.errors.CorruptRecordError`.

A script is sent as ``EVALSHA`` and, on ``NOSCRIPT`` (after ``SCRIPT FLUSH``, a restart, a
failover), once as ``EVAL`` with its source, which also caches it. Replies are always raw
bytes, whatever the client's ``decode_responses``: a stored payload is handed back exactly.
:func:`_execute` and :func:`_aexecute` do that through a client's ``execute_command``
(Cluster, async and single-connection clients); the sync fast path
(:mod:`._fastpath`) sends the same commands on a connection it holds.

(redis-py's ``register_script`` would do the ``NOSCRIPT`` fallback too, but it calls
``evalsha`` with no way to ask for raw bytes, so a ``decode_responses=True`` client would
decode the payload, and it reloads with a separate ``SCRIPT LOAD`` round trip.)
"""

from __future__ import annotations

import hashlib
import logging
import typing
from collections.abc import Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from redis.client import NEVER_DECODE
from redis.exceptions import NoScriptError, ResponseError

from ...core._drive import adrive, drive
from ...core.record import (
    FORMAT_VERSION,
    Claim,
    ClaimOutcome,
    Completion,
    EffectMark,
    Record,
    State,
    UncertainReason,
    abandoned_owner,
    parse_reason,
)
from ...core.store import ClaimRequest, CompleteRequest, Held
from ...errors import CorruptRecordError

_log = logging.getLogger("langchain_idempotent.stores.redis")
#: Ask redis-py for raw bytes whatever the client's ``decode_responses``.
_RAW: dict[str, Any] = {NEVER_DECODE: True}
_VERSION = str(FORMAT_VERSION)
_STATES = {s.value.encode(): s for s in State}
_OUTCOMES = {o.value.encode(): o for o in ClaimOutcome}
_EFFECTS: dict[bytes, EffectMark] = {e.encode(): e for e in typing.get_args(EffectMark)}

# -- Lua ---------------------------------------------------------------------------------

_PRELUDE = """
-- Shared by every script.
-- now_ms(): the server clock in milliseconds, never a client's.
-- load(key, version): the record as a table, or nil when the key is absent, or
--   nil plus a reason when the key holds something that is not a record of this format.
-- holds(rec, owner, fence): whether rec is RUNNING under that owner token at that fence
--   (owner and fence as ARGV strings): the compare before every owner's write.
-- add_meta(fields, first): append ARGV[first..] (name, value pairs) to an HSET field
--   list as m:<name>, value.
-- add_payload(fields, payload): append the payload to an HSET field list in pieces of at
--   most 64 bytes, payload, payload:2, payload:3, ..., so that a record of a small result
--   stays one compact listpack under Redis' default hash-max-listpack-value (64): a
--   longer value turns the whole hash into a hash table, about 2.5 times the bytes. A
--   payload of more than 96 pieces (6 KiB) is one field: the hash would outgrow
--   hash-max-listpack-entries (128) anyway, and a hash table's field costs ~50 bytes.
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
                        'fingerprint', 'attempt', 'payload', 'effect')
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
               fingerprint = f[6], attempt = int(f[7]), payload = f[8], effect = f[9]}
  if not rec.effect then  -- the layout of development builds before the first release
    return nil, 'no effect mark (a development build before 0.1.0 wrote it)'
  end
  if not (rec.effect == 'unmarked' or rec.effect == 'before' or rec.effect == 'entered') then
    return nil, 'unknown effect mark'
  end
  if not (rec.owner and rec.fence and rec.lease_until and rec.fingerprint and rec.attempt) then
    return nil, 'missing or malformed fields'
  end
  if done and not rec.payload then return nil, 'result without payload' end
  if rec.payload then
    local pieces, n = {rec.payload}, 2
    while true do
      local piece = redis.call('HGET', key, 'payload:' .. n)
      if not piece then break end
      pieces[n], n = piece, n + 1
    end
    rec.payload = table.concat(pieces)
  end
  return rec
end

local function holds(rec, owner, fence)
  return rec and rec.state == 'running' and rec.owner == owner and rec.fence == tonumber(fence)
end

local function add_meta(fields, first)
  for i = first, #ARGV, 2 do
    fields[#fields + 1] = 'm:' .. ARGV[i]
    fields[#fields + 1] = ARGV[i + 1]
  end
  return fields
end

local function add_payload(fields, payload)
  local size = string.len(payload)
  if size <= 64 or size > 64 * 96 then
    fields[#fields + 1] = 'payload'
    fields[#fields + 1] = payload
    return fields
  end
  for at = 1, size, 64 do
    fields[#fields + 1] = at == 1 and 'payload' or 'payload:' .. (at + 63) / 64
    fields[#fields + 1] = string.sub(payload, at, at + 63)
  end
  return fields
end
"""

_CLAIM = """
-- claim: replay, acquire, take over (or retry), or report busy / mismatch / expired,
-- atomically (protocol.decide_claim).
-- KEYS[1]   the record hash
-- ARGV[1]   owner token           ARGV[2] fingerprint of the arguments
-- ARGV[3]   lease in ms           ARGV[4] retention (ttl) in ms
-- ARGV[5]   'takeover' or 'raise': what to do with an expired lease
-- ARGV[6]   format version
-- ARGV[7]   1 if the tool marks its side effect (the new attempt's effect 'before'), else 0
-- ARGV[8..] meta as name, value pairs (stored as m:<name> when the record is created)
-- Returns {outcome, fence, attempt, retry_after_ms, failed (0/1), payload (replay only)};
-- takeover, retry and expired add {.., '', reason, entered (0/1)}: reason 'lease_expired',
-- or what an abandoned record's owner names after its '!' ('!cancelled' -> 'cancelled',
-- '!error:httpx.ReadTimeout' -> 'error:httpx.ReadTimeout', record.parse_reason); entered 1
-- when the previous attempt's effect mark was 'entered'. An expired attempt marked 'before'
-- never entered its side-effect block: it is retried ('retry') under either policy. A
-- takeover keeps the effect mark it found ('entered' / 'unmarked'): the key stays uncertain
-- until a completion or a release, even if the taker dies before its own block.
-- A 'CORRUPT ...' error when the key holds something else.
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
local effect = ARGV[7] == '1' and 'before' or 'unmarked'

if not rec then
  local fields = {'version', ARGV[6], 'state', 'running', 'owner', ARGV[1], 'fence', 1,
                  'lease_until', now + lease, 'fingerprint', ARGV[2], 'attempt', 1,
                  'created_at', now, 'updated_at', now, 'effect', effect}
  redis.call('HSET', key, unpack(add_meta(fields, 8)))
  redis.call('PEXPIRE', key, expire)
  return {'acquired', 1, 1, 0, 0}
end

local function take(outcome, reason, entered, mark)
  local fence, attempt = rec.fence + 1, rec.attempt + 1
  redis.call('HSET', key, 'state', 'running', 'owner', ARGV[1], 'fence', fence,
             'attempt', attempt, 'lease_until', now + lease, 'updated_at', now,
             'effect', mark or effect)
  redis.call('PEXPIRE', key, expire)
  if reason then return {outcome, fence, attempt, 0, 0, '', reason, entered} end
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
local reason = 'lease_expired'
if string.sub(rec.owner, 1, 1) == '!' then reason = string.sub(rec.owner, 2) end
if rec.effect == 'before' then return take('retry', reason, 0) end
local entered = rec.effect == 'entered' and 1 or 0
if ARGV[5] == 'raise' then
  return {'expired', rec.fence, rec.attempt, 0, 0, '', reason, entered}
end
return take('takeover', reason, entered, rec.effect)  -- the uncertainty is inherited
"""

_RENEW = """
-- renew: extend the lease while the caller still owns it (protocol.decide_renew).
-- KEYS[1]  the record hash
-- ARGV[1]  owner token   ARGV[2] fence   ARGV[3] lease in ms   ARGV[4] format version
-- Returns 1 when extended, 0 when the caller no longer owns the lease.
local key = KEYS[1]
local rec, bad = load(key, ARGV[4])
if bad then return redis.error_reply('CORRUPT ' .. bad) end
if not holds(rec, ARGV[1], ARGV[2]) then return 0 end
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
                  'lease_until', 0, 'fingerprint', ARGV[3], 'attempt', 1,
                  'created_at', now, 'updated_at', now, 'effect', 'unmarked'}
  redis.call('HSET', key, unpack(add_payload(add_meta(fields, 8), ARGV[4])))
else
  if rec.state == 'running' and rec.owner == ARGV[1] and rec.fence == fence then stale = 0 end
  local fields = {'state', state, 'owner', ARGV[1], 'fence', math.max(rec.fence, fence),
                  'lease_until', 0, 'updated_at', now}
  redis.call('HSET', key, unpack(add_payload(fields, ARGV[4])))
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
if not holds(rec, ARGV[1], ARGV[2]) then return 0 end
redis.call('HSET', key, 'state', 'free', 'owner', '', 'lease_until', 0, 'updated_at', now_ms())
redis.call('PUBLISH', key .. ':done', 'free')
return 1
"""

_ABANDON = """
-- abandon: give the key up with its outcome unknown (protocol.decide_abandon), only for the
-- current owner and fence: stays running, lease_until 0, owner '!'..reason, so the next
-- claim takes over at once and is told the reason. Wakes waiters.
-- KEYS[1]  the record hash (channel KEYS[1]..':done' is published on)
-- ARGV[1]  owner token   ARGV[2] fence   ARGV[3] format version
-- ARGV[4]  the reason, with the error type for 'error' ('error:httpx.ReadTimeout')
-- Returns 1 when abandoned, 0 when the caller was not the owner.
local key = KEYS[1]
local rec, bad = load(key, ARGV[3])
if bad then return redis.error_reply('CORRUPT ' .. bad) end
if not holds(rec, ARGV[1], ARGV[2]) then return 0 end
redis.call('HSET', key, 'owner', '!' .. ARGV[4], 'lease_until', 0, 'updated_at', now_ms())
redis.call('PUBLISH', key .. ':done', 'abandoned')
return 1
"""

_MARK_EFFECT = """
-- mark_effect: the current attempt enters its side-effect block (protocol.decide_mark_effect),
-- only for the current owner and fence.
-- KEYS[1]  the record hash
-- ARGV[1]  owner token   ARGV[2] fence   ARGV[3] format version
-- Returns 1 when marked, 0 when the caller no longer owns the lease.
local key = KEYS[1]
local rec, bad = load(key, ARGV[3])
if bad then return redis.error_reply('CORRUPT ' .. bad) end
if not holds(rec, ARGV[1], ARGV[2]) then return 0 end
redis.call('HSET', key, 'effect', 'entered', 'updated_at', now_ms())
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

_RESEAL = """
-- reseal (``langchain-idempotent rotate``, not the protocol): replace a done record's payload
-- while it holds the expected one byte for byte; nothing else changes (state, owner, fence,
-- expiry).
-- KEYS[1]  the record hash
-- ARGV[1]  the expected payload   ARGV[2] the new one   ARGV[3] format version
-- Returns 1 when replaced, 0 when the record is not a done record holding ARGV[1].
local rec, bad = load(KEYS[1], ARGV[3])
if bad or not rec or not rec.done or rec.payload ~= ARGV[1] then return 0 end
local n = 2
while redis.call('HDEL', KEYS[1], 'payload:' .. n) == 1 do n = n + 1 end
redis.call('HSET', KEYS[1], unpack(add_payload({}, ARGV[2])))
return 1
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
    """A script as sent: the prelude and one body, and the SHA1 ``EVALSHA`` names it by."""

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
_ABANDON_SCRIPT = _Script.of(_ABANDON)
_MARK_EFFECT_SCRIPT = _Script.of(_MARK_EFFECT)
_RESEAL_SCRIPT = _Script.of(_RESEAL)
_PROBE_SCRIPT = _Script.of(_PROBE)
_DELETE_SCRIPT = _Script.of(_DELETE)

# -- sending a script through a client ---------------------------------------------------


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


def _batch_steps(
    script: _Script, calls: Sequence[tuple[str, Sequence[Any]]], wait: Any
) -> Generator[list[tuple[Any, ...]], list[Any], tuple[list[Any], int | None]]:
    """A batch of ``script`` calls, one per ``(rkey, args)``, for both drivers: yields the
    commands of one pipeline without MULTI (a Cluster client's pipeline sends one per node,
    each script on its key's node), ``wait`` behind them on the same connection; is sent the
    pipeline's replies. Calls answered ``NOSCRIPT`` are sent again with ``EVAL`` (which
    caches the script) in a second pipeline. Returns the replies in call order and the
    ``WAIT`` count; the first other error reply is raised, as one call would raise it."""
    replies: list[Any] = [None] * len(calls)
    todo = list(range(len(calls)))
    for command, body in (("EVALSHA", script.sha), ("EVAL", script.source)):
        commands: list[tuple[Any, ...]] = [(command, body, 1, *_call(calls[i])) for i in todo]
        if wait is not None:
            commands.append(tuple(wait))
        answers = yield commands
        acks = _settle(replies, todo, answers, wait, command == "EVALSHA")
        if not todo:
            return replies, acks
    raise AssertionError("unreachable")  # pragma: no cover


def _call(call: tuple[str, Sequence[Any]]) -> tuple[Any, ...]:
    rkey, args = call
    return (rkey, *args)


def _execute_many(
    client: Any, script: _Script, calls: Sequence[tuple[str, Sequence[Any]]], wait: Any
) -> tuple[list[Any], int | None]:
    """One attempt of a batch (:func:`_batch_steps`) on a sync client."""
    steps = _batch_steps(script, calls, wait)
    return drive(steps, lambda commands: _pipeline(client, commands).execute(raise_on_error=False))


async def _aexecute_many(
    client: Any, script: _Script, calls: Sequence[tuple[str, Sequence[Any]]], wait: Any
) -> tuple[list[Any], int | None]:
    """:func:`_execute_many` on an async client."""
    steps = _batch_steps(script, calls, wait)
    return await adrive(steps, lambda cmds: _pipeline(client, cmds).execute(raise_on_error=False))


def _pipeline(client: Any, commands: Sequence[tuple[Any, ...]]) -> Any:
    """A pipeline (no transaction) of ``commands`` on ``client``, sync or async, not sent."""
    pipe = client.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command, **_RAW)
    return pipe


def _settle(
    replies: list[Any], todo: list[int], answers: Sequence[Any], wait: Any, first: bool
) -> int | None:
    """File one pipeline's ``answers`` into ``replies``; leave in ``todo`` the calls to send
    again with ``EVAL`` (``NOSCRIPT`` on the first pass); the ``WAIT`` count, if sent."""
    acks: int | None = None
    if wait is not None:
        *answers, last = answers
        if isinstance(last, Exception):
            raise last
        acks = int(last)
    again = []
    for i, answer in zip(todo, answers, strict=True):
        if first and isinstance(answer, NoScriptError):
            again.append(i)
        elif isinstance(answer, Exception):
            raise answer
        else:
            replies[i] = answer
    todo[:] = again
    return acks


# -- arguments and replies ---------------------------------------------------------------


def _claim_args(r: ClaimRequest) -> list[Any]:
    args: list[Any] = [r.owner, r.fingerprint, r.lease_ms, r.ttl_ms, r.on_expired, _VERSION]
    args.append(1 if r.boundary else 0)
    if r.meta:
        for name, value in r.meta.items():
            args += (name, value)
    return args


def _complete_args(r: CompleteRequest) -> list[Any]:
    args: list[Any] = [r.owner, r.fence, r.fingerprint, r.payload, 1 if r.failed else 0]
    args += (r.ttl_ms, _VERSION)
    if r.meta:
        for name, value in r.meta.items():
            args += (name, value)
    return args


def _reason(reply: Any) -> tuple[UncertainReason | None, str | None]:
    """A claim reply's reason and error type (``b"error:httpx.ReadTimeout"``), if any."""
    if len(reply) <= 6:
        return None, None
    found = parse_reason(reply[6].decode())
    if found is None:
        raise KeyError(reply[6])
    return found


def _held_args(held: Held, *before_version: int) -> tuple[Any, ...]:
    """The ``ARGV`` a holder's script starts with: owner, fence, (renew: the lease,) the
    format version."""
    return (held.owner, held.fence, *before_version, _VERSION)


def _abandon_args(
    held: Held, reason: UncertainReason, error_type: str | None = None
) -> tuple[Any, ...]:
    """The abandon script's ``ARGV``: the holder's, then the reason the abandoned owner
    names after its ``!`` (``error:httpx.ReadTimeout``), checked by ``abandoned_owner``."""
    return (*_held_args(held), abandoned_owner(reason, error_type)[1:])


def _to_claim(reply: Any, key: str) -> Claim:
    try:
        outcome = _OUTCOMES[reply[0]]
        reason, error_type = _reason(reply)
        return Claim(
            outcome,
            fence=reply[1],
            attempt=reply[2],
            retry_after_ms=reply[3],
            failed=reply[4] == 1,
            payload=reply[5] if len(reply) > 5 and outcome is ClaimOutcome.REPLAY else None,
            reason=reason,
            entered=len(reply) > 7 and reply[7] == 1,
            error_type=error_type,
        )
    except (KeyError, IndexError, TypeError, AttributeError, UnicodeDecodeError) as exc:
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


def _payload(fields: Mapping[bytes, bytes]) -> bytes | None:
    """The stored payload, joined from its pieces (``payload``, ``payload:2``, ...: see
    ``add_payload`` in :data:`_PRELUDE`), or ``None``."""
    first = fields.get(b"payload")
    if first is None:
        return None
    pieces = [first]
    while (piece := fields.get(b"payload:%d" % (len(pieces) + 1))) is not None:
        pieces.append(piece)
    return b"".join(pieces)


def _to_record(key: str, fields: Mapping[bytes, bytes]) -> Record:
    """Decode an ``HGETALL`` reply; anything but a well-formed record is corrupt."""
    try:
        if fields.get(b"version") != _VERSION.encode():
            raise ValueError(f"unknown format version {fields.get(b'version')!r}")
        if b"effect" not in fields:  # the layout of development builds before 0.1.0
            raise ValueError("no effect mark (a development build before 0.1.0 wrote it)")
        state = _STATES[fields[b"state"]]
        ints = {name: _int(fields[name]) for name in _INT_FIELDS}
        payload = _payload(fields)
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
            effect=_EFFECTS[fields[b"effect"]],
        )
    except (KeyError, ValueError, AttributeError, TypeError) as exc:
        raise CorruptRecordError(
            f"the Redis record for idempotency key {key!r} cannot be read ({exc!r}); "
            "it was not used. Inspect it, then delete it to start over "
            f"(`langchain-idempotent delete {key}`).",
            key=key,
        ) from exc


def _to_records(
    head: str,
    rkeys: Sequence[Any],
    replies: Iterable[Any],
    namespace: str | None,
    thread_id: str | None,
) -> list[Record]:
    """Decode the ``HGETALL`` replies for a batch of ``SCAN``ned keys (``head`` is the
    prefix and the opening brace): the records whose meta match. A key that vanished since
    is skipped; an unreadable or corrupt one is skipped with a warning."""
    out = []
    for rkey, fields in zip(rkeys, replies, strict=True):
        name = rkey.decode(errors="surrogateescape") if isinstance(rkey, bytes) else rkey
        key = name[len(head) : -1]
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


def _int(raw: bytes) -> int:
    if not raw.lstrip(b"-").isdigit():
        raise ValueError(f"not an integer: {raw!r}")
    return int(raw)
