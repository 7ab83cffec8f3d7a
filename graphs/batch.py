"""``python -m graphs.batch``: the overnight refund batch, three ways.

N tickets (default 1,400) go through the refund agent in W worker processes (default 4)
that pull from one shared queue. The same seeded faults hit every mode:

- the LLM gateway answers 502 (the worker loop retries with exponential backoff),
- the planner's arguments drift in form (``140`` ↔ ``140.0``, key order),
- the provider answers 502 before a refund, or commits it and drops the connection,
  or is slow,
- a worker process dies inside ``issue_refund`` right after the provider committed, and
  the parent hands its ticket to another worker, which resumes the thread,
- the queue delivers a ticket twice at once (two workers run one thread).

``--pipeline`` runs the same tickets through a multi-agent pipeline instead
(:mod:`graphs.pipeline`: sub-agents as tools, a ``create_agent`` supervisor whose tools
invoke triage, billing and notifications ``create_agent`` agents; the supervisor retries an
LLM 502, so a specialist whose model fails after its tool ran is invoked again from its
start).

Modes (``--protection``): ``none`` (plain tools), ``reference`` (the GET / SET NX / DEL
recipe of :mod:`graphs.reference`), ``idempotent`` (``langchain_idempotent.idempotent``),
a comma-separated list, or ``all`` (the default): the modes run in turn on the same
tickets and faults, are printed side by side and saved under ``--out`` as JSON and PNG.

Stores: an embedded SQLite file per mode (in a temporary directory, or ``--workdir``);
``--store URL`` puts the idempotency records in that store instead: Redis (``redis://…``,
where the reference's keys go too; ``--redis URL`` is the same flag), PostgreSQL
(``postgresql://…``) or a SQLite file (``sqlite:///…``). Each mode writes under a key
prefix (Redis) or a table (PostgreSQL, SQLite) of its own, removed after the mode ends.
Every run uses fresh thread ids and a fresh namespace, so runs never replay each other.
"""

from __future__ import annotations

import argparse
import importlib.util
import multiprocessing
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import asdict
from multiprocessing.context import ForkServerContext
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from .faults import FaultRates, chance
from .options import BatchOptions
from .provider import Invoice, PaymentProvider, ProviderFaults
from .report import (
    LEGEND,
    REPRODUCIBILITY,
    ModeResult,
    ledger_figures,
    render_table,
    save_chart,
    save_json,
    worst_customers,
)
from .shared import COUNTERS, FAILED, KILLED_EXIT_CODE, MODES, PENDING, Shared, WorkerConfig
from .tickets import Ticket, generate_tickets

if TYPE_CHECKING:
    from multiprocessing.queues import Queue

__all__ = [
    "BatchOptions",
    "LineProgress",
    "main",
    "parse_args",
    "run_batch",
    "run_mode",
    "start_line",
]


