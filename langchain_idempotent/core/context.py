"""What a running tool can know about its idempotency key, and its side-effect boundary.

``get_idempotency_context()`` inside a wrapped tool returns the key to pass downstream
(e.g. as Stripe's ``Idempotency-Key``), the fencing token, the attempt number and whether
this run took over an expired lease. It works in sync and async tools and inside
ToolNode's thread pool (the context travels with :mod:`contextvars`).

``with get_idempotency_context().side_effect():`` (``async with`` in an async tool) marks
the external call: before the block runs, one store write records that the effect may be
crossing (owner and fence checked: a run that lost its lease gets ``LeaseLostError`` and
the block never runs). A takeover of an attempt that never got that far is a clean retry;
only one that entered the block is uncertain (``reconcile=``, ``on_expired``). The tool
declares it marks its effect with ``boundary=True`` (so that a crash *before* the block is
known to be one); the module-level :func:`side_effect` does the same as the method and says
clearly when it is used outside an idempotent call.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

__all__ = ["IdempotencyContext", "get_idempotency_context", "idempotency_scope", "side_effect"]


@dataclass(slots=True)
class _LeaseFlag:
    lost: bool = False


@dataclass(slots=True)
class _Boundary:
    """One run's side-effect boundary: whether the tool declared it (``boundary=True``),
    whether the block was entered or is open now, and how to mark it (set by the engine's
    driver; ``None`` for an unprotected run, which has no record to mark). ``failed``: the
    type of an exception that left a block of this run with its effect unknown (not one of
    ``resendable``, the ``not_sent=`` types, and not in a ``keyed`` tool): the block may
    not be entered again in this run."""

    declared: bool = False
    entered: bool = False
    inside: bool = False
    tool: str | None = None
    resendable: tuple[type[BaseException], ...] = ()
    keyed: bool = False
    failed: str | None = None
    mark: Callable[[], bool] | None = None
    amark: Callable[[], Awaitable[bool]] | None = None


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
    _boundary: _Boundary = field(default_factory=_Boundary, repr=False, compare=False)

    @property
    def entered(self) -> bool:
        """True once this run entered its :meth:`side_effect` block (the mark is stored)."""
        return self._boundary.entered

    def side_effect(self) -> SideEffect:
        """The side-effect boundary: ``with ctx.side_effect(): call_the_api()`` (``async
        with`` in an async tool). Entering it stores, before the block runs, that this
        attempt's effect may be crossing; see the module docstring."""
        return SideEffect(self)

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
            from ..errors import LeaseLostError

            raise LeaseLostError(
                f"the lease on this call was lost (fence {self.fence}): another worker may "
                "have taken it over; not performing the side effect",
                key=self.key,
            )


