"""Runnable example graphs and the main demo: an invoice-refund agent under injected faults.

- :mod:`graphs.refund_agent` — ``build_refund_agent(store, model, checkpointer)``: an LLM
  planner and a ``ToolNode`` whose effectful tools are wrapped with ``idempotent()``.
- :mod:`graphs.provider` — a payment provider on loopback with a SQLite ledger that honours
  ``Idempotency-Key`` (and ``Idempotency-Fence``), with seeded fault injection.
- :mod:`graphs.fake_model` — the scripted planner (LLM gateway 502s, argument drift).
- :mod:`graphs.reference` — the GET / SET NX / DEL recipe the library replaces, as a baseline.
- :mod:`graphs.batch` — ``python -m graphs.batch`` (``refund-batch``): 1,400 tickets,
  4 worker processes, every protection mode side by side.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["build_refund_agent"]

if TYPE_CHECKING:
    from .refund_agent import build_refund_agent


def __getattr__(name: str) -> Any:
    # Lazy, so that the batch's parent process never imports LangGraph (its workers do).
    if name == "build_refund_agent":
        from .refund_agent import build_refund_agent

        return build_refund_agent
    raise AttributeError(f"module 'graphs' has no attribute {name!r}")
