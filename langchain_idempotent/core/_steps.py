"""The steps :meth:`Engine._flow <langchain_idempotent.core.engine.Engine._flow>` yields to its
driver, and what the drivers answer: plain data, no behaviour. Nothing changes them once
made; they are not frozen because every call makes several, and a frozen dataclass sets
each field through ``object.__setattr__``, several times the cost of a plain one.

The flow yields a step (claim, watch, run, complete, release, abandon, reconcile); the
sync or async driver performs it and sends back its answer (a ``Claim``, an
:class:`_Outcome`, a ``Completion``, ...). In transactional mode the run step's
:class:`_Outcome` carries the open transaction, and the flow hands it back to the
complete (or release) step, so it travels with the steps rather than beside them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from .context import IdempotencyContext
from .events import EventHook
from .reconcile import ReconcileCall, Reconciler
from .record import UncertainReason
from .store import ClaimRequest

V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class Unmemoized(Generic[V]):
    """What an action returns for an answer that must not be stored (a handled tool error):
    the engine releases the key, so a retry runs again, and returns ``value``. ``error``
    names a handled error (an error ``ToolMessage``, an MCP ``isError`` result): it leaves
    the key uncertain where a raised exception would (``side_effect()`` entered, an
    ``unsafe`` / ``irreversible`` tool without a boundary), since the error only became a
    message after the effect may have begun."""

    value: V
    error: str | None = None


class _ClaimStep:
    __slots__ = ()


@dataclass(slots=True)
class _WatchStep:
    fence: int
    timeout: float


@dataclass(slots=True)
class _RunStep:
    #: ``protected=False`` (fence 0, no lease) when the tool runs unprotected (fail open).
    ctx: IdempotencyContext


@dataclass(slots=True)
class _CompleteStep:
    ctx: IdempotencyContext
    payload: bytes
    failed: bool
    #: Transactional mode: the run's open transaction the completion joins (``None``: a
    #: failure to record, or a reconciled result, in a transaction of its own).
    txn: Any = None


@dataclass(slots=True)
class _ReleaseStep:
    ctx: IdempotencyContext
    #: Transactional mode: the run's open transaction, rolled back with the release.
    txn: Any = None


@dataclass(slots=True)
class _AbandonStep:
    ctx: IdempotencyContext
    reason: UncertainReason
    #: With reason ``error``: the exception's type name (it travels in the record).
    error_type: str | None = None


@dataclass(slots=True)
class _ReconcileStep:
    hook: Reconciler
    call: ReconcileCall


_Step = (
    _ClaimStep | _WatchStep | _RunStep | _CompleteStep | _ReleaseStep | _AbandonStep
) | _ReconcileStep
_CLAIM = _ClaimStep()


@dataclass(slots=True)
class _Outcome:
    """What the run step answers: the action's value or exception, and in transactional
    mode the transaction still open after a successful run (for the complete step)."""

    value: Any = None
    exc: BaseException | None = None
    txn: Any = None


@dataclass(slots=True)
class _Answer:
    """A final answer found before running (a replay, a reconciled result)."""

    value: Any


@dataclass(slots=True)
class _Call:
    #: The call's claim, built once
    #: (:meth:`~langchain_idempotent.core.engine.Engine.claim_request`): its key, owner
    #: token, fingerprint and meta are the call's.
    request: ClaimRequest
    tool: str | None
    observer: EventHook | None
    reconcile: Reconciler | None
    args: Mapping[str, Any]
    thread_id: str | None
    #: The LangChain tool call id (``ToolCall["id"]``), for the events; ``None`` if none.
    call_id: str | None = None
    #: For a step journaled inside a call (``ctx.step(name, ...)``): the step's name.
    step: str | None = None

    @property
    def key(self) -> str:
        return self.request.key

    @property
    def owner(self) -> str:
        return self.request.owner

    @property
    def fingerprint(self) -> str:
        return self.request.fingerprint

    @property
    def meta(self) -> Mapping[str, str] | None:
        return self.request.meta
