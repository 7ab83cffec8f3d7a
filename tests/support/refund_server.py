"""What the Agent Server scenarios share: the provider, the ticket, and the figures.

``effects`` are refunds in the provider's ledger (money moved); ``posts`` are the refund
requests that reached it (``effects`` plus the ones it answered from its
``Idempotency-Key`` table): a protected tool that runs once sends one.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from graphs.provider import Invoice, PaymentProvider

__all__ = ["ASSISTANTS", "TICKET", "Figures", "wait_for_refunds"]

#: assistant id by protection mode (see langgraph.json).
ASSISTANTS = {"protected": "refund_agent", "plain": "refund_agent_plain"}

INVOICE = Invoice("INV-7001", "C-501", 14000)
TICKET = {
    "messages": [
        {
            "role": "user",
            "content": "Ticket T-9001 from customer C-501: please refund $140 of invoice INV-7001.",
        }
    ]
}
FOLLOW_UP = {"messages": [{"role": "user", "content": "Any news on T-9001? I am still waiting."}]}


@dataclass
class Figures:
    scenario: str
    mode: str
    runs: int
    effects: int
    posts: int
    seconds: float

    @property
    def duplicates(self) -> int:
        return max(0, self.effects - 1)

    @classmethod
    def of(
        cls, scenario: str, mode: str, provider: PaymentProvider, runs: int, started: float
    ) -> Figures:
        effects = len(provider.ledger.refunds())
        posts = effects + provider.stats().get("replayed", 0)
        return cls(scenario, mode, runs, effects, posts, time.monotonic() - started)

    def line(self) -> str:
        return (
            f"FIGURES | {self.scenario} | {self.mode} | runs {self.runs} | effects "
            f"{self.effects} | duplicates {self.duplicates} | refund POSTs {self.posts} | "
            f"{self.seconds:.1f} s"
        )


async def wait_for_refunds(provider: PaymentProvider, n: int, timeout: float = 60.0) -> None:
    """Until the provider has committed ``n`` refunds (the tool is past its effect)."""
    deadline = time.monotonic() + timeout
    while len(provider.ledger.refunds()) < n:
        if time.monotonic() > deadline:
            raise AssertionError(f"no refund reached the provider within {timeout:g}s")
        await asyncio.sleep(0.05)


def last_answer(state: Any) -> str:
    messages = state["messages"] if isinstance(state, dict) else []
    return str(messages[-1]["content"]) if messages else ""
