"""The idempotency record and the answers the store protocol gives.

One record per key. Times are milliseconds on the *store's* clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

__all__ = [
    "FORMAT_VERSION",
    "Claim",
    "ClaimOutcome",
    "Completion",
    "ExpiredPolicy",
    "Record",
    "State",
]

#: Version of the record layout; stored in every record and checked on read.
FORMAT_VERSION = 1

#: What a claim does with a running record whose lease has expired.
ExpiredPolicy = Literal["takeover", "raise"]


class State(StrEnum):
    RUNNING = "running"
    """An owner holds (or held, if ``lease_until`` passed) the lease."""
    COMPLETED = "completed"
    """The result is stored; every later claim replays it."""
    FAILED = "failed"
    """A terminal error is stored; every later claim re-raises it."""
    FREE = "free"
    """Released after a retryable error; the next claim runs again with a higher fence."""


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

    @property
    def done(self) -> bool:
        return self.state in (State.COMPLETED, State.FAILED)

    def lease_live(self, now_ms: int) -> bool:
        return self.state is State.RUNNING and self.lease_until > now_ms


class ClaimOutcome(StrEnum):
    REPLAY = "replay"
    """The key is completed (or failed terminally): replay the stored payload."""
    ACQUIRED = "acquired"
    """The key was absent or free: the caller owns a fresh lease and runs the tool."""
    TAKEOVER = "takeover"
    """Another owner's lease expired without a result: the caller owns it now (fence + 1)."""
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
        return self in (ClaimOutcome.ACQUIRED, ClaimOutcome.TAKEOVER, ClaimOutcome.OWNED)


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
