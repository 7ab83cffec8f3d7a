"""Figures of one fault scenario, and the Markdown table the campaign writes.

Columns (the issue's): scenario, faults injected, calls, effects applied, duplicate effects,
divergent results, records stuck, errors surfaced, plus notes (re-runs that the downstream
deduplicated by key, records lost, timings).

- *effects applied*: effects the downstream ledger applied (one per key is right).
- *duplicate effects*: effects applied more than once for one key (must be 0).
- *divergent results*: keys whose callers got different results.
- *records stuck*: records that blocked callers for longer than one lease.
- *errors surfaced*: errors callers saw, by type (fail-closed errors are expected).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from tests.support.faults import Ledger

__all__ = ["Figures", "markdown_table"]


@dataclass
class Figures:
    scenario: str
    faults: str
    calls: int = 0
    effects: int = 0
    duplicates: int = 0
    divergent: int = 0
    stuck: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)

    @classmethod
    def from_ledger(
        cls,
        scenario: str,
        faults: str,
        ledger: Ledger,
        *,
        stuck: int = 0,
        notes: list[str] | None = None,
    ) -> Figures:
        """Calls, effects, duplicates, divergences and errors as the ledger saw them."""
        effects = ledger.effects()
        executions = ledger.executions()
        reruns = sum(n - 1 for n in executions.values() if n > 1)
        figures = cls(
            scenario,
            faults,
            calls=ledger.call_count(),
            effects=sum(effects.values()),
            duplicates=sum(n - 1 for n in effects.values() if n > 1),
            divergent=sum(1 for r in ledger.results().values() if len(r) > 1),
            stuck=stuck,
            errors=Counter(ledger.errors()),
            notes=list(notes or []),
        )
        if reruns:
            deduped = reruns - figures.duplicates
            figures.notes.insert(
                0, f"tool re-ran {reruns}x ({deduped} deduplicated downstream by key)"
            )
        return figures

    def row(self) -> str:
        errors = ", ".join(f"{name} x{n}" for name, n in sorted(self.errors.items())) or "-"
        cells = [
            self.scenario,
            self.faults,
            str(self.calls),
            str(self.effects),
            str(self.duplicates),
            str(self.divergent),
            str(self.stuck),
            errors,
            "; ".join(self.notes) or "-",
        ]
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


HEADER = (
    "| scenario | faults injected | calls | effects applied | duplicate effects "
    "| divergent results | records stuck | errors surfaced | notes |\n"
    "|---|---|---:|---:|---:|---:|---:|---|---|"
)


def markdown_table(rows: list[Figures]) -> str:
    """The table, ordered by scenario (rows are titled ``"<number>. <what>"``)."""
    ordered = sorted(rows, key=lambda f: f.scenario)
    return "\n".join([HEADER, *(f.row() for f in ordered)])
