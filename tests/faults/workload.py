"""The tool every fault scenario runs, and the callers that run it.

The tool is a refund: it logs that its body ran, sends the effect downstream with the
idempotency key and fence it was handed (``get_idempotency_context()``), and returns the
downstream's answer tagged with the run that produced it — so a caller that got a
different run's result shows up as a divergence.
"""

from __future__ import annotations

import os
import random
import time
import uuid
from collections.abc import Callable
from typing import Any

from langchain_idempotent import (
    Engine,
    IdempotencyError,
    InProgressError,
    StoreUnavailableError,
    get_idempotency_context,
)
from tests.support.faults import Ledger, Tally

__all__ = ["StaleFence", "call_until_answered", "refund"]


class StaleFence(Exception):
    """The downstream rejected the write: a newer owner (higher fence) already wrote."""


def refund(
    ledger: Ledger,
    key: str,
    *,
    value: str = "refund:140",
    sleep: float = 0.0,
    before: Callable[[], None] | None = None,
    during: Callable[[], None] | None = None,
    after: Callable[[], None] | None = None,
) -> Callable[[], str]:
    """The tool body for the call ``key``. ``before`` / ``during`` / ``after`` run around
    the downstream effect (``during`` inside its open transaction), for fault injection.

    Without an idempotency context (called outside the engine) it sends no idempotency
    key, like a tool that has none to send: the downstream cannot deduplicate that effect.
    A fail-open run has a context (``protected=False``, fence 0) and sends its key.
    """

    def action() -> str:
        ctx = get_idempotency_context()
        fence = ctx.fence if ctx is not None else 0
        ledger.executed(key, fence, ctx.attempt if ctx else 0, bool(ctx and ctx.takeover))
        if sleep:
            time.sleep(sleep)
        if before is not None:
            before()
        reply = ledger.apply(
            key, fence, value, idempotency_key=ctx.key if ctx else None, pause=during
        )
        if after is not None:
            after()
        if reply.status == "stale_fence":
            raise StaleFence(f"downstream rejected fence {fence} for {key}: a newer owner wrote")
        return f"{reply.value}|run={os.getpid()}.{fence}.{uuid.uuid4().hex[:8]}"

    return action


def call_until_answered(
    engine: Engine,
    key: str,
    action: Callable[[], str],
    tally: Tally,
    *,
    deadline_s: float = 30.0,
    retry_on: tuple[type[BaseException], ...] = (StoreUnavailableError, InProgressError),
    rng: random.Random | None = None,
) -> Any:
    """A caller with a retry loop (backoff 10 ms doubling to 200 ms) on ``retry_on``.

    Every error seen is tallied (so "errors surfaced" counts them); the final answer too.
    Returns the result, or the last error if the deadline passed.
    """
    rng = rng or random.Random()
    delay = 0.01
    give_up = time.monotonic() + deadline_s
    while True:
        try:
            result = engine.run(key, fingerprint="fp", action=action)
        except retry_on as exc:
            tally.error(key, exc)
            if time.monotonic() > give_up:
                return exc
            time.sleep(delay * (0.5 + rng.random()))
            delay = min(delay * 2, 0.2)
            continue
        except (IdempotencyError, StaleFence) as exc:
            tally.error(key, exc)
            return exc
        tally.ok(key, result)
        return result