def parse_args(argv: Sequence[str] | None = None) -> BatchOptions:
    """The command line's :class:`BatchOptions` (exits with a usage error on a bad flag)."""
    d, rates = BatchOptions(), FaultRates()
    p = argparse.ArgumentParser(
        prog="python -m graphs.batch",
        description="Run the refund batch under seeded faults with each protection mode.",
    )
    p.add_argument("-n", "--tickets", type=int, default=d.tickets, help="tickets (default 1400)")
    p.add_argument(
        "-w", "--workers", type=int, default=d.workers, help="worker processes (default 4)"
    )
    p.add_argument("--seed", type=int, default=d.seed, help="seed of every fault (default 7)")
    p.add_argument(
        "--protection",
        default="all",
        help="none, reference, idempotent, a comma-separated list of them, or all "
        "(default: the three side by side)",
    )
    p.add_argument(
        "--store",
        "--redis",
        dest="store",
        metavar="URL",
        help="keep the idempotency records in this store: redis://…, postgresql://…, "
        "sqlite:///… (default: a SQLite file per mode in the work directory)",
    )
    p.add_argument("--workdir", type=Path, help="keep SQLite files here (default: a temp dir)")
    p.add_argument("--out", type=Path, default=d.out, help="report directory (runs/)")
    p.add_argument(
        "--model",
        default=d.model,
        help="planner: 'fake' (scripted, default) or 'openai:<name>' (needs OPENAI_API_KEY)",
    )
    p.add_argument(
        "--lease",
        type=float,
        default=d.lease,
        help="lease of idempotent() and lock TTL of the reference, seconds (default 2; "
        "the reference recipe says 45, scaled down so dead workers are recovered in-run)",
    )
    p.add_argument(
        "--wait-timeout", type=float, default=d.wait_timeout, help="idempotent() wait (s)"
    )
    p.add_argument("--retention", type=float, default=d.retention, help="record TTL (s)")
    p.add_argument(
        "--max-attempts", type=int, default=d.max_attempts, help="worker-loop attempts/ticket"
    )
    p.add_argument("--backoff-base", type=float, default=d.backoff_base, help="first backoff (s)")
    p.add_argument("--backoff-cap", type=float, default=d.backoff_cap, help="longest backoff (s)")
    p.add_argument("--timeout", type=float, default=d.timeout, help="abort a mode after (s)")
    p.add_argument(
        "--pipeline",
        action="store_true",
        help="run the tickets through the multi-agent pipeline (a create_agent supervisor "
        "whose tools invoke triage, billing, notifications agents; see graphs.pipeline)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("-v", "--verbose", action="store_true", help="log idempotency events")
    p.add_argument(
        "--no-boundary",
        action="store_true",
        help="idempotent mode without the side-effect mark (every takeover uncertain)",
    )
    faults = p.add_argument_group("fault rates (probabilities; see graphs.faults)")
    for name, default in asdict(rates).items():
        faults.add_argument(
            "--" + name.replace("_", "-"), type=float, default=default, help=f"default {default}"
        )
    a = p.parse_args(argv)
    if a.model != "fake":
        if not os.environ.get("OPENAI_API_KEY"):
            p.error("--model openai:... needs OPENAI_API_KEY in the environment")
        if importlib.util.find_spec("langchain_openai") is None:
            p.error(
                "--model openai:... needs langchain-openai: "
                "pip install 'langchain-idempotent[openai]'"
            )
    try:
        return BatchOptions(
            tickets=a.tickets,
            workers=a.workers,
            seed=a.seed,
            modes=MODES if a.protection == "all" else tuple(a.protection.split(",")),
            store=a.store,
            workdir=a.workdir,
            out=a.out,
            model=a.model,
            lease=a.lease,
            wait_timeout=a.wait_timeout,
            retention=a.retention,
            max_attempts=a.max_attempts,
            backoff_base=a.backoff_base,
            backoff_cap=a.backoff_cap,
            timeout=a.timeout,
            rates=FaultRates(**{name: getattr(a, name) for name in asdict(rates)}),
            progress=not a.no_progress,
            verbose=a.verbose,
            boundary=not a.no_boundary,
            pipeline=a.pipeline,
        )
    except ValueError as exc:
        p.error(str(exc))


def _context(pipeline: bool = False) -> ForkServerContext:
    """Workers fork from a server process that imported the agent stack once.

    This process (the parent) never imports LangGraph: :mod:`graphs.worker` (and, for
    ``--pipeline``, :mod:`graphs.pipeline`) is imported by the fork server only, and
    :func:`_run_worker` reaches it from inside a worker.
    """
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["graphs.worker", *(["graphs.pipeline"] if pipeline else [])])
    return ctx


def _run_worker(cfg: WorkerConfig, slot: int, tasks: Queue[Any], shared: Shared) -> None:
    """A worker's entry point, run in the forked process."""
    from .worker import worker_main  # preloaded in the fork server: no import cost here

    worker_main(cfg, slot, tasks, shared)


def start_worker(
    ctx: ForkServerContext, cfg: WorkerConfig, slot: int, tasks: Queue[Any], shared: Shared
) -> BaseProcess:
    """Start worker ``slot`` of ``cfg.mode`` (a daemon process forked by the fork server)."""
    proc = ctx.Process(
        target=_run_worker,
        args=(cfg, slot, tasks, shared),
        name=f"refund-worker-{cfg.mode}-{slot}",
        daemon=True,
    )
    proc.start()
    return proc