class SideEffect:
    """The context manager :meth:`IdempotencyContext.side_effect` returns (sync and async).

    Refused, before anything is marked: in a tool that did not declare ``boundary=True``
    (a takeover could not tell a crash before the block from a tool that never marks one),
    nested inside another ``side_effect()`` block of the same run, and again after a block
    of the same run raised an exception that leaves its effect unknown (sending again from
    inside the run would be a blind re-run; an exception ``not_sent=`` names, or any in a
    ``keyed`` tool, does not count). Entering it twice in a row marks once. A mark refused
    by the store (the lease was lost) raises
    :class:`~langchain_idempotent.errors.LeaseLostError`; the block does not run.
    """

    __slots__ = ("_ctx",)

    def __init__(self, ctx: IdempotencyContext) -> None:
        self._ctx = ctx

    def _open(self) -> bool:
        """Check the block may open; ``True`` when the store must be marked."""
        from ..errors import SideEffectMisuseError

        gate, ctx = self._ctx._boundary, self._ctx
        if gate.inside:
            raise SideEffectMisuseError(
                "side_effect() is already open in this run: blocks do not nest; mark the "
                "external call once, around the call itself",
                key=ctx.key,
            )
        if gate.failed is not None:
            raise SideEffectMisuseError(
                f"side_effect() entered again in tool {gate.tool!r} after its block raised "
                f"{gate.failed} in this run: that effect may have happened, and sending it "
                "again from inside the same run would be a blind re-run. Let the exception "
                "propagate (the key is kept uncertain; the next attempt asks reconcile= or "
                "on_expired decides), or name the exception in not_sent= if it proves "
                "nothing was sent",
                key=ctx.key,
            )
        if not gate.declared and ctx.protected:
            raise SideEffectMisuseError(
                f"side_effect() used in tool {gate.tool!r}, which does not declare "
                "boundary=True: pass boundary=True to idempotent() (or to the middleware's "
                "per-tool options) so a takeover can tell a crash before the block from one "
                "inside it",
                key=ctx.key,
            )
        gate.inside = True
        return not gate.entered and gate.mark is not None

    def _marked(self, ok: bool) -> None:
        gate = self._ctx._boundary
        if not ok:
            gate.inside = False
            from ..errors import LeaseLostError

            self._ctx.mark_lease_lost()
            raise LeaseLostError(
                f"the lease on this call was lost (fence {self._ctx.fence}) before its side "
                "effect: another worker may have taken it over; not performing it",
                key=self._ctx.key,
            )
        gate.entered = True

    def _fail(self) -> None:
        self._ctx._boundary.inside = False

    def _close(self, exc: BaseException | None) -> None:
        gate = self._ctx._boundary
        gate.inside = False
        if isinstance(exc, Exception) and not gate.keyed and not isinstance(exc, gate.resendable):
            from .record import error_type_of

            gate.failed = error_type_of(exc)

    def __enter__(self) -> IdempotencyContext:
        if self._open():
            assert self._ctx._boundary.mark is not None
            try:
                ok = self._ctx._boundary.mark()
            except BaseException:
                self._fail()
                raise
            self._marked(ok)
        else:
            self._ctx._boundary.entered = True
        return self._ctx

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._close(exc)

    async def __aenter__(self) -> IdempotencyContext:
        gate = self._ctx._boundary
        if self._open():
            try:
                if gate.amark is not None:
                    ok = await gate.amark()
                else:
                    assert gate.mark is not None
                    ok = gate.mark()
            except BaseException:
                self._fail()
                raise
            self._marked(ok)
        else:
            gate.entered = True
        return self._ctx

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._close(exc)


_current: ContextVar[IdempotencyContext | None] = ContextVar(
    "langchain_idempotent_context", default=None
)
_scope: ContextVar[str | None] = ContextVar("langchain_idempotent_scope", default=None)


def get_idempotency_context() -> IdempotencyContext | None:
    """The context of the idempotent call running now, or ``None`` outside one.

    ``None`` is an answer, not an error: the same tool may run wrapped and unwrapped (a
    baseline, a test, an ``effect="read"`` tool), so a tool that hands the key downstream
    guards for it::

        ctx = get_idempotency_context()
        key = ctx.key if ctx else None  # unwrapped: no key to send

    (:func:`side_effect`, which has nothing to mark outside a call, raises instead.)
    """
    return _current.get()


#: Set while a ``effect="read"`` tool runs straight through (its name): no context, no mark.
_passthrough: ContextVar[str | None] = ContextVar("langchain_idempotent_read_tool", default=None)


@contextmanager
def passthrough(tool: str) -> Iterator[None]:
    """While an ``effect="read"`` tool runs straight through (for :func:`side_effect`'s
    error)."""
    token = _passthrough.set(tool)
    try:
        yield
    finally:
        _passthrough.reset(token)


def side_effect() -> SideEffect:
    """``get_idempotency_context().side_effect()``, with a clear error outside an
    idempotent call (or in an ``effect="read"`` tool, which has no record to mark)."""
    ctx = _current.get()
    if ctx is None:
        from ..errors import SideEffectMisuseError

        read = _passthrough.get()
        if read is not None:
            raise SideEffectMisuseError(
                f"side_effect() used in tool {read!r}, declared effect='read': a read has no "
                "side effect to mark; declare another effect class (e.g. 'keyed') instead",
                key=None,
            )
        raise SideEffectMisuseError(
            "side_effect() used outside an idempotent tool call: wrap the tool with "
            "idempotent(...) (or IdempotencyMiddleware) and call it from inside the tool",
            key=None,
        )
    return ctx.side_effect()


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
