"""Seeded fault decisions shared by every part of the demo.

A fault never comes from a global random generator: each decision is a pure function of
the run's seed and of *what* is being decided (fault kind, ticket, occurrence). The same
seed therefore injects the same faults into every protection mode, in any process, in any
order — which is what makes the side-by-side comparison fair.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass

__all__ = ["FaultRates", "chance"]


def chance(seed: int, *parts: object) -> float:
    """A uniform number in ``[0, 1)`` determined by ``seed`` and ``parts`` alone."""
    digest = hashlib.blake2b(repr((seed, *parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


@dataclass(frozen=True, slots=True)
class FaultRates:
    """How often each fault fires. Every rate is a probability per opportunity.

    - ``llm_502``: per planner call, the LLM gateway answers 502 (the call raises and the
      worker loop retries the ticket with backoff).
    - ``arg_drift``: per ``issue_refund`` call the planner emits, the arguments drift in
      form but not in meaning (``140`` ↔ ``140.0``, keys reordered).
    - ``provider_502``: per POST to the provider, a 502 *before* anything is done.
    - ``drop_after_commit``: per POST, the provider commits, then closes the connection
      without answering (the caller cannot know the refund happened).
    - ``latency`` / ``latency_s``: per POST, an added delay of ``latency_s`` seconds.
    - ``worker_kill``: per ticket (first delivery only), the worker process dies inside
      ``issue_refund`` right after the provider committed the refund.
    - ``kill_before_refund``: per ticket (first delivery only), the worker process dies
      inside ``issue_refund`` before its POST (while it prepares the request).
    - ``duplicate_delivery``: per ticket, the queue delivers it twice at once (an
      at-least-once queue whose visibility timeout expired): two workers run one thread.
    """

    llm_502: float = 0.03
    arg_drift: float = 0.25
    provider_502: float = 0.03
    drop_after_commit: float = 0.04
    latency: float = 0.05
    latency_s: float = 0.2
    worker_kill: float = 0.01
    kill_before_refund: float = 0.01
    duplicate_delivery: float = 0.02

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if name == "latency_s":
                if value < 0:
                    raise ValueError("latency_s must be >= 0")
            elif not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1], got {value!r}")
        if self.provider_502 + self.drop_after_commit > 1.0:
            raise ValueError("provider_502 + drop_after_commit must not exceed 1")
