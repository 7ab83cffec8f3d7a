"""The idempotency record and the answers the store protocol gives.

One record per key. Times are milliseconds on the *store's* clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal, get_args

from ._frozen import fast_init

__all__ = [
    "FORMAT_VERSION",
    "Claim",
    "ClaimOutcome",
    "Completion",
    "EffectMark",
    "ExpiredPolicy",
    "Record",
    "State",
    "UncertainReason",
    "abandon_kwargs",
    "abandoned_error_type",
    "abandoned_owner",
    "abandoned_reason",
    "error_type_of",
    "parse_reason",
    "uncertain_kwargs",
]

#: Version of the record layout; stored in every record and checked on read.
FORMAT_VERSION = 1

#: What a claim does with a running record whose lease has expired.
ExpiredPolicy = Literal["takeover", "raise"]

#: Where an attempt stands with its side-effect block
#: (:meth:`~langchain_idempotent.core.context.IdempotencyContext.side_effect`): ``unmarked`` the
#: tool does not mark its effect (claimed without ``boundary``: a takeover is uncertain, as
#: always); ``before`` it marks it and has not entered the block (a takeover is a free
#: retry); ``entered`` it entered the block, so the effect may have crossed.
EffectMark = Literal["unmarked", "before", "entered"]

#: Why the outcome of a previous attempt is unknown (a takeover's ``Claim.reason``):
#: ``lease_expired`` its owner stopped renewing (died, or paused past its lease: the two
#: cannot be told apart); ``cancelled`` its owner was cancelled mid-tool and said so
#: (:meth:`~langchain_idempotent.core.store.BaseIdempotencyStore.abandon`);
#: ``lease_lost`` its owner gave the call up after finding its lease gone while it ran;
#: ``error`` its tool raised an exception that does not prove nothing was sent (after
#: entering its ``side_effect()`` block, or, for an ``unsafe`` / ``irreversible`` tool
#: without a boundary, anywhere): ``Claim.error_type`` names the exception's type.
UncertainReason = Literal["lease_expired", "cancelled", "lease_lost", "error"]
_REASONS: tuple[UncertainReason, ...] = get_args(UncertainReason)

#: An abandoned record's ``owner`` is this prefix and the reason (``"!cancelled"``), and
#: for ``error`` the exception's type after a colon (``"!error:httpx.ReadTimeout"``): no
#: owner token starts with it, so the owner that gave up can no longer renew or release,
#: and its ``lease_until`` is 0, so the next claim takes over at once.
_ABANDONED = "!"
#: The longest exception type name an abandoned owner carries (longer names are cut).
_MAX_ERROR_TYPE = 200


def error_type_of(exc: BaseException) -> str:
    """The name an ``error`` abandon records for ``exc``: ``module.QualName``, the bare
    name for builtins (``TimeoutError``, ``httpx.ReadTimeout``)."""
    kind = type(exc)
    module = kind.__module__
    name = kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"
    return name[:_MAX_ERROR_TYPE]


def abandoned_owner(reason: UncertainReason, error_type: str | None = None) -> str:
    """The ``owner`` an abandoned record carries (``error_type`` only with ``"error"``)."""
    if reason not in _REASONS:
        raise ValueError(f"reason must be one of {', '.join(_REASONS)}, got {reason!r}")
    if error_type is None:
        return _ABANDONED + reason
    if reason != "error" or not isinstance(error_type, str) or not error_type:
        raise ValueError(
            f"error_type is the type name of the exception behind reason 'error' (a non-empty "
            f"string), got {error_type!r} with reason {reason!r}"
        )
    return f"{_ABANDONED}{reason}:{error_type[:_MAX_ERROR_TYPE]}"


def abandon_kwargs(reason: UncertainReason, error_type: str | None = None) -> dict[str, Any]:
    """The keyword arguments of a store's ``abandon`` for ``reason``: ``error_type`` only when
    there is one (a store written before it still serves every other reason)."""
    if error_type is None:
        return {"reason": reason}
    return {"reason": reason, "error_type": error_type}


def uncertain_kwargs(claim: Claim) -> dict[str, Any]:
    """:func:`abandon_kwargs` for giving back an unused TAKEOVER ``claim`` as uncertain as
    it found the key: its reason (``"lease_expired"`` if none) and error type."""
    return abandon_kwargs(claim.reason or "lease_expired", claim.error_type)


def parse_reason(text: str) -> tuple[UncertainReason, str | None] | None:
    """What an abandoned owner says after its ``!`` (``"error:httpx.ReadTimeout"``): the
    reason and the error type, or ``None`` when it is no reason this version knows."""
    reason, colon, error_type = text.partition(":")
    if reason not in _REASONS or (colon and (reason != "error" or not error_type)):
        return None
    return reason, error_type or None  # type: ignore[return-value]


def abandoned_reason(owner: str) -> UncertainReason | None:
    """The reason an abandoned record's ``owner`` names, or ``None`` for a real owner."""
    found = parse_reason(owner[1:]) if owner.startswith(_ABANDONED) else None
    return None if found is None else found[0]


