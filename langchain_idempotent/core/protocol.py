"""The record protocol as pure functions: what claim, renew, complete and release decide.

No I/O here. The in-memory and SQLite stores apply these functions inside their own
critical section (a lock, ``BEGIN IMMEDIATE``); the Redis store's Lua scripts implement
the same table, and the shared contract suite (``langchain_idempotent.testing``) plus a
model-based property test hold every store to it.

claim (``rec`` is the record under ``key``, ``now`` the store clock)::

    rec absent                      -> ACQUIRED   fence 1, attempt 1
    fingerprint differs             -> MISMATCH   nothing written
    COMPLETED / FAILED              -> REPLAY     nothing written
    FREE                            -> ACQUIRED   fence + 1, attempt + 1
    RUNNING, owner is the claimant  -> OWNED      same fence, lease extended
    RUNNING, lease live             -> BUSY       retry_after = lease_until - now
    RUNNING, lease expired
        effect "before"             -> RETRY      fence + 1, attempt + 1, new owner
        policy "takeover"           -> TAKEOVER   fence + 1, attempt + 1, new owner
        policy "raise"              -> EXPIRED    nothing written (outcome unknown)

A TAKEOVER, RETRY or EXPIRED answer carries ``reason``: ``"lease_expired"``, or the reason
an abandoned record names (``"cancelled"``, ``"error"`` with its ``error_type``, ...);
TAKEOVER and EXPIRED carry ``entered``
(the effect mark was ``"entered"``, not ``"unmarked"``). Neither FREE nor an absent record is
uncertain: a released key failed in a way the tool itself reported. Every claim that
writes a new attempt on a clean record (ACQUIRED, RETRY) sets the effect mark: ``"before"``
when the claimant's tool marks its effect (``boundary=True``), else ``"unmarked"``. A record
whose attempt never entered its block (``"before"``) is not uncertain: its effect never
started, so the next claimant retries it cleanly under either policy. A TAKEOVER keeps the
mark it found (``"entered"`` or ``"unmarked"``): the uncertainty is the key's, not the
attempt's, and lasts until a completion or a release. A taker that dies before its own
block (or whose claim reply is lost) leaves the key as uncertain as it found it, so the next
claimant takes over (and reconciles) again instead of retrying as if nothing had run.

mark_effect (the tool enters its side-effect block): only while ``RUNNING`` with the
caller's owner and fence, the effect mark becomes ``"entered"``; nothing else changes.

renew: extends the lease only while ``RUNNING`` with the caller's owner and fence.

complete (write-once): the first completion is stored whoever sends it (a stale owner that
did the work has the truest result); once ``COMPLETED``/``FAILED`` nothing is overwritten
and the stored payload is returned. ``stale`` is set when the caller was not the current
owner and fence.

release: back to ``FREE`` (fence kept, so fences keep increasing) only while ``RUNNING``
with the caller's owner and fence.

abandon (an owner cancelled mid-tool, or whose tool raised after its effect may have begun,
which cannot know whether its effect happened): only while ``RUNNING`` with the caller's
owner and fence, the record stays ``RUNNING`` with ``lease_until`` 0 and ``owner`` naming
the reason (``"!cancelled"``; ``"!error:httpx.ReadTimeout"`` with the exception's type, see
:func:`~langchain_idempotent.core.record.abandoned_owner`): the next claim is a TAKEOVER at once,
with that reason (and ``error_type``), instead of a clean ACQUIRED. Fence, attempt and the
effect mark are kept.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial

from .record import (
    FORMAT_VERSION,
    Claim,
    ClaimOutcome,
    Completion,
    EffectMark,
    ExpiredPolicy,
    Record,
    State,
    UncertainReason,
    abandoned_error_type,
    abandoned_owner,
    abandoned_reason,
)

__all__ = [
    "decide_abandon",
    "decide_claim",
    "decide_complete",
    "decide_mark_effect",
    "decide_release",
    "decide_renew",
]


#: The answer to the first claim of a key: always the same (frozen) value, so made once.
_FIRST_CLAIM = Claim(ClaimOutcome.ACQUIRED, fence=1, attempt=1)


def decide_claim(
    rec: Record | None,
    *,
    key: str,
    owner: str,
    fingerprint: str,
    now: int,
    lease_ms: int,
    on_expired: ExpiredPolicy = "takeover",
    meta: Mapping[str, str] | None = None,
    boundary: bool = False,
) -> tuple[Claim, Record | None]:
    """Decide a claim. Returns the answer and the record to write (``None``: unchanged).
    ``boundary``: the claimant's tool marks its side effect (``side_effect()``)."""
    effect: EffectMark = "before" if boundary else "unmarked"
    if rec is None:
        # By position (keywords cost a third more, on every first run): Record's order.
        new = Record(
            key,
            State.RUNNING,
            owner,
            1,  # fence
            now + lease_ms,  # lease_until
            fingerprint,
            1,  # attempt
            None,  # payload
            now,  # created_at
            now,  # updated_at
            FORMAT_VERSION,
            dict(meta or {}),
            effect,
        )
        return _FIRST_CLAIM, new
    if rec.fingerprint != fingerprint:
        return Claim(ClaimOutcome.MISMATCH, fence=rec.fence, attempt=rec.attempt), None
    if rec.done:
        return (
            Claim(
                ClaimOutcome.REPLAY,
                fence=rec.fence,
                attempt=rec.attempt,
                failed=rec.state is State.FAILED,
                payload=rec.payload,
            ),
            None,
        )
    take = partial(_take, rec, owner=owner, now=now, lease_ms=lease_ms, effect=effect)
    if rec.state is State.FREE:
        return take(ClaimOutcome.ACQUIRED)
    # RUNNING
    if rec.owner == owner:
        renewed = replace(rec, lease_until=now + lease_ms, updated_at=now)
        return Claim(ClaimOutcome.OWNED, fence=rec.fence, attempt=rec.attempt), renewed
    if rec.lease_until > now:
        return (
            Claim(
                ClaimOutcome.BUSY,
                fence=rec.fence,
                attempt=rec.attempt,
                retry_after_ms=rec.lease_until - now,
            ),
            None,
        )
    return _expired(rec, take, on_expired)


