"""Events: what the engine did, for callbacks, logs and counters.

Stable event kinds (``IdempotencyEvent.kind``):

=====================  ===============================================================
``claim``              the caller acquired a lease and runs the tool
``replay``             a stored result (or terminal failure) was returned, tool not run
``wait``               another owner's lease was live; the caller waited for it
``takeover``           an expired lease was taken over (fence + 1); the tool runs again
``lease_lost``         a renewal found the lease gone while the tool ran
``stale_completion``   a completion arrived after another result was stored or after
                       this caller lost the lease
``payload_mismatch``   the key was reused with other arguments
``outcome_unknown``    an expired lease left no result and ``on_expired="raise"``
``store_error``        the store could not be reached or a record could not be read
``fail_open``          the store was down and the tool ran unprotected (``fail_open``)
``complete``           a result was stored
``release``            the lease was released after a retryable error
=====================  ===============================================================

Logging goes to ``logging.getLogger("langchain_idempotent")`` and children; no handler
is installed by the library.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["EVENT_KINDS", "EventCounter", "EventKind", "IdempotencyEvent", "logger"]

EventKind = Literal[
    "claim",
    "replay",
    "wait",
    "takeover",
    "lease_lost",
    "stale_completion",
    "payload_mismatch",
    "outcome_unknown",
    "store_error",
    "fail_open",
    "complete",
    "release",
]
EVENT_KINDS: tuple[EventKind, ...] = (
    "claim",
    "replay",
    "wait",
    "takeover",
    "lease_lost",
    "stale_completion",
    "payload_mismatch",
    "outcome_unknown",
    "store_error",
    "fail_open",
    "complete",
    "release",
)

logger = logging.getLogger("langchain_idempotent")

_LEVELS: dict[str, int] = {
    "claim": logging.DEBUG,
    "complete": logging.DEBUG,
    "release": logging.DEBUG,
    "replay": logging.INFO,
    "wait": logging.INFO,
    "takeover": logging.WARNING,
    "lease_lost": logging.WARNING,
    "stale_completion": logging.WARNING,
    "payload_mismatch": logging.WARNING,
    "outcome_unknown": logging.ERROR,
    "store_error": logging.ERROR,
    "fail_open": logging.ERROR,
}


@dataclass(frozen=True, slots=True)
class IdempotencyEvent:
    kind: EventKind
    key: str
    tool: str | None = None
    fence: int = 0
    attempt: int = 0
    detail: Mapping[str, Any] = field(default_factory=dict)


def log_event(event: IdempotencyEvent) -> None:
    level = _LEVELS.get(event.kind, logging.INFO)
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


class EventCounter:
    """A thread-safe ``on_event`` hook that counts events by kind: ``counter["replay"]``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def __call__(self, event: IdempotencyEvent) -> None:
        with self._lock:
            self._counts[event.kind] += 1

    def __getitem__(self, kind: str) -> int:
        with self._lock:
            return self._counts[kind]

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


EventHook = Callable[[IdempotencyEvent], None]
