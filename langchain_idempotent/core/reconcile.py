"""The reconciliation hook: ask the downstream whether an uncertain effect happened.

When an owner dies, is paused past its lease, is cancelled after its side effect but
before its result was stored, or its tool raises after the effect may have begun (a read
timeout, a reset connection, a 502 after the provider committed), nobody knows whether the
effect happened. A ``reconcile=``
hook (sync or async) is asked on every takeover of such a call, before the tool runs
again::

    def refund_status(call: ReconcileCall) -> str | None:
        r = payments.find(idempotency_key=call.key)   # did it happen?
        return f"refunded {r.amount}" if r else None  # the result, or None: run the tool

- A returned value is stored write-once as the call's result (with the taker's fence) and
  returned; the tool does not run. A paused owner that resumes later cannot overwrite it.
- ``None``: the effect did not happen; the tool runs (as a takeover, the key handed on).
- An exception: nothing is stored, the call is given back still uncertain (the next
  claimant asks again) and the exception propagates.

After an exception the tool raised, it is asked when the error left the outcome unknown
(``reason="error"``, ``error_type`` the exception's type): one raised after the
``side_effect()`` block was entered (``entered=True``), or, for an ``unsafe`` /
``irreversible`` tool without a boundary, any exception. It is never asked on a first run,
a replay, after an exception ``not_sent=`` names or one a ``keyed`` tool raised (the key
was released: a free retry), or when the previous attempt never entered its
``side_effect()`` block (a clean retry: the effect never started). With
``on_expired="raise"`` it is asked first, and ``OutcomeUnknownError`` is raised only when
it returns ``None``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .record import UncertainReason

__all__ = ["ReconcileCall", "ReconcileOption", "Reconciler", "reconciler_for"]


@dataclass(frozen=True, slots=True)
class ReconcileCall:
    """What a reconcile hook is told about one uncertain call."""

    #: The idempotency key (what the tool handed downstream as its idempotency key).
    key: str
    #: The fence this claimant holds now (for ``on_expired="raise"``: the record's fence).
    fence: int
    #: This claimant's attempt number.
    attempt: int
    #: The attempt whose outcome is unknown.
    previous_attempt: int
    #: The tool's name (``None`` for a bare :class:`~langchain_idempotent.core.engine.Engine` call).
    tool: str | None
    #: The model-visible arguments, validated through the tool's schema (read-only).
    args: Mapping[str, Any]
    #: The thread (or ``idempotency_scope``) the call belongs to.
    thread_id: str | None
    #: Why the outcome is unknown (see :data:`~langchain_idempotent.core.record.UncertainReason`).
    reason: UncertainReason
    #: ``True``: the attempt whose outcome is unknown entered its ``side_effect()`` block
    #: (the effect may have crossed; a taker that vanished unsettled passes it on).
    #: ``None``: the tool does not mark its effect, so nobody knows how far it got. (An
    #: attempt that never entered its block is retried without asking.)
    entered: bool | None = None
    #: For ``reason="error"``: the type of the exception the attempt raised
    #: (``"httpx.ReadTimeout"``, ``"TimeoutError"``); ``None`` otherwise.
    error_type: str | None = None
    #: For a step inside the call (``ctx.step(name, ...)``) that began and never finished:
    #: the step's name (``key`` is then the step's own key); ``None`` for the call itself.
    step: str | None = None


#: A hook: the call's result if its effect happened, else ``None``; sync or async.
Reconciler = Callable[[ReconcileCall], Any] | Callable[[ReconcileCall], Awaitable[Any]]

#: What ``reconcile=`` accepts: one hook for every tool, or a hook per tool name.
ReconcileOption = Reconciler | Mapping[str, Reconciler]


def check_reconcile(option: object) -> None:
    """Refuse anything but ``None``, a callable, or a mapping of tool names to callables."""
    if option is None or callable(option):
        return
    if isinstance(option, Mapping):
        for name, hook in option.items():
            if not isinstance(name, str) or not name or not callable(hook):
                raise TypeError(
                    f"reconcile= as a mapping needs tool names to functions, got {name!r}: {hook!r}"
                )
        return
    raise TypeError(
        "reconcile= must be a function (sync or async) taking a ReconcileCall, or a dict "
        f"of tool names to such functions, got {type(option).__name__}"
    )


def reconciler_for(option: ReconcileOption | None, tool: str | None) -> Reconciler | None:
    """The hook for ``tool``: the one hook, or the mapping's entry (``None`` if absent)."""
    if option is None or callable(option):
        return option
    return option.get(tool) if tool is not None else None
