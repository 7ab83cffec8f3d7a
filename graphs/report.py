"""The batch report: what each protection mode cost, from the provider's own ledger.

Money figures come from the provider's ledger, not from the workers' view of things:
every ticket owes one refund of its amount; a refund beyond that is a duplicate, and its
amount is over-credited. Counts of agent activity (LLM calls, replays, waits, takeovers)
come from the workers' shared counters; fault counts from whoever injected them.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .tickets import Ticket, dollars

__all__ = [
    "LEGEND",
    "REPRODUCIBILITY",
    "LedgerFigures",
    "ModeResult",
    "ledger_figures",
    "render_table",
    "save_chart",
    "save_json",
]


@dataclass(frozen=True, slots=True)
class LedgerFigures:
    refunds_expected: int
    refunds_executed: int
    duplicate_refunds: int
    #: Duplicates whose previous refund's response was lost (dropped connection).
    duplicates_after_lost_response: int
    #: The other duplicates: a dead worker's step re-run, or two workers on one ticket.
    duplicates_after_crash_or_concurrency: int
    missing_refunds: int
    over_credited_cents: int
    customers_affected: int
    duplicate_notifications: int
    #: The most over-credited customer: ``"C-00042 was credited $420 for $140 owed"``.
    worst_customer: str


def ledger_figures(
    tickets: Sequence[Ticket],
    refunds: Iterable[dict[str, Any]],
    notifications: Iterable[dict[str, Any]],
) -> LedgerFigures:
    """Compare the provider's ledger with what the tickets owe (one refund each)."""
    owed = {t.invoice_id: t for t in tickets}
    paid: Counter[str] = Counter()
    credited: Counter[str] = Counter()
    previous_lost: dict[str, bool] = {}
    after_lost = 0
    for refund in sorted(refunds, key=lambda r: r["created_at"]):
        invoice = refund["invoice_id"]
        if paid[invoice] and previous_lost[invoice]:
            after_lost += 1
        paid[invoice] += 1
        previous_lost[invoice] = bool(refund.get("response_lost"))
        credited[refund["customer_id"]] += int(refund["amount_cents"])
    duplicates = sum(max(0, n - 1) for n in paid.values())
    over = {inv: (n - 1) * owed[inv].amount_cents for inv, n in paid.items() if n > 1}
    affected = {owed[inv].customer_id for inv in over}
    owed_by_customer: Counter[str] = Counter()
    for t in tickets:
        if paid[t.invoice_id]:
            owed_by_customer[t.customer_id] += t.amount_cents
    worst = ""
    if affected:
        customer = max(affected, key=lambda c: credited[c] - owed_by_customer[c])
        worst = (
            f"{customer} was credited ${dollars(credited[customer])} for "
            f"${dollars(owed_by_customer[customer])} owed"
        )
    sent: Counter[str] = Counter(n["ticket_id"] for n in notifications)
    return LedgerFigures(
        refunds_expected=len(tickets),
        refunds_executed=sum(paid.values()),
        duplicate_refunds=duplicates,
        duplicates_after_lost_response=after_lost,
        duplicates_after_crash_or_concurrency=duplicates - after_lost,
        missing_refunds=sum(1 for t in tickets if paid[t.invoice_id] == 0),
        over_credited_cents=sum(over.values()),
        customers_affected=len(affected),
        duplicate_notifications=sum(max(0, n - 1) for n in sent.values()),
        worst_customer=worst,
    )


@dataclass(frozen=True, slots=True)
class ModeResult:
    mode: str
    tickets: int
    tickets_completed: int
    tickets_given_up: int
    ledger: LedgerFigures
    counters: dict[str, int]
    provider: dict[str, int]
    faults: dict[str, int]
    wall_time_s: float
    #: CPU seconds of the workers (their finished tickets) and of the parent (provider).
    cpu_time_s: float = 0.0
    store: str = ""
    notes: list[str] = field(default_factory=list)


