"""Release, abandon and the side-effect mark, written once for the stores that apply the
protocol's decisions in Python (memory, SQLite).

Each is one decision of :mod:`langchain_idempotent.core.protocol` on the live record under the
key, written with the record's expiry kept; a release or an abandon that took effect wakes
the key's waiters in this process. A store supplies :meth:`~DecidesInPython._keeping_expiry`
(under its lock, or in its write transaction) and ``_wakeup``.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable

from ..core.protocol import decide_abandon, decide_mark_effect, decide_release
from ..core.record import Record, UncertainReason
from ..core.store import BaseIdempotencyStore, Held
from ._wakeup import Wakeup

__all__ = ["DecidesInPython", "Decision"]

#: ``decide(record, now)``: the answer and the record to write (``None``: unchanged).
Decision = Callable[[Record | None, int], tuple[bool, Record | None]]


class DecidesInPython(BaseIdempotencyStore):
    """A store whose operations decide in Python (see the module docstring)."""

    _wakeup: Wakeup

    @abstractmethod
    def _keeping_expiry(self, key: str, decide: Decision) -> bool:
        """``decide(record, now)`` on the live record under ``key``, atomically, then write
        the record it decides with the record's expiry kept; returns the answer."""

    def _woken(self, key: str, changed: bool) -> bool:
        """Wake ``key``'s waiters in this process if ``changed``; returns ``changed``."""
        if changed:
            self._wakeup.notify(key)
        return changed

    def release(self, held: Held) -> bool:
        ok = self._keeping_expiry(
            held.key,
            lambda rec, now: decide_release(rec, owner=held.owner, fence=held.fence, now=now),
        )
        return self._woken(held.key, ok)

    def abandon(
        self, held: Held, reason: UncertainReason = "cancelled", error_type: str | None = None
    ) -> bool:
        ok = self._keeping_expiry(
            held.key,
            lambda rec, now: decide_abandon(
                rec,
                owner=held.owner,
                fence=held.fence,
                reason=reason,
                now=now,
                error_type=error_type,
            ),
        )
        return self._woken(held.key, ok)

    def mark_effect(self, held: Held) -> bool:
        return self._keeping_expiry(
            held.key,
            lambda rec, now: decide_mark_effect(rec, owner=held.owner, fence=held.fence, now=now),
        )