def _expired(
    rec: Record, take: Callable[..., tuple[Claim, Record]], on_expired: ExpiredPolicy
) -> tuple[Claim, Record | None]:
    """A running record whose lease ended: a clean RETRY when its attempt never entered its
    side-effect block, else uncertain (TAKEOVER, or EXPIRED under ``"raise"``)."""
    reason = abandoned_reason(rec.owner) or "lease_expired"
    error_type = abandoned_error_type(rec.owner)
    if rec.effect == "before":
        return take(ClaimOutcome.RETRY, reason=reason, error_type=error_type)
    entered = rec.effect == "entered"
    if on_expired == "raise":
        expired = Claim(
            ClaimOutcome.EXPIRED,
            rec.fence,
            rec.attempt,
            reason=reason,
            entered=entered,
            error_type=error_type,
        )
        return expired, None
    # The previous attempt's effect may have happened: the new attempt inherits that.
    return take(
        ClaimOutcome.TAKEOVER,
        reason=reason,
        entered=entered,
        effect=rec.effect,
        error_type=error_type,
    )


def _take(
    rec: Record,
    outcome: ClaimOutcome,
    *,
    owner: str,
    now: int,
    lease_ms: int,
    effect: EffectMark,
    reason: UncertainReason | None = None,
    entered: bool = False,
    error_type: str | None = None,
) -> tuple[Claim, Record]:
    new = replace(
        rec,
        state=State.RUNNING,
        owner=owner,
        fence=rec.fence + 1,
        attempt=rec.attempt + 1,
        lease_until=now + lease_ms,
        payload=None,
        updated_at=now,
        effect=effect,
    )
    claim = Claim(
        outcome, new.fence, new.attempt, reason=reason, entered=entered, error_type=error_type
    )
    return claim, new


def decide_renew(
    rec: Record | None, *, owner: str, fence: int, now: int, lease_ms: int
) -> tuple[bool, Record | None]:
    """Extend the lease if the caller still owns it. Returns (renewed, record to write)."""
    if rec is None or rec.state is not State.RUNNING or rec.owner != owner or rec.fence != fence:
        return False, None
    return True, replace(rec, lease_until=now + lease_ms, updated_at=now)


def decide_complete(
    rec: Record | None,
    *,
    key: str,
    owner: str,
    fence: int,
    fingerprint: str,
    payload: bytes,
    failed: bool,
    now: int,
    meta: Mapping[str, str] | None = None,
) -> tuple[Completion, Record | None]:
    """Write-once completion. Returns the answer and the record to write."""
    if rec is not None and rec.done:
        stale = not (rec.owner == owner and rec.fence == fence)
        return Completion(
            stored=False, stale=stale, failed=rec.state is State.FAILED, payload=rec.payload
        ), None
    state = State.FAILED if failed else State.COMPLETED
    if rec is None:
        # The record expired or was evicted while the tool ran: ours is the only result.
        new = Record(
            key=key,
            state=state,
            owner=owner,
            fence=fence,
            lease_until=0,
            fingerprint=fingerprint,
            attempt=1,
            payload=payload,
            created_at=now,
            updated_at=now,
            meta=dict(meta or {}),
        )
        return Completion(stored=True, stale=True, failed=failed, payload=payload), new
    stale = not (rec.state is State.RUNNING and rec.owner == owner and rec.fence == fence)
    # Built whole rather than with ``replace`` (half as costly again, on every first run),
    # by position (keywords cost a third more): the fields in Record's order.
    new = Record(
        rec.key,
        state,
        owner,
        max(rec.fence, fence),  # fence
        0,  # lease_until
        rec.fingerprint,
        rec.attempt,
        payload,
        rec.created_at,
        now,  # updated_at
        rec.version,
        rec.meta,
        rec.effect,
    )
    return Completion(True, stale, failed, payload), new


def decide_mark_effect(
    rec: Record | None, *, owner: str, fence: int, now: int
) -> tuple[bool, Record | None]:
    """Mark that the current attempt entered its side-effect block, only for the current
    owner and fence (``False``: the lease was lost; the effect must not start)."""
    if rec is None or rec.state is not State.RUNNING or rec.owner != owner or rec.fence != fence:
        return False, None
    return True, replace(rec, effect="entered", updated_at=now)


def decide_release(
    rec: Record | None, *, owner: str, fence: int, now: int
) -> tuple[bool, Record | None]:
    """Free the key after a retryable error, only for the current owner and fence."""
    if rec is None or rec.state is not State.RUNNING or rec.owner != owner or rec.fence != fence:
        return False, None
    return True, replace(rec, state=State.FREE, owner="", lease_until=0, updated_at=now)


def decide_abandon(
    rec: Record | None,
    *,
    owner: str,
    fence: int,
    reason: UncertainReason,
    now: int,
    error_type: str | None = None,
) -> tuple[bool, Record | None]:
    """Give the key up with its outcome unknown, only for the current owner and fence: the
    next claim takes over at once and is told ``reason`` (and ``error_type``, for
    ``"error"``)."""
    gone = abandoned_owner(reason, error_type)  # checks both, whoever owns the record
    if rec is None or rec.state is not State.RUNNING or rec.owner != owner or rec.fence != fence:
        return False, None
    return True, replace(rec, owner=gone, lease_until=0, updated_at=now)