#: (label, how to read it from a ModeResult), in table order.
_ROWS: list[tuple[str, Any]] = [
    ("tickets", lambda r: r.tickets),
    ("tickets completed", lambda r: r.tickets_completed),
    ("tickets given up", lambda r: r.tickets_given_up),
    ("tickets escalated to a human", lambda r: r.counters.get("escalated", 0)),
    ("refunds expected", lambda r: r.ledger.refunds_expected),
    ("refunds executed at the provider", lambda r: r.ledger.refunds_executed),
    ("duplicate refunds", lambda r: r.ledger.duplicate_refunds),
    ("  after a lost response", lambda r: r.ledger.duplicates_after_lost_response),
    (
        "  after a dead worker / 2nd delivery",
        lambda r: r.ledger.duplicates_after_crash_or_concurrency,
    ),
    ("missing refunds", lambda r: r.ledger.missing_refunds),
    ("dollars over-credited", lambda r: f"${r.ledger.over_credited_cents / 100:,.2f}"),
    ("customers affected", lambda r: r.ledger.customers_affected),
    ("duplicate notifications", lambda r: r.ledger.duplicate_notifications),
    ("LLM calls", lambda r: r.counters.get("llm_calls", 0)),
    ("tool calls replayed (store)", lambda r: r.counters.get("replayed", 0)),
    ("replayed by the provider (key)", lambda r: r.provider.get("replayed", 0)),
    ("waits for another worker", lambda r: r.counters.get("waits", 0)),
    ("takeovers of expired leases", lambda r: r.counters.get("takeovers", 0)),
    ("free retries (died before the POST)", lambda r: _free(r)),
    ("tool errors kept uncertain (lost response, 502)", lambda r: _kept(r)),
    (
        "uncertain outcomes reconciled (effect found / not found)",
        lambda r: _reconciled(r),
    ),
    ("refunds re-sent after an unknown outcome (not found)", lambda r: _resent(r)),
    ("lock contention errors", lambda r: r.counters.get("lock_contention", 0)),
    ("worker-loop retries", lambda r: r.counters.get("loop_retries", 0)),
    ("wall time", lambda r: f"{r.wall_time_s:.1f} s"),
    ("CPU time (workers + provider)", lambda r: f"{r.cpu_time_s:.0f} s"),
]


def _free(r: ModeResult) -> str:
    """Takeovers of an attempt that never entered its ``side_effect()`` block (the
    idempotent mode only: the others cannot tell)."""
    return str(r.counters.get("free_retries", 0)) if r.mode == "idempotent" else "-"


def _kept(r: ModeResult) -> str:
    """Tool errors after the POST began (a dropped connection, a 502) that left the key
    uncertain, so the retry asked the provider (the idempotent mode only)."""
    return str(r.counters.get("errors_uncertain", 0)) if r.mode == "idempotent" else "-"


def _reconciled(r: ModeResult) -> str:
    """``found / not found`` for the idempotent mode; ``-`` for a mode that cannot ask."""
    if r.mode != "idempotent":
        return "-"
    c = r.counters
    cell = f"{c.get('reconciled_found', 0)} / {c.get('reconciled_not_found', 0)}"
    errors = c.get("reconcile_errors", 0)
    return f"{cell} ({errors} errors)" if errors else cell


def _resent(r: ModeResult) -> str:
    """POSTs of a refund made by a takeover whose reconcile hook found nothing committed (a
    502 before the provider acted, a worker killed before it): the idempotent mode counts
    them; the others cannot tell a re-send (theirs are among the duplicates)."""
    return str(r.counters.get("refunds_resent", 0)) if r.mode == "idempotent" else "-"


_FAULT_ROWS = [
    ("LLM gateway 502", "llm_502"),
    ("argument drift", "arg_drift"),
    ("provider 502 before refund", "provider_502"),
    ("connection dropped after commit", "drop_after_commit"),
    ("provider latency", "latency"),
    ("worker killed mid-tool", "worker_kill"),
    ("worker killed before its POST", "kill_before_refund"),
    ("ticket delivered twice", "duplicate_delivery"),
]


