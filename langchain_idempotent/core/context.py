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

``get_idempotency_context().step(name, fn, *args, **kwargs)`` (``await ctx.astep(...)`` in
an async tool; module-level :func:`step` / :func:`astep`) journals one effect inside the
tool under the call's key: LangGraph re-executes a tool from its first line after
``interrupt()`` (and a retry after a later step failed runs it again), and a completed
step then returns its stored result without running. Each step is a record of its own,
keyed by the call's key and the step's name, claimed and completed through the same
store protocol as a call (stored like a result, encrypted where encryption is on): a step
that began and never finished (its worker died) is an uncertain outcome, handled as a
takeover of a call is (``reconcile=`` is asked, told the step's name; else ``on_expired``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from types import FunctionType, MethodType, TracebackType
from typing import Any

from ._frozen import fast_init

__all__ = [
    "IdempotencyContext",
    "astep",
    "get_idempotency_context",
    "idempotency_scope",
    "side_effect",
    "step",
]


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
    #: The type of the ``interrupt()`` that paused an earlier attempt after it had entered
    #: its block (this run resumed it): entering the block again is an unknown outcome.
    paused: str | None = None
    mark: Callable[[], bool] | None = None
    amark: Callable[[], Awaitable[bool]] | None = None


#: How the engine runs one step: ``(name, fn, args, kwargs) -> result`` (sync), and the
#: async twin (its ``fn`` may return an awaitable).
StepRunner = Callable[[str, Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any]
AsyncStepRunner = Callable[
    [str, Callable[..., Any], tuple[Any, ...], dict[str, Any]], Awaitable[Any]
]


@dataclass(slots=True)
class _Journal:
    """One run's steps: the function each name was given (a name is one step per call),
    and how the engine runs a step (``None`` for an unprotected run: no record, the step
    just runs)."""

    tool: str | None = None
    seen: dict[str, object] = field(default_factory=dict)
    run: StepRunner | None = None
    arun: AsyncStepRunner | None = None


@fast_init
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
    _journal: _Journal = field(default_factory=_Journal, repr=False, compare=False)

    @property
    def entered(self) -> bool:
        """True once this run entered its :meth:`side_effect` block (the mark is stored)."""
        return self._boundary.entered

    def side_effect(self) -> SideEffect:
        """The side-effect boundary: ``with ctx.side_effect(): call_the_api()`` (``async
        with`` in an async tool). Entering it stores, before the block runs, that this
        attempt's effect may be crossing; see the module docstring."""
        return SideEffect(self)

    def step(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` once for this call as the step ``name`` and return its
        result; when the tool runs again for the same call (resumed after ``interrupt()``,
        retried after a later step failed) a completed step returns its stored result
        without running. See the module docstring."""
        journal = self._journal
        self._check_step(name, fn, asynchronous=False)
        if journal.run is None:
            return fn(*args, **kwargs)
        return journal.run(name, fn, args, kwargs)

    async def astep(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """The async twin of :meth:`step`: ``fn`` may be a coroutine function or a plain one."""
        journal = self._journal
        self._check_step(name, fn, asynchronous=True)
        if journal.arun is None:
            if journal.run is not None:  # a sync driver: run the step through it
                return await _awaited(journal.run(name, fn, args, kwargs))
            return await _awaited(fn(*args, **kwargs))
        return await journal.arun(name, fn, args, kwargs)

    def _check_step(self, name: str, fn: Callable[..., Any], *, asynchronous: bool) -> None:
        """Refuse a bad step before it runs: a name that is no non-empty string, ``fn`` not
        callable, or the name already given another function in this call."""
        from ..errors import SideEffectMisuseError

        what = "astep" if asynchronous else "step"
        if not isinstance(name, str) or not name:
            raise SideEffectMisuseError(
                f"{what}() needs a non-empty string name first, got {name!r}: the name is "
                "the step's identity within the call (e.g. ctx.step('refund', send_refund, ...))",
                key=self.key,
            )
        if not callable(fn):
            raise SideEffectMisuseError(
                f"{what}({name!r}, ...) needs a function to run, got {type(fn).__name__}",
                key=self.key,
            )
        seen = self._journal.seen
        identity = _identity(fn)
        first = seen.setdefault(name, identity)
        if first != identity:  # (a bound method is made anew each time: compared equal)
            raise SideEffectMisuseError(
                f"step {name!r} was already run with another function in this call of tool "
                f"{self._journal.tool!r}: a step's name is its identity (its stored result is "
                "returned for the name), so give each step of a call its own name",
                key=self.key,
            )

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


def _identity(fn: Callable[..., Any]) -> object:
    """What makes two functions the same step's: the code they run (a lambda re-created on
    each run is the same step; two lambdas are not), else the callable itself."""
    target = fn.__func__ if isinstance(fn, MethodType) else fn
    return target.__code__ if isinstance(target, FunctionType) else target


async def _awaited(value: Any) -> Any:
    """``value``, awaited when it is awaitable (an ``astep`` may be given a plain function)."""
    import inspect

    return await value if inspect.isawaitable(value) else value


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
        if gate.paused is not None and not gate.keyed:
            from ..errors import OutcomeUnknownError

            raise OutcomeUnknownError(
                f"side_effect() entered again in tool {gate.tool!r}, re-executed after "
                f"{gate.paused} paused an earlier run that had already entered its block: "
                "that effect may have happened, and running the block again would be a blind "
                "second run. Journal the effect as a step (ctx.step('name', fn, ...)) so a "
                "resume returns its stored result; for this call, check downstream and run "
                f"`langchain-idempotent resolve {ctx.key}`",
                key=ctx.key,
            )
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


def _inside(what: str) -> IdempotencyContext:
    """The running call's context, or a clear error naming ``what`` was used outside one
    (or in an ``effect="read"`` tool, which has no record)."""
    ctx = _current.get()
    if ctx is None:
        from ..errors import SideEffectMisuseError

        read = _passthrough.get()
        if read is not None:
            raise SideEffectMisuseError(
                f"{what} used in tool {read!r}, declared effect='read': a read has no "
                "side effect to journal; declare another effect class (e.g. 'keyed') instead",
                key=None,
            )
        raise SideEffectMisuseError(
            f"{what} used outside an idempotent tool call: wrap the tool with "
            "idempotent(...) (or IdempotencyMiddleware) and call it from inside the tool",
            key=None,
        )
    return ctx


def side_effect() -> SideEffect:
    """``get_idempotency_context().side_effect()``, with a clear error outside an
    idempotent call (or in an ``effect="read"`` tool, which has no record to mark)."""
    return _inside("side_effect()").side_effect()


def step(name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """``get_idempotency_context().step(name, fn, ...)``, with a clear error naming the
    step outside an idempotent call (nothing runs)."""
    return _inside(f"step({name!r})").step(name, fn, *args, **kwargs)


async def astep(name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """``await get_idempotency_context().astep(name, fn, ...)``, with the same errors as
    :func:`step`."""
    return await _inside(f"astep({name!r})").astep(name, fn, *args, **kwargs)


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
