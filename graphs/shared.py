"""What the batch's parent (:mod:`graphs.batch`) and its workers (:mod:`graphs.worker`)
share: the worker configuration, the shared-memory arrays and their constants.

It imports no agent stack (no LangChain, no LangGraph), so the parent, which imports it,
never pays for LangGraph; only the workers do.

Three arrays in shared memory, written without locks because each cell has one writer at a
time: per-ticket status (the worker that finishes it), the ticket each worker slot is on
(that slot's worker; the parent after the worker died), and per-slot counters (the slot's
worker). A killed worker's counts survive it; its replacement reuses the slot.
"""

from __future__ import annotations

from dataclasses import dataclass
from multiprocessing.sharedctypes import SynchronizedArray

from .faults import FaultRates
from .tickets import Ticket

__all__ = [
    "COUNTERS",
    "DONE",
    "FAILED",
    "KILLED_EXIT_CODE",
    "MODES",
    "PENDING",
    "Shared",
    "WorkerConfig",
]

MODES = ("none", "reference", "idempotent")
PENDING, DONE, FAILED = 0, 1, 2
#: Exit status of a worker killed by the ``worker_kill`` fault (128 + SIGKILL).
KILLED_EXIT_CODE = 137

#: Per-slot counters, in shared memory.
COUNTERS = (
    "llm_calls",
    "llm_502",
    "arg_drift",
    "worker_kill",
    "worker_kill_before",
    "loop_retries",
    "replayed",
    "waits",
    "takeovers",
    "free_retries",
    "reconciled_found",
    "reconciled_not_found",
    "reconcile_errors",
    "errors_uncertain",
    "refunds_resent",
    "lease_lost",
    "stale_completion",
    "lock_contention",
    "escalated",
    "cpu_ms",
)


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """Everything a worker needs; picklable, identical for every worker of a mode."""

    mode: str
    tickets: tuple[Ticket, ...]
    provider_url: str
    workdir: str
    run_id: str
    seed: int
    rates: FaultRates
    lease: float
    wait_timeout: float
    retention: float
    max_attempts: int
    backoff_base: float
    backoff_cap: float
    store_url: str | None = None
    model: str | None = None
    verbose: bool = False
    #: The idempotent mode marks the refund's POST with ``side_effect()`` (``boundary=True``).
    boundary: bool = True
    #: Run the multi-agent pipeline (:mod:`graphs.pipeline`) instead of the single agent.
    pipeline: bool = False

    def thread_id(self, ticket: Ticket) -> str:
        return f"{ticket.ticket_id}@{self.run_id}"

    @property
    def redis_prefix(self) -> str:
        """Every Redis key of this run starts with this (so runs never collide, and the
        parent deletes exactly this run's keys afterwards)."""
        return f"refund-batch:{self.run_id}:{self.mode}:"

    @property
    def store_table(self) -> str:
        """The table of this run's records in a PostgreSQL or SQLite store (unique per run
        and mode; the parent drops it afterwards)."""
        return f"refund_batch_{self.run_id}_{self.mode}"


@dataclass(frozen=True, slots=True)
class Shared:
    """Arrays shared by the parent and the workers (lock-free: one writer per cell)."""

    status: SynchronizedArray[int]
    current: SynchronizedArray[int]
    counters: SynchronizedArray[int]

    def count(self, slot: int, name: str, n: int = 1) -> None:
        self.counters[slot * len(COUNTERS) + COUNTERS.index(name)] += n

    def totals(self) -> dict[str, int]:
        width = len(COUNTERS)
        slots = len(self.counters) // width
        return {
            name: sum(self.counters[s * width + i] for s in range(slots))
            for i, name in enumerate(COUNTERS)
        }