def run_mode(
    mode: str,
    opts: BatchOptions,
    tickets: Sequence[Ticket],
    workdir: Path,
    run_id: str,
    ctx: ForkServerContext,
    progress: Any = None,
) -> ModeResult:
    """Run every ticket once under ``mode`` against a fresh provider; report the outcome."""
    workdir.mkdir(parents=True, exist_ok=True)
    rates = opts.rates
    faults = ProviderFaults(
        seed=opts.seed,
        error_502=rates.provider_502,
        drop_after_commit=rates.drop_after_commit,
        latency=rates.latency,
        latency_s=rates.latency_s,
    )
    invoices = [Invoice(t.invoice_id, t.customer_id, t.amount_cents) for t in tickets]
    n, width = len(tickets), len(COUNTERS)
    with PaymentProvider(workdir / "provider.sqlite", invoices=invoices, faults=faults) as provider:
        cfg = WorkerConfig(
            mode=mode,
            tickets=tuple(tickets),
            provider_url=provider.url,
            workdir=str(workdir),
            run_id=run_id,
            seed=opts.seed,
            rates=rates,
            lease=opts.lease,
            wait_timeout=opts.wait_timeout,
            retention=opts.retention,
            max_attempts=opts.max_attempts,
            backoff_base=opts.backoff_base,
            backoff_cap=opts.backoff_cap,
            store_url=opts.store,
            model=opts.model,
            verbose=opts.verbose,
            boundary=opts.boundary,
            pipeline=opts.pipeline,
        )
        shared = Shared(
            status=ctx.RawArray("b", n),
            current=ctx.RawArray("i", [-1] * opts.workers),
            counters=ctx.RawArray("q", opts.workers * width),
        )
        tasks = ctx.Queue()
        task_id = progress.add_task(mode, total=n, note="") if progress is not None else None

        def start(slot: int) -> BaseProcess:
            return start_worker(ctx, cfg, slot, tasks, shared)

        started = time.monotonic()
        parent_cpu_started = time.process_time()
        procs = [start(slot) for slot in range(opts.workers)]
        deliveries = [1] * n
        twice = 0
        next_note = 0.0
        for t in tickets:
            tasks.put((t.index, 1, 0))
            if chance(opts.seed, "duplicate", t.ticket_id) < rates.duplicate_delivery:
                tasks.put((t.index, 1, 1))  # a second copy, right behind the first
                twice += 1
        try:
            while True:
                finished = sum(1 for s in shared.status[:] if s != PENDING)
                if progress is not None and (finished == n or time.monotonic() >= next_note):
                    c = shared.totals()
                    note = (  # within 80 columns beside the bar
                        f"paid twice {provider.ledger.duplicate_refunds()} · "
                        f"killed {c['worker_kill']} · retries {c['loop_retries']}"
                    )
                    progress.update(task_id, completed=finished, note=note)
                    next_note = time.monotonic() + 0.5
                elif progress is not None:
                    progress.update(task_id, completed=finished)
                if finished == n:
                    break
                for slot, proc in enumerate(procs):
                    if proc.exitcode is None:
                        continue
                    if proc.exitcode not in (KILLED_EXIT_CODE, -9):
                        raise RuntimeError(
                            f"worker {proc.name} exited with code {proc.exitcode}; "
                            "see its traceback above"
                        )
                    index = shared.current[slot]
                    if index >= 0 and shared.status[index] == PENDING:
                        deliveries[index] += 1  # redelivered to whichever worker is free
                        tasks.put((index, deliveries[index], 0))
                    shared.current[slot] = -1
                    procs[slot] = start(slot)
                if time.monotonic() - started > opts.timeout:
                    raise TimeoutError(f"mode {mode!r} did not finish within {opts.timeout} s")
                time.sleep(0.05)
            wall = time.monotonic() - started
        finally:
            for _ in procs:
                tasks.put(None)
            for proc in procs:
                proc.join(timeout=10)
                if proc.exitcode is None:
                    proc.kill()
                    proc.join()
            tasks.cancel_join_thread()  # every worker is gone: what is left is moot
            tasks.close()
        refunds = provider.ledger.refunds()
        notifications = provider.ledger.notifications()
        pstats = provider.stats()
    parent_cpu = time.process_time() - parent_cpu_started
    if opts.store:
        _remove_run_records(opts.store, cfg)
    counters = shared.totals()
    faults_fired = {
        "llm_502": counters["llm_502"],
        "arg_drift": counters["arg_drift"],
        "provider_502": pstats.get("error_502", 0),
        "drop_after_commit": pstats.get("drop_after_commit", 0),
        "latency": pstats.get("latency", 0),
        "worker_kill": counters["worker_kill"],
        "kill_before_refund": counters["worker_kill_before"],
        "duplicate_delivery": twice,
    }
    given_up = sum(1 for s in shared.status[:] if s == FAILED)
    return ModeResult(
        mode=mode,
        tickets=n,
        tickets_completed=n - given_up,
        tickets_given_up=given_up,
        ledger=ledger_figures(tickets, refunds, notifications),
        counters=counters,
        provider=pstats,
        faults=faults_fired,
        wall_time_s=round(wall, 2),
        cpu_time_s=round(counters["cpu_ms"] / 1000 + parent_cpu, 1),
        store=_store_name(mode, opts),
    )


