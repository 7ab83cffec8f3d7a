"""Runnable example graphs and the main demo: an invoice-refund agent under injected faults.

Run from a checkout as ``python -m graphs.batch`` (``--help`` for the options). It uses only
the public API of ``langchain_idempotent``. The modules, by role:

The example agent

- :mod:`graphs.refund_agent` — ``build_refund_agent(store, model, checkpointer)``: an LLM
  planner and a ``ToolNode`` whose effectful tools are wrapped with ``idempotent()``.
- :mod:`graphs.tools` — its three tools, calling the provider over HTTP and handing the
  idempotency key downstream as ``Idempotency-Key``; their ``reconcile=`` hooks
  (``make_reconcilers``), which look a call up by that key.
- :mod:`graphs.fake_model` — the scripted planner (LLM gateway 502s, argument drift).
- :mod:`graphs.pipeline` — the same work as a multi-agent pipeline: a langgraph-supervisor
  supervisor and triage, billing, notifications agents, every node with a ``RetryPolicy``
  (``python -m graphs.batch --pipeline``); :mod:`graphs.pipeline_models`, their scripted
  models.
- :mod:`graphs.remote_agents` — a caller agent that runs the refund agent on another Agent
  Server once per key (:mod:`langchain_idempotent.integrations.remote`), and its plain twin.

The baseline

- :mod:`graphs.reference` — the GET / SET NX / DEL recipe the library replaces (the one
  copy; the benchmarks time it too).

The fault-injection harness

- :mod:`graphs.batch` — ``python -m graphs.batch``: 1,400 tickets, 4 worker processes,
  every protection mode side by side; the parent process, which never imports LangGraph.
- :mod:`graphs.options` — :class:`~graphs.options.BatchOptions`, what one run is asked
  to do (the command line and notebooks build it).
- :mod:`graphs.worker` — one worker process: pull tickets, run the agent, retry.
- :mod:`graphs.shared` — what the parent and its workers share (config, counters).
- :mod:`graphs.provider` — a payment provider on loopback with a SQLite ledger that
  honours ``Idempotency-Key`` (and ``Idempotency-Fence``) and answers look-ups by key,
  with seeded fault injection.
- :mod:`graphs.faults` — the seeded fault decisions and their rates.
- :mod:`graphs.tickets` — the workload: refund tickets generated from a seed.
- :mod:`graphs.report` — the outcome per mode from the provider's ledger: table, JSON, PNG.
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
