"""Many seeded runs against one store: each run simulated, its history checked, its figures
added up per fault kind."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from . import checker
from .sim import FAULTS, Backend, Plan, Run, scheduled_renewals


@dataclass
class Tally:
    runs: int = 0
    claims: int = 0
    effects: int = 0
    violations: int = 0
    seeds: list[int] = field(default_factory=list)


@dataclass
class Totals:
    store: str
    total: Tally = field(default_factory=Tally)
    by_fault: dict[str, Tally] = field(default_factory=dict)
    stats: Counter[str] = field(default_factory=Counter)
    first: list[str] = field(default_factory=list)  # the first failure's violations
    seconds: float = 0.0

    def add(self, plan: Plan, report: checker.Report) -> None:
        kinds = plan.kinds() or {"none"}
        bad = 1 if report.violations else 0
        for t in (self.total, *(self.by_fault.setdefault(k, Tally()) for k in kinds)):
            t.runs += 1
            t.claims += report.stats["claims"]
            t.effects += report.stats["effects"]
            t.violations += bad
            if bad and len(t.seeds) < 5:
                t.seeds.append(plan.seed)
        self.stats.update(report.stats)
        if bad and not self.first:
            self.first = report.violations[:5]


def run_seeds(
    backend: Backend,
    seeds: range,
    *,
    allow: tuple[str, ...] = FAULTS,
    plant: Callable[..., Any] | None = None,
    stop_on_failure: bool = False,
    progress: Callable[[Totals], None] | None = None,
    every: int = 1000,
    restart: bool = False,
) -> Totals:
    totals = Totals(backend.name)
    tag = f"tt{uuid.uuid4().hex[:6]}"
    started = time.monotonic()
    with scheduled_renewals():
        for seed in seeds:
            plan = Plan.draw(seed, allow=allow, restart=restart)
            run = Run(plan, backend, tag, plant=plant)
            out = run.execute()
            report = checker.check(out, durable=backend.durable)
            totals.add(plan, report)
            backend.forget(out.keys)
            if report.violations and stop_on_failure:
                break
            if progress is not None and totals.total.runs % every == 0:
                totals.seconds = time.monotonic() - started
                progress(totals)
    totals.seconds = time.monotonic() - started
    return totals


def to_json(totals: Totals) -> dict[str, Any]:
    return {
        "store": totals.store,
        "seconds": totals.seconds,
        "total": asdict(totals.total),
        "by_fault": {k: asdict(v) for k, v in totals.by_fault.items()},
        "stats": dict(totals.stats),
        "first": totals.first,
    }


def merge(parts: list[dict[str, Any]]) -> Totals:
    """Shards of one store's campaign (``--json`` files) as one."""
    out = Totals(parts[0]["store"])
    for p in parts:
        out.seconds = max(out.seconds, p["seconds"])
        for t, src in [(out.total, p["total"])] + [
            (out.by_fault.setdefault(k, Tally()), v) for k, v in p["by_fault"].items()
        ]:
            t.runs += src["runs"]
            t.claims += src["claims"]
            t.effects += src["effects"]
            t.violations += src["violations"]
            t.seeds += src["seeds"]
        out.stats.update(p["stats"])
        out.first = out.first or p["first"]
    return out


def table(totals: Totals) -> str:
    rows = [
        f"store {totals.store}: {totals.seconds:.1f} s",
        "| fault kind | runs | claims | effects | violations | failing seeds |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for kind in sorted(totals.by_fault):
        t = totals.by_fault[kind]
        seeds = ", ".join(map(str, t.seeds)) or "-"
        rows.append(f"| {kind} | {t.runs} | {t.claims} | {t.effects} | {t.violations} | {seeds} |")
    t = totals.total
    seeds = ", ".join(map(str, t.seeds)) or "-"
    rows.append(f"| **all** | {t.runs} | {t.claims} | {t.effects} | {t.violations} | {seeds} |")
    extra = ", ".join(
        f"{k}={v}" for k, v in sorted(totals.stats.items()) if k not in ("claims", "effects")
    )
    rows.append(f"observed: {extra}")
    return "\n".join(rows)
