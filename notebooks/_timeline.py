"""The timeline plot of ``03_leases_and_workers``: one row per worker, one panel per part.

Bars show a worker running the tool (coloured by fence) or waiting for another one;
markers show each event; the stretch a worker was frozen (``SIGSTOP``) is hatched, and a
dotted line marks where the frozen owner's lease ran out.

Events are the dicts the notebook's workers push: ``t`` (seconds since the epoch),
``worker``, ``kind`` (an idempotency event kind, ``"pay"`` or ``"result"``) and, for
idempotency events, ``fence``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

__all__ = ["plot_timeline"]

Event = dict[str, Any]

MARKERS = {  # event kind: (marker, colour)
    "claim": ("o", "tab:green"),
    "wait": ("d", "tab:gray"),
    "pay": (r"$\$$", "black"),
    "complete": ("s", "tab:blue"),
    "replay": ("^", "tab:purple"),
    "takeover": ("o", "tab:orange"),
    "lease_lost": ("X", "tab:red"),
    "stale_completion": ("s", "tab:red"),
}
RUN_COLOURS = {1: "#b7dfb7", 2: "#fdd0a2"}  # by fence
WAITING = "0.88"
ENDS = {"complete", "stale_completion", "release", "replay", "takeover"}


def _stretches(mine: Sequence[Event]) -> Iterator[tuple[float, float, int, bool]]:
    """(start, end, fence, waiting) for each stretch a worker ran the tool or waited."""
    for i, e in enumerate(mine):
        if e["kind"] in ("claim", "takeover", "wait"):
            end = next((x for x in mine[i + 1 :] if x["kind"] in ENDS), None)
            if end is not None:
                yield e["t"], end["t"], e["fence"], e["kind"] == "wait"


def _draw(
    ax: Axes, events: Sequence[Event], workers: Sequence[str], title: str
) -> tuple[float, dict[str, int]]:
    """One panel; returns its time origin and each worker's row."""
    shown = [e for e in events if e["kind"] in MARKERS]
    t0 = shown[0]["t"]
    rows = {name: len(workers) - 1 - i for i, name in enumerate(workers)}  # first on top
    for name, y in rows.items():
        mine = [e for e in shown if e["worker"] == name]
        for start, end, fence, waiting in _stretches(mine):
            colour = WAITING if waiting else RUN_COLOURS[fence]
            ax.barh(y, end - start, left=start - t0, height=0.5, color=colour)
            if not waiting:
                ax.text(start - t0, y + 0.3, f" fence {fence}", fontsize=8)
        for e in mine:
            marker, colour = MARKERS[e["kind"]]
            ax.scatter(e["t"] - t0, y, marker=marker, color=colour, s=60, zorder=3)
    ax.set_yticks(list(rows.values()), list(rows))
    ax.set_ylim(-0.6, len(rows) - 0.2)
    ax.set_xlabel("seconds")
    ax.set_title(title, loc="left")
    return t0, rows


def plot_timeline(
    one_call: Sequence[Event],
    frozen_owner: Sequence[Event],
    *,
    workers: Sequence[str],
    frozen: tuple[float, float],
    lease: float,
) -> Figure:
    """Both parts of the notebook, one above the other.

    ``one_call``: the events of "three workers, one call"; ``frozen_owner``: those of "a
    frozen worker loses its lease", whose first worker was frozen from ``frozen[0]`` to
    ``frozen[1]`` (epoch seconds) holding a lease of ``lease`` seconds.
    """
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6))
    _draw(top, one_call, workers, "three workers, one call")
    t0, rows = _draw(bottom, frozen_owner, workers, "a frozen worker loses its lease")
    frozen_at, resumed_at = frozen
    bottom.barh(
        rows[workers[0]],
        resumed_at - frozen_at,
        left=frozen_at - t0,
        height=0.5,
        fill=False,
        hatch="//",
        edgecolor="tab:red",
    )
    claimed = next(e["t"] for e in frozen_owner if e["kind"] == "claim")
    bottom.axvline(claimed + lease - t0, color="tab:red", linestyle=":")
    bottom.text(
        claimed + lease - t0, len(rows) - 0.4, " lease of fence 1 ends", color="tab:red", fontsize=8
    )
    legend: list[Any] = [
        Line2D([], [], marker=m, color=c, linestyle="", label=kind.replace("_", " "))
        for kind, (m, c) in MARKERS.items()
    ]
    legend += [Patch(color=c, label=f"runs the tool, fence {f}") for f, c in RUN_COLOURS.items()]
    legend += [
        Patch(color=WAITING, label="waits"),
        Patch(fill=False, hatch="//", edgecolor="tab:red", label="frozen (SIGSTOP)"),
    ]
    fig.legend(handles=legend, loc="center right", fontsize=8)
    fig.tight_layout(rect=(0, 0, 0.8, 1))
    return fig