def _remove_run_records(url: str, cfg: WorkerConfig) -> None:
    """Remove what this mode wrote to the store at ``url``, and only that."""
    from langchain_idempotent.stores import parse_store_url  # imports no store

    kind = parse_store_url(url).kind
    if kind == "redis":
        _delete_redis_keys(url, cfg.redis_prefix)
    elif kind == "postgres":
        _drop_postgres_table(url, cfg.store_table)
    elif kind == "sqlite":
        _drop_sqlite_table(url, cfg.store_table)


def _drop_postgres_table(url: str, table: str) -> None:
    """Drop this mode's table with the store's own ``drop()`` (table, functions, schema row)."""
    from langchain_idempotent import PostgresIdempotencyStore

    store = PostgresIdempotencyStore.from_url(url, table=table, auto_setup=False)
    try:
        store.drop()
    finally:
        store.close()


def _drop_sqlite_table(url: str, table: str) -> None:
    import sqlite3

    from langchain_idempotent.stores.sqlite import SqliteIdempotencyStore

    db = sqlite3.connect(SqliteIdempotencyStore.from_url(url).path, timeout=30.0)
    try:
        with db:
            db.execute(f"DROP TABLE IF EXISTS {table}")
    finally:
        db.close()


def _delete_redis_keys(url: str, prefix: str) -> None:
    """Delete this run's keys (and only them: they all start with ``prefix``)."""
    import redis

    client = redis.Redis.from_url(url, socket_timeout=5.0, socket_connect_timeout=2.0)
    try:
        batch: list[bytes] = []
        for key in client.scan_iter(match=prefix + "*", count=1000):
            batch.append(key)
            if len(batch) == 500:
                client.delete(*batch)
                batch.clear()
        if batch:
            client.delete(*batch)
    finally:
        client.close()


def _store_name(mode: str, opts: BatchOptions) -> str:
    if mode == "none":
        return "-"
    if opts.store is None:
        return "sqlite (embedded)"
    from langchain_idempotent.stores import parse_store_url  # imports no store

    kind = parse_store_url(opts.store).kind
    if mode == "reference" and kind != "redis":
        return "sqlite (embedded)"  # the recipe's GET / SET NX / DEL: Redis or its SQLite twin
    return f"{kind} ({_without_password(opts.store)})"


def _without_password(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", "@")))


def _store_kind(opts: BatchOptions) -> str:
    from langchain_idempotent.stores import parse_store_url  # imports no store

    return "sqlite" if opts.store is None else parse_store_url(opts.store).kind


def _noop() -> None:
    return None


class LineProgress:
    """Progress for output that is not a terminal (a CI log, ``| tee``, a file): rich's bar
    draws nothing there until the end, so this prints one line per tenth of a mode's
    tickets, and one when it ends, each within 80 columns. The part of rich's ``Progress``
    that :func:`run_mode` uses: ``add_task``, ``update``, a context manager."""

    def __init__(self, console: Any) -> None:
        self._console = console
        self._tasks: dict[int, dict[str, Any]] = {}

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def add_task(self, description: str, *, total: int, note: str = "") -> int:
        task_id = len(self._tasks)
        self._tasks[task_id] = {
            "name": description,
            "total": total,
            "started": time.monotonic(),
            "shown": -1,
            "note": note,
        }
        return task_id

    def update(self, task_id: int, *, completed: int, note: str | None = None) -> None:
        task = self._tasks[task_id]
        if note is not None:
            task["note"] = note
        total = max(1, task["total"])
        tenth = completed * 10 // total
        if tenth <= task["shown"]:
            return
        task["shown"] = tenth
        elapsed = time.monotonic() - task["started"]
        line = (
            f"{task['name']:>10} {completed:>5}/{task['total']:<5} {completed * 100 // total:>3}%"
            f" {elapsed:6.1f} s  {task['note']}"
        )
        self._console.print(line[:80], highlight=False, markup=False, soft_wrap=True)


def _progress(opts: BatchOptions, console: Any) -> Any:
    """rich's bar on a terminal (80 columns: a short bar, a short note); a line per tenth
    of each mode elsewhere; ``None`` with ``--no-progress``."""
    if not opts.progress:
        return None
    if console is not None and not console.is_terminal:
        return LineProgress(console)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("[bold]{task.description:>10}"),
        BarColumn(bar_width=12),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[note]}"),
        console=console,
    )


