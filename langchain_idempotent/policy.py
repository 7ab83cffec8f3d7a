"""``Policy``: how long leases last, how long duplicates wait, what to do when unsure.

Every field has a production default; times accept seconds (``float``) or ``timedelta``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

from .record import ExpiredPolicy
from .serde import DEFAULT_MAX_RESULT_BYTES

__all__ = ["KeyFunction", "Policy", "Scope", "seconds"]

Scope = Literal["thread", "turn", "call"]
#: A user key function: gets the call's :class:`~langchain_idempotent.keys.CallInfo`,
#: returns a string that identifies the effect.
KeyFunction = Callable[[Any], str]


def seconds(value: float | timedelta, name: str) -> float:
    s = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if not s > 0 or s != s or s == float("inf"):
        raise ValueError(f"{name} must be a positive, finite duration, got {value!r}")
    return s


@dataclass(frozen=True, kw_only=True)
class Policy:
    #: How long a claim is held without renewal; renewed every ``lease * renew_fraction``
    #: while the tool runs, so it only bounds how long a *crashed* owner blocks the key.
    lease: float | timedelta = 30.0
    #: How long records (results and leases) are kept. A human-in-the-loop thread that
    #: resumes later than this can run the tool again.
    ttl: float | timedelta = timedelta(hours=24)
    #: How long a duplicate call waits for the owner's result before ``InProgressError``.
    wait_timeout: float | timedelta = 60.0
    #: An expired lease with no result: ``"takeover"`` re-runs with the same key passed
    #: downstream; ``"raise"`` raises ``OutcomeUnknownError`` and leaves the record.
    on_expired: ExpiredPolicy = "takeover"
    #: Run the tool unprotected when the store is unreachable (default: fail closed).
    fail_open: bool = False
    #: Exceptions that are final: stored as a failed record and re-raised on replay.
    #: Any other exception releases the key so a retry runs again.
    terminal_exceptions: tuple[type[BaseException], ...] = ()
    #: Types (pydantic models, dataclasses) the tool returns that must replay as themselves.
    allowed_types: tuple[type | tuple[str, str], ...] = ()
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES
    #: Renew the lease after this fraction of it has passed.
    renew_fraction: float = 1 / 3
    #: Separates applications and tenants sharing one store.
    namespace: str = "default"
    #: What one effect is: ``"thread"``, ``"turn"``, ``"call"`` or a key function.
    scope: Scope | KeyFunction = "thread"
    #: Run the tool inside a database transaction of the store (PostgreSQL only) and write
    #: the completion in it: the tool's writes on ``get_idempotency_context().connection``
    #: and the record commit together, only while this run still owns the lease.
    transactional: bool = False

    lease_s: float = field(init=False, repr=False)
    ttl_s: float = field(init=False, repr=False)
    wait_timeout_s: float = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "lease_s", seconds(self.lease, "lease"))
        object.__setattr__(self, "ttl_s", seconds(self.ttl, "ttl"))
        object.__setattr__(self, "wait_timeout_s", _non_negative(self.wait_timeout))
        if self.ttl_s < self.lease_s:
            raise ValueError(f"ttl ({self.ttl_s}s) must be at least the lease ({self.lease_s}s)")
        if self.on_expired not in ("takeover", "raise"):
            raise ValueError(f"on_expired must be 'takeover' or 'raise', got {self.on_expired!r}")
        if not 0 < self.renew_fraction < 1:
            raise ValueError("renew_fraction must be between 0 and 1")
        if self.max_result_bytes <= 0:
            raise ValueError("max_result_bytes must be positive")
        if not isinstance(self.namespace, str) or not self.namespace:
            raise ValueError("namespace must be a non-empty string")
        if not callable(self.scope) and self.scope not in ("thread", "turn", "call"):
            raise ValueError(
                f"scope must be 'thread', 'turn', 'call' or a function, got {self.scope!r}"
            )
        if not isinstance(self.transactional, bool):
            raise ValueError(f"transactional must be True or False, got {self.transactional!r}")
        object.__setattr__(self, "terminal_exceptions", tuple(self.terminal_exceptions))
        object.__setattr__(self, "allowed_types", tuple(self.allowed_types))

    @property
    def lease_ms(self) -> int:
        return max(1, int(self.lease_s * 1000))

    @property
    def ttl_ms(self) -> int:
        return max(1, int(self.ttl_s * 1000))

    @classmethod
    def from_kwargs(cls, base: Policy | None = None, **overrides: Any) -> Policy:
        """A policy from keyword arguments, naming any unknown one."""
        known = {f for f in cls.__dataclass_fields__ if not f.endswith("_s")}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise TypeError(
                f"unknown idempotency option(s) {', '.join(unknown)}; "
                f"known options: {', '.join(sorted(known))}"
            )
        if base is None:
            return cls(**overrides)
        values = {f: getattr(base, f) for f in known}
        values.update(overrides)
        return cls(**values)


def _non_negative(value: float | timedelta) -> float:
    s = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if not s >= 0 or s == float("inf"):
        raise ValueError(f"wait_timeout must be a finite duration >= 0, got {value!r}")
    return s