def abandoned_error_type(owner: str) -> str | None:
    """The exception type an ``error``-abandoned record's ``owner`` names, else ``None``."""
    found = parse_reason(owner[1:]) if owner.startswith(_ABANDONED) else None
    return None if found is None else found[1]


class State(StrEnum):
    RUNNING = "running"
    """An owner holds (or held, if ``lease_until`` passed) the lease."""
    COMPLETED = "completed"
    """The result is stored; every later claim replays it."""
    FAILED = "failed"
    """A terminal error is stored; every later claim re-raises it."""
    FREE = "free"
    """Released after a retryable error; the next claim runs again with a higher fence."""


@fast_init
@dataclass(frozen=True, slots=True)
class Record:
    key: str
    state: State
    owner: str
    fence: int
    lease_until: int
    fingerprint: str
    attempt: int
    payload: bytes | None
    created_at: int
    updated_at: int
    version: int = FORMAT_VERSION
    meta: Mapping[str, str] = field(default_factory=dict)
    #: The current attempt's side-effect mark (see :data:`EffectMark`).
    effect: EffectMark = "unmarked"

    @property
    def done(self) -> bool:
        return self.state in (State.COMPLETED, State.FAILED)

    def lease_live(self, now_ms: int) -> bool:
        return self.state is State.RUNNING and self.lease_until > now_ms

    def uncertain(self, now_ms: int) -> bool:
        """Whether the last attempt started and did not finish: ``RUNNING`` with its lease
        passed or given up (its side effect may or may not have happened)."""
        return self.state is State.RUNNING and self.lease_until <= now_ms


class ClaimOutcome(StrEnum):
    REPLAY = "replay"
    """The key is completed (or failed terminally): replay the stored payload."""
    ACQUIRED = "acquired"
    """The key was absent or free: the caller owns a fresh lease and runs the tool."""
    TAKEOVER = "takeover"
    """Another owner's lease expired without a result: the caller owns it now (fence + 1)."""
    RETRY = "retry"
    """Another owner's lease expired (or was given up) before it entered its side-effect
    block: the effect never started, the caller owns a clean retry (fence + 1)."""
    OWNED = "owned"
    """The caller already owned this lease (a retried claim): granted again."""
    BUSY = "busy"
    """Another owner's lease is live: wait for it."""
    MISMATCH = "mismatch"
    """The key is known with another fingerprint: the arguments differ."""
    EXPIRED = "expired"
    """An expired lease left no result and the policy is ``raise``: outcome unknown."""

    @property
    def runs(self) -> bool:
        """Whether the claimant now holds the lease and must run the tool."""
        return self in (
            ClaimOutcome.ACQUIRED,
            ClaimOutcome.TAKEOVER,
            ClaimOutcome.RETRY,
            ClaimOutcome.OWNED,
        )


@fast_init
@dataclass(frozen=True, slots=True)
class Claim:
    outcome: ClaimOutcome
    fence: int = 0
    attempt: int = 0
    #: For BUSY: milliseconds left on the other owner's lease.
    retry_after_ms: int = 0
    #: For REPLAY: whether the stored payload is a terminal failure.
    failed: bool = False
    #: For REPLAY: the stored payload.
    payload: bytes | None = None
    #: For TAKEOVER, RETRY and EXPIRED: why the previous attempt ended without a result.
    reason: UncertainReason | None = None
    #: For TAKEOVER and EXPIRED: ``True`` when the previous attempt entered its side-effect
    #: block; ``False`` when its tool does not mark one (nobody knows how far it got).
    entered: bool = False
    #: For TAKEOVER, RETRY and EXPIRED with reason ``error``: the type of the exception the
    #: previous attempt raised (``"httpx.ReadTimeout"``).
    error_type: str | None = None


@fast_init
@dataclass(frozen=True, slots=True)
class Completion:
    #: True when this call's payload is now the stored one.
    stored: bool
    #: True when the caller was no longer the owner (its lease expired or was taken over).
    stale: bool
    #: Whether the stored payload is a failure.
    failed: bool
    #: The payload every caller sees (this call's if ``stored``).
    payload: bytes | None
