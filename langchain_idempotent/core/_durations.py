"""The one duration parser: seconds (``int``/``float``), a ``timedelta``, or a numeric string.

Every duration the library accepts — a policy's ``lease``, a store's ``busy_timeout``, a
Redis client's ``socket_timeout``, the CLI's ``--older-than`` — goes through
:func:`to_seconds`, so the rules (and the error message) are the same everywhere: finite
and positive by default; ``allow_zero`` admits ``0``; ``allow_inf`` admits infinity
("never"). Booleans are refused (``True`` is not one second).
"""

from __future__ import annotations

import math
from datetime import timedelta

__all__ = ["Duration", "to_ms", "to_seconds"]

#: What a duration argument accepts.
Duration = float | timedelta


def to_seconds(
    value: float | timedelta | str,
    name: str,
    *,
    allow_zero: bool = False,
    allow_inf: bool = False,
) -> float:
    """``value`` in seconds, or a ``ValueError`` that names ``name`` and the rule broken."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a duration in seconds or a timedelta, got {value!r}")
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float | str):
        try:
            seconds = float(value)
        except ValueError:
            raise ValueError(
                f"{name} must be a duration in seconds or a timedelta, got {value!r}"
            ) from None
    else:
        raise ValueError(
            f"{name} must be a duration in seconds or a timedelta, got {type(value).__name__}"
        )
    if math.isnan(seconds) or seconds < 0 or (seconds == 0 and not allow_zero):
        rule = "a non-negative" if allow_zero else "a positive"
        raise ValueError(f"{name} must be {rule} duration, got {value!r}")
    if math.isinf(seconds) and not allow_inf:
        raise ValueError(f"{name} must be a finite duration, got {value!r}")
    return seconds


def to_ms(seconds: float) -> int:
    """Whole milliseconds for the store protocol (at least 1, so a lease never has length 0)."""
    return max(1, int(seconds * 1000))
