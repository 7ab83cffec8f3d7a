"""Events: what the engine did, for callbacks, logs and counters.

Stable event kinds (``IdempotencyEvent.kind``):

=====================  ===============================================================
``claim``              the caller acquired a lease and runs the tool
``replay``             a stored result (or terminal failure) was returned, tool not run
``wait``               another owner's lease was live; the caller waited for it
``takeover``           an expired lease was taken over (fence + 1); the tool runs again
``free_retry``         an expired (or abandoned) attempt never entered its side-effect
                       block: a clean retry (fence + 1), no reconcile, never outcome
                       unknown; ``detail``: ``reason``
``lease_lost``         a renewal found the lease gone while the tool ran
``stale_completion``   a completion arrived after another result was stored or after
                       this caller lost the lease
``payload_mismatch``   the key was reused with other arguments
``outcome_unknown``    an expired lease left no result and ``on_expired="raise"``
``store_error``        the store could not be reached or a record could not be read
``fail_open``          the store was down and the tool ran unprotected (``fail_open``)
``complete``           a result was stored
``release``            the lease was released after an error that leaves nothing unknown
``abandon``            the call was cancelled mid-tool, its tool raised after its effect
                       may have begun (``detail``: ``reason`` ``"error"`` and
                       ``error_type``), or its reconcile hook failed: the key stays
                       uncertain, the next claimant takes over
``reconcile``          a reconcile hook was asked about an uncertain call; ``detail``:
                       ``outcome`` (``found``, ``not_found``, ``error``), ``duration_ms``,
                       ``reason`` and (for reason ``error``) ``error_type``; ``takeover:
                       True`` when the call took the key over (not found: the tool runs)
``effect_inferred``    a tool's effect class was chosen from its MCP annotations (no
                       ``effect=`` for it), once per tool when it is wrapped (``key``
                       empty); ``detail``: ``effect`` and the ``hints`` read
=====================  ===============================================================

The event that follows a claim (``claim``, ``replay``, ``takeover``, ``free_retry``,
``wait``, ``payload_mismatch``, ``outcome_unknown``, a ``reconcile`` under
``on_expired="raise"``, a claim's ``store_error``) carries ``claim_ms``, the claim's round
trip in milliseconds (about 0 for a claim made for it by its sibling calls' batch), and
``waited_ms`` when the call first waited out another owner's lease. A ``takeover`` says
``reconcile: True`` when a reconcile hook is asked before the tool runs. ``call_id`` is
the LangChain tool call id, when the call had one.

Logging goes to ``logging.getLogger("langchain_idempotent")`` and children; no handler
is installed by the library.
"""

from __future__ import annotations

import logging
import threading
import typing
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ._frozen import fast_init

__all__ = [
    "EVENT_KINDS",
    "QUIET_KINDS",
    "SURFACED_KINDS",
    "EventCounter",
    "EventKind",
    "IdempotencyEvent",
    "logger",
]

EventKind = Literal[
    "claim",
    "replay",
    "wait",
    "takeover",
    "free_retry",
    "lease_lost",
    "stale_completion",
    "payload_mismatch",
    "outcome_unknown",
    "store_error",
    "fail_open",
    "complete",
    "release",
    "abandon",
    "reconcile",
    "effect_inferred",
]
#: Every kind, in the order above.
EVENT_KINDS: tuple[EventKind, ...] = typing.get_args(EventKind)

logger = logging.getLogger("langchain_idempotent")

#: Per kind: the log level, and whether the adapters dispatch it as an ``idempotency.<kind>``
#: callback event (claims, completions and releases are the quiet path).
_KINDS: dict[EventKind, tuple[int, bool]] = {
    "claim": (logging.DEBUG, False),
    "complete": (logging.DEBUG, False),
    "release": (logging.DEBUG, False),
    "replay": (logging.INFO, True),
    "wait": (logging.INFO, True),
    "takeover": (logging.WARNING, True),
    "free_retry": (logging.INFO, True),
    "lease_lost": (logging.WARNING, True),
    "stale_completion": (logging.WARNING, True),
    "payload_mismatch": (logging.WARNING, True),
    "outcome_unknown": (logging.ERROR, True),
    "store_error": (logging.ERROR, True),
    "fail_open": (logging.ERROR, True),
    "abandon": (logging.WARNING, True),
    "reconcile": (logging.WARNING, True),
    "effect_inferred": (logging.INFO, True),
}
#: The kinds dispatched as callback events.
SURFACED_KINDS = frozenset(kind for kind, (_, surfaced) in _KINDS.items() if surfaced)
#: The quiet path's kinds (claims, completions, releases): logged at DEBUG, never surfaced.
QUIET_KINDS = frozenset(kind for kind, (_, surfaced) in _KINDS.items() if not surfaced)


@fast_init
@dataclass(frozen=True, slots=True)
class IdempotencyEvent:
    kind: EventKind
    key: str
    tool: str | None = None
    fence: int = 0
    attempt: int = 0
    detail: Mapping[str, Any] = field(default_factory=dict)
    #: The tool call's id (LangChain's ``ToolCall["id"]``) when the call had one.
    call_id: str | None = None


def log_event(event: IdempotencyEvent) -> None:
    level = _KINDS[event.kind][0]
    if logger.isEnabledFor(level):
        logger.log(
            level,
            "idempotency %s key=%s tool=%s fence=%d attempt=%d%s",
            event.kind,
            event.key,
            event.tool,
            event.fence,
            event.attempt,
            "".join(f" {k}={v}" for k, v in event.detail.items()),
        )


def deliver(event: IdempotencyEvent, *hooks: EventHook | None) -> None:
    """Log ``event`` and hand it to each hook; a hook that raises is logged and ignored."""
    log_event(event)
    for hook in hooks:
        if hook is not None:
            try:
                hook(event)
            except Exception:
                logger.exception("an idempotency event hook raised; ignored")


class EventCounter:
    """A thread-safe ``on_event`` hook that counts events by kind: ``counter["replay"]``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def __call__(self, event: IdempotencyEvent) -> None:
        self.add(event.kind)

    def add(self, kind: str) -> None:
        """Count one event of ``kind`` (no event needs to be built for it)."""
        with self._lock:
            self._counts[kind] += 1

    def __getitem__(self, kind: str) -> int:
        with self._lock:
            return self._counts[kind]

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


EventHook = Callable[[IdempotencyEvent], None]


def surfaced_only(hook: Callable[..., None]) -> Callable[..., None]:
    """Mark ``hook`` as one that ignores the :data:`QUIET_KINDS`: the engine builds no
    event for a quiet step that nothing else listens to (the common first run)."""
    hook.surfaced_only = True  # type: ignore[attr-defined]
    return hook


def listens_quietly(hook: EventHook | None) -> bool:
    """Whether ``hook`` wants the quiet kinds too (any hook not marked :func:`surfaced_only`)."""
    return hook is not None and not getattr(hook, "surfaced_only", False)