def render_table(results: Sequence[ModeResult], title: str) -> Any:
    """A :class:`rich.table.Table`: one column per mode, then the faults that fired."""
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    table.add_column("")
    for r in results:
        table.add_column(r.mode, justify="right")
    for label, read in _ROWS:
        cells = [str(read(r)) for r in results]
        style = "bold" if label in ("duplicate refunds", "dollars over-credited") else None
        table.add_row(label, *cells, style=style)
    table.add_section()
    for label, key in _FAULT_ROWS:
        table.add_row(f"fault: {label}", *[str(r.faults.get(key, 0)) for r in results])
    return table


#: Printed under the table: what each column and the less obvious rows mean (80 columns).
LEGEND = """\
Columns: the protection modes, run in turn on the same tickets and faults.
  none        plain tools: nothing stops a retried or repeated refund
  reference   the recipe users start from (graphs/reference.py): GET the key,
              SET a lock NX with a TTL, run, store the result, DEL the lock
  idempotent  the tools wrapped with langchain_idempotent.idempotent()
Rows:
  tool calls replayed     a retry answered from the stored result, tool not run
  replayed by provider    a POST the provider matched to its Idempotency-Key
  waits                   a duplicate call waited for the worker running it
  takeovers               a worker took over a call whose lease had expired
                          (its worker died or stalled)
  free retries            takeovers of an attempt that died before its POST:
                          run again, nothing to ask
  kept uncertain          an error after the POST began (lost response, 502):
                          the retry asks the provider before sending again
  reconciled found /      the answer to GET /refunds?idempotency_key=K:
    not found             found: its refund is the result, not sent again;
                          not found: the call runs again with the same key
  re-sent                 refunds POSTed again after "not found"
  lock contention         the reference's RuntimeError: another worker holds
                          the lock (the worker loop retries later)
  worker-loop retries     the batch loop's retries, with backoff, after an error
  -                       the mode cannot tell\
"""

#: Printed under the table: what a seed fixes and what it cannot (two runs of
#: ``python -m graphs.batch --seed 7 -n 300`` gave 29 and 28 duplicate refunds unprotected).
REPRODUCIBILITY = (
    "The seed fixes the tickets and every fault decided per ticket or per model call, the "
    "same in every mode and run. Two runs with one seed can still differ by a few in the "
    "other counts: a ticket delivered twice runs on two workers at once, and a dead "
    "worker's ticket is picked up on the clock, so which copy reaches the provider first "
    "(and with it the faults decided per POST), and whether a lease has expired when the "
    "next worker resumes, is timing, not the seed. With idempotent() the outcome does not "
    "move: 0 duplicates."
)


def worst_customers(results: Sequence[ModeResult]) -> list[str]:
    """One line per mode that over-credited someone: who got the most, and how much."""
    return [
        f"worst customer ({r.mode}): {r.ledger.worst_customer}"
        for r in results
        if r.ledger.worst_customer
    ]


def save_json(results: Sequence[ModeResult], config: dict[str, Any], path: Path) -> None:
    payload = {"config": config, "modes": {r.mode: asdict(r) for r in results}}
    path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")


def save_chart(results: Sequence[ModeResult], title: str, path: Path) -> None:
    """A PNG with one bar chart per headline figure, one bar per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels: list[tuple[str, str, list[float]]] = [
        ("duplicate refunds", "{:,.0f}", [r.ledger.duplicate_refunds for r in results]),
        (
            "dollars over-credited",
            "${:,.0f}",
            [r.ledger.over_credited_cents / 100 for r in results],
        ),
        ("customers affected", "{:,.0f}", [r.ledger.customers_affected for r in results]),
        ("wall time", "{:.0f} s", [r.wall_time_s for r in results]),
    ]
    colours = {"none": "#d62728", "reference": "#ff7f0e", "idempotent": "#2ca02c"}
    names = [r.mode for r in results]
    fig = plt.figure(figsize=(4 * len(panels), 3.6))
    for i, (label, fmt, values) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), i + 1)
        bars = ax.bar(names, values, color=[colours.get(n, "#1f77b4") for n in names])
        ax.bar_label(bars, labels=[fmt.format(v) for v in values])
        ax.set_title(label)
        ax.margins(y=0.2)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
