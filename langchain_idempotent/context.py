"""What a running tool can know about its idempotency key.

``get_idempotency_context()`` inside a wrapped tool returns the key to pass downstream
(e.g. as Stripe's ``Idempotency-Key``), the fencing token, the attempt number and whether
this run took over an expired lease. It works in sync and async tools and inside
ToolNode's thread pool (the context travels with :mod:`contextvars`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

__all__ = ["IdempotencyContext", "get_idempotency_context", "idempotency_scope"]


@dataclass(slots=True)
class _LeaseFlag:
    lost: bool = False


@dataclass(frozen=True, slots=True)
class IdempotencyContext:
    #: The idempotency key: stable across retries, resumes and workers.
    key: str
    #: Fencing token: strictly increasing per key. A downstream system that remembers the
    #: highest fence it has seen for a key can reject writes from a stale owner.
    fence: int
    #: 1 for the first run; +1 for each takeover or re-run after a released failure.
    attempt: int
    #: True when this run took over an expired lease: the previous run may have performed
    #: the side effect, so pass ``key`` downstream and let the callee deduplicate.
    takeover: bool
    #: The owner token of this run (opaque).
    owner: str
    _lease: _LeaseFlag = field(default_factory=_LeaseFlag, repr=False, compare=False)
    #: False when the store was unreachable and ``fail_open=True`` ran the tool without a
    #: lease (``fence`` 0, ``attempt`` 0): nothing stops a duplicate run but the downstream,
    #: so pass ``key`` on and treat the call as one that may have run before.
    protected: bool = True
    #: Transactional mode (``transactional=True``, PostgreSQL store): the psycopg
    #: ``Connection`` (``AsyncConnection`` for async tools) whose open transaction the
    #: completion record will join. Write on it; do not commit. ``None`` otherwise.
    connection: Any = field(default=None, repr=False, compare=False)

    @property
    def lease_lost(self) -> bool:
        """True once a renewal found that this run no longer owns the lease."""
        return self._lease.lost

    def mark_lease_lost(self) -> None:
        """Record that a renewal found the lease gone (the engine calls this; the context
        is otherwise immutable, so every holder of it sees the flag)."""
        self._lease.lost = True

    def check_lease(self) -> None:
        """Raise :class:`LeaseLostError` if the lease was lost.

        Call it right before an irreversible step in a long tool: once another worker has
        taken over, doing the effect here too would be a duplicate.
        """
        if self._lease.lost:
            from .errors import LeaseLostError

            raise LeaseLostError(
                f"the lease on this call was lost (fence {self.fence}): another worker may "
                "have taken it over; not performing the side effect",
                key=self.key,
            )


_current: ContextVar[IdempotencyContext | None] = ContextVar(
    "langchain_idempotent_context", default=None
)
_scope: ContextVar[str | None] = ContextVar("langchain_idempotent_scope", default=None)


def get_idempotency_context() -> IdempotencyContext | None:
    """The context of the idempotent call running now, or ``None`` outside one."""
    return _current.get()


@contextmanager
def idempotency_scope(scope: str) -> Iterator[None]:
    """Give wrapped tools a scope outside a LangGraph thread.

    ``with idempotency_scope("order-123"): refund.invoke({...})`` keys the call as if it ran
    in a thread with id ``"order-123"`` (the config key ``idempotency_scope`` does the same).
    """
    if not isinstance(scope, str) or not scope:
        raise ValueError("idempotency_scope() needs a non-empty string")
    token = _scope.set(scope)
    try:
        yield
    finally:
        _scope.reset(token)


def current_scope() -> str | None:
    return _scope.get()
