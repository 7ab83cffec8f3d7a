"""Replica acknowledgement for the Redis store (``replicas=``; the store's spec, "Durability").

:class:`_Durability` says how many replicas must acknowledge a write and how long to wait
(the ``WAIT`` command sent right behind a script on the same connection), and what each
write does when fewer did: a claim that wrote a lease is given back (released when it
started from a clean key, abandoned when it took over an uncertain one) and raises, so the
tool does not run; a completion stays stored on the master and raises; a side-effect mark
raises, so the side effect does not start. An expected "no" (a claim that wrote nothing, a
completion that found another result) is never an acknowledgement failure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ...core._durations import to_seconds
from ...core.record import Claim, ClaimOutcome, Completion
from ...core.store import ClaimRequest
from ...errors import StoreUnavailableError
from ._scripts import _to_claim, _to_completion

__all__ = ["CLEAN", "_Durability"]

#: Claim outcomes that wrote a lease (and so are worth a replica's acknowledgement).
_WRITTEN = frozenset(
    {ClaimOutcome.ACQUIRED, ClaimOutcome.TAKEOVER, ClaimOutcome.RETRY, ClaimOutcome.OWNED}
)
#: Claims that started from a clean key: given back by a release (the others, a TAKEOVER
#: or an OWNED re-claim, by an abandon that keeps the key as uncertain as it was).
CLEAN = frozenset({ClaimOutcome.ACQUIRED, ClaimOutcome.RETRY})


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

    def error(
        self, what: str, key: str, acks: int | None, given_back: Sequence[Claim] = ()
    ) -> StoreUnavailableError:
        """The error for a write too few replicas acknowledged; for a claim, ``given_back``
        are the claims given back (released when clean, else abandoned: still uncertain)."""
        clean = [c.outcome in CLEAN for c in given_back]
        claim = "the claim was released and the tool was not run"
        if clean and not any(clean):
            claim = (
                "the claim was given back with its outcome still unknown (not released: the "
                "next claim takes over and reconciles) and the tool was not run"
            )
        elif not all(clean):
            claim = (
                "the fresh claims were released, the takeovers given back with their "
                "outcome still unknown, and no tool was run"
            )
        after = {"claim": claim, "side-effect mark": "the side effect was not started"}.get(
            what, "the result is stored on the master, but a failover now could lose it"
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
        timeout_ms = round(to_seconds(timeout, "replica_timeout", allow_zero=True) * 1000)
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

    # -- what a write does when too few replicas acknowledged it --------------------------

    def claims(
        self, requests: Sequence[ClaimRequest], replies: Sequence[Any], acks: int | None
    ) -> tuple[list[Claim], list[tuple[ClaimRequest, Claim]] | None]:
        """The batch's claims, and when too few replicas acknowledged them the ones that
        wrote a record (to release before raising), as :meth:`claim` for one."""
        claims = [_to_claim(reply, r.key) for reply, r in zip(replies, requests, strict=True)]
        if not self.short(acks):
            return claims, None
        return claims, [
            (r, c) for r, c in zip(requests, claims, strict=True) if c.outcome in _WRITTEN
        ]

    def claim(
        self, key: str, reply: Any, acks: int | None
    ) -> tuple[Claim, StoreUnavailableError | None]:
        """The claim, and the error to raise after releasing it when it wrote the record
        but too few replicas acknowledged that."""
        claim = _to_claim(reply, key)
        if self.short(acks) and claim.outcome in _WRITTEN:
            return claim, self.error("claim", key, acks, [claim])
        return claim, None

    def completion(self, key: str, payload: bytes, reply: Any, acks: int | None) -> Completion:
        """The completion; raises when it stored the result but too few replicas have it."""
        completion = _to_completion(reply, payload, key)
        if self.short(acks) and completion.stored:
            raise self.error("completion", key, acks)
        return completion

    def mark(self, key: str, reply: Any, acks: int | None) -> bool:
        """Whether the side-effect mark was written; raises when it was but too few
        replicas have it (the side effect must not start)."""
        if self.short(acks) and reply == 1:
            raise self.error("side-effect mark", key, acks)
        return bool(reply)
