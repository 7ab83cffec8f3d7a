"""What one run of the refund batch is asked to do: :class:`BatchOptions`.

The command line (:func:`graphs.batch.parse_args`) and a notebook build the same value::

    BatchOptions(tickets=30, workers=2, rates=FaultRates(worker_kill=0.08), progress=False)

Every field has the command's default; a bad value is refused with a ``ValueError`` that
names the field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .faults import FaultRates
from .shared import MODES

__all__ = ["BatchOptions"]


@dataclass(frozen=True, slots=True)
class BatchOptions:
    """Options of one batch run (the command-line flag of each field in brackets).

    - ``tickets`` [``-n``], ``workers`` [``-w``], ``seed``: the workload and every fault.
    - ``modes`` [``--protection``]: the protection modes to run, in order (``none``,
      ``reference``, ``idempotent``); default all three.
    - ``store`` [``--store``, alias ``--redis``]: a store URL for the idempotency records
      (``redis://…`` and the other Redis schemes, ``postgresql://…`` / ``postgres://…``,
      ``sqlite:///…``); on Redis the reference's keys go there too. Each run writes under
      its own key prefix (Redis) or table (PostgreSQL, SQLite) and removes them afterwards.
      ``None`` keeps everything in SQLite files in ``workdir``.
    - ``workdir``: where the SQLite files go (default a temporary directory);
      ``out``: where ``main`` writes the JSON and PNG report.
    - ``model``: ``"fake"`` (the scripted planner) or ``"openai:<name>"``.
    - ``lease``: lease of ``idempotent()`` and lock TTL of the reference, seconds;
      ``wait_timeout``, ``retention``: ``idempotent()``'s wait and record TTL, seconds.
    - ``max_attempts``, ``backoff_base``, ``backoff_cap``: the worker loop's retries.
    - ``timeout``: abort a mode after this many seconds.
    - ``rates``: the fault rates (:class:`~graphs.faults.FaultRates`).
    - ``progress``: show a progress bar; ``verbose``: log idempotency events.
    - ``boundary`` [``--no-boundary`` turns it off]: the idempotent mode marks the
      provider's POSTs with ``side_effect()``, so a worker killed before its POST is a free
      retry instead of an uncertain takeover.
    - ``pipeline`` [``--pipeline``]: run the tickets through the multi-agent pipeline
      (:mod:`graphs.pipeline`: a supervisor, triage, billing and notifications agents,
      node retries) instead of the single refund agent; scripted models only.
    """

    tickets: int = 1400
    workers: int = 4
    seed: int = 7
    modes: tuple[str, ...] = MODES
    store: str | None = None
    workdir: Path | None = None
    out: Path = Path("runs")
    model: str = "fake"
    lease: float = 2.0
    wait_timeout: float = 10.0
    retention: float = 3600.0
    max_attempts: int = 10
    backoff_base: float = 0.05
    backoff_cap: float = 1.0
    timeout: float = 900.0
    rates: FaultRates = field(default_factory=FaultRates)
    progress: bool = True
    verbose: bool = False
    boundary: bool = True
    pipeline: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.modes, str):
            raise ValueError(f"modes must be a tuple of mode names, e.g. ({self.modes!r},)")
        unknown = [m for m in self.modes if m not in MODES]
        if unknown or not self.modes:
            raise ValueError(f"modes: unknown mode(s) {unknown}; choose from {', '.join(MODES)}")
        for name in ("tickets", "workers", "max_attempts"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if self.store is not None:
            from langchain_idempotent.stores import parse_store_url  # imports no store

            if parse_store_url(self.store).kind == "memory":  # ValueError for other schemes
                raise ValueError(
                    "store: memory:// lives inside one process and the batch runs several; "
                    "use redis://, postgresql:// or sqlite:///"
                )
        if self.pipeline and self.model != "fake":
            raise ValueError("pipeline: the multi-agent pipeline runs on scripted models only")
        if self.model != "fake":
            provider, _, name = self.model.partition(":")
            if provider != "openai" or not name:
                raise ValueError(
                    f"model must be 'fake' or 'openai:<model name>', got {self.model!r}"
                )