def run_batch(opts: BatchOptions, console: Any = None) -> list[ModeResult]:
    """Run the selected modes in turn on the same tickets and seeded faults."""
    modes = opts.modes
    tickets = generate_tickets(opts.tickets, opts.seed)
    run_id = uuid.uuid4().hex[:10]
    ctx = _context(opts.pipeline)
    warm = ctx.Process(target=_noop)  # start the fork server before any clock runs
    warm.start()
    warm.join()
    progress = _progress(opts, console)
    results = []
    with (
        tempfile.TemporaryDirectory(prefix="refund-batch-")
        if opts.workdir is None
        else nullcontext(str(opts.workdir / run_id)) as base,
        progress if progress is not None else nullcontext(),
    ):
        for mode in modes:
            results.append(run_mode(mode, opts, tickets, Path(base) / mode, run_id, ctx, progress))
    return results


#: Seconds per ticket and mode of the default run (1,400 tickets, 4 workers, SQLite) on a
#: 2-core machine: idle, about 2 minutes for the three modes (issue 40's fresh clone);
#: busy, 293 s and 382 s (two runs of ``python -m graphs.batch`` at load average 15 and
#: 18, other jobs running on the machine).
SECONDS_PER_TICKET = (0.025, 0.09)


def start_line(opts: BatchOptions) -> str:
    """What the run is about to do, and about how long it takes (the default run's rates
    on an idle and a busy 2-core machine; the pipeline, four agents a ticket, is slower)."""
    work = opts.tickets * len(opts.modes) * (4 if opts.pipeline else 1)
    low, high = (work * rate for rate in SECONDS_PER_TICKET)
    about = (
        f"about {low / 60:.0f}-{high / 60:.0f} min"
        if low >= 90
        else f"about {low:.0f}-{high:.0f} s"
        if high >= 10
        else "a few seconds"
    )
    what = "Refund pipeline" if opts.pipeline else "Refund batch"
    return (
        f"{what} of {opts.tickets:,} tickets, {opts.workers} workers, modes "
        f"{', '.join(opts.modes)}\nin turn: {about} on 2 cores (idle to busy); progress "
        "below, then the table"
    )


def _config(opts: BatchOptions) -> dict[str, Any]:
    config = asdict(opts)
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in config.items()}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m graphs.batch``: run, print the table, save the report; the exit status."""
    from rich.console import Console

    opts = parse_args(argv)
    console = Console()
    console.print(start_line(opts), highlight=False)
    results = run_batch(opts, console)
    what = (
        "Refund pipeline (supervisor → triage → billing → notifications)"
        if opts.pipeline
        else "Refund batch"
    )
    title = (
        f"{what}: {opts.tickets} tickets, {opts.workers} workers, seed {opts.seed}, "
        f"store {_store_kind(opts)}"
    )
    console.print(render_table(results, title))
    for line in worst_customers(results):
        console.print(line, highlight=False)
    console.print(LEGEND, highlight=False, markup=False)
    console.print(REPRODUCIBILITY, highlight=False)
    opts.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    name = "refund-pipeline" if opts.pipeline else "refund-batch"
    json_path = opts.out / f"{name}-{stamp}.json"
    png_path = opts.out / f"{name}-{stamp}.png"
    save_json(results, _config(opts), json_path)
    save_chart(results, title, png_path)
    console.print(f"saved {json_path} and {png_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
