"""Order statistics for latency samples (nanoseconds in, microseconds out)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["percentile", "summary"]


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q``-quantile (0..1) with linear interpolation; ``sorted_values`` is sorted."""
    if not sorted_values:
        raise ValueError("no samples")
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    frac = pos - lo
    return sorted_values[lo] * (1 - frac) + sorted_values[hi] * frac


def summary(samples_ns: Sequence[int]) -> dict[str, float]:
    """Median, p90, min and count of nanosecond samples, in microseconds."""
    s = sorted(samples_ns)
    return {
        "median_us": percentile(s, 0.5) / 1000,
        "p90_us": percentile(s, 0.9) / 1000,
        "min_us": s[0] / 1000,
        "n": float(len(s)),
    }
