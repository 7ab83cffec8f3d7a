# ruff: noqa: RUF001  (the report prints multiplication signs and dashes on purpose)
"""Machine facts, the goals of the benchmark issue, and the Markdown / JSON report."""

from __future__ import annotations

import contextlib
import os
import platform
import statistics
import subprocess
from collections.abc import Callable
from importlib import metadata
from typing import Any

from .latency import FIRST_RUN, REPLAY, ROWS

__all__ = ["aggregate_throughput", "evaluate_goals", "machine_info", "render_markdown"]

MET, NOT_MET, NOT_MEASURED = "met", "not met", "not measured"


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=os.path.dirname(os.path.abspath(__file__)),
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def machine_info(redis_server_version: str, pinned_with: str) -> dict[str, Any]:
    return {
        "nproc": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "redis_server": redis_server_version,
        "redis_py": _version("redis"),
        "hiredis": _version("hiredis"),
        "langgraph": _version("langgraph"),
        "langchain_core": _version("langchain-core"),
        "aws_lambda_powertools": _version("aws-lambda-powertools"),
        "pinning": pinned_with,
        "git_commit": _git_commit(),
    }


# -- throughput aggregation ------------------------------------------------------------


def aggregate_throughput(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Repetitions of one case folded together: median rates, summed counts."""
    by_case: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in runs:
        k = (r["impl"], r["mode"], r["workers"], r["keys"])
        by_case.setdefault(k, []).append(r)
    out: list[dict[str, Any]] = []
    for (impl, mode, workers, keys), reps in by_case.items():
        ok = [r for r in reps if r.get("status") == "ok"]
        entry: dict[str, Any] = {"impl": impl, "mode": mode, "workers": workers, "keys": keys}
        if not ok:
            entry.update(status=reps[0].get("status", "error"), detail=reps[0].get("detail"))
            out.append(entry)
            continue
        errors: dict[str, int] = {}
        for r in ok:
            for name, n in r["errors"].items():
                errors[name] = errors.get(name, 0) + n
        entry.update(
            status="ok" if len(ok) == len(reps) else "partial",
            repetitions=len(ok),
            calls_per_s=statistics.median(r["calls_per_s"] for r in ok),
            results_per_s=statistics.median(r["results_per_s"] for r in ok),
            calls=sum(r["calls"] for r in ok),
            results=sum(r["results"] for r in ok),
            errors=errors,
            key_count=sum(r["key_count"] for r in ok),
            executions=sum(r["executions"] for r in ok),
            keys_run_more_than_once=sum(r["keys_run_more_than_once"] for r in ok),
            duplicate_executions=sum(r["duplicate_executions"] for r in ok),
            keys_never_run=sum(r["keys_never_run"] for r in ok),
            unexpected_keys=sum(r["unexpected_keys"] for r in ok),
        )
        out.append(entry)
    return out


# -- goals -----------------------------------------------------------------------------


class _Lookup:
    def __init__(self, latency: list[dict[str, Any]], throughput: list[dict[str, Any]]) -> None:
        self.lat = {(e["row"], e["column"]): e for e in latency}
        self.tp = {(e["impl"], e["mode"], e["workers"], e["keys"]): e for e in throughput}

    def stat(self, row: str, column: str, placement: str) -> dict[str, float] | None:
        e = self.lat.get((row, column))
        if e is None:
            return None
        s: dict[str, float] | None = e["placements"].get(placement)
        return s

    def tput(self, impl: str, mode: str, workers: int, keys: str) -> dict[str, Any] | None:
        e = self.tp.get((impl, mode, workers, keys))
        return e if e is not None and e.get("status") in ("ok", "partial") else None


def _combine(per_place: list[tuple[str, bool | None, str]]) -> tuple[str, str]:
    measured = [(p, ok, fig) for p, ok, fig in per_place if ok is not None]
    figures = "; ".join(f"{p}: {fig}" for p, _, fig in per_place)
    if not measured:
        return NOT_MEASURED, figures
    return (MET if all(ok for _, ok, _ in measured) else NOT_MET), figures


def evaluate_goals(
    latency: list[dict[str, Any]],
    throughput: list[dict[str, Any]],
    placement_labels: dict[str, str],
    demo: dict[str, Any] | None = None,
) -> list[dict[str, str]]:
    """Each goal of the issue as met / not met / not measured, with the figures behind it."""
    look = _Lookup(latency, throughput)
    goals: list[dict[str, str]] = []

    def per_placement(text: str, figure: Callable[[str], tuple[bool | None, str]]) -> None:
        rows = [(name, *figure(name)) for name in placement_labels]
        status, figures = _combine(rows)
        goals.append({"goal": text, "status": status, "figures": figures})

    def ratio_goal(row: str, column: str, limit: float) -> Callable[[str], tuple[bool | None, str]]:
        def fig(p: str) -> tuple[bool | None, str]:
            s = look.stat(row, column, p)
            if s is None or "ratio_to_ping" not in s:
                return None, "not measured"
            r = s["ratio_to_ping"]
            return r <= limit, f"{s['median_us']:.1f} µs = {r:.2f}× r.ping()"

        return fig

    def speedup_goal(
        slow: tuple[str, str], fast: tuple[str, str], limit: float
    ) -> Callable[[str], tuple[bool | None, str]]:
        def fig(p: str) -> tuple[bool | None, str]:
            a, b = look.stat(*slow, p), look.stat(*fast, p)
            if a is None or b is None:
                return None, "not measured"
            x = a["median_us"] / b["median_us"]
            return x >= limit, f"{a['median_us']:.1f} / {b['median_us']:.1f} µs = {x:.2f}×"

        return fig

    def overhead_goal(
        wrapped: tuple[str, str], plain: tuple[str, str], limit: float
    ) -> Callable[[str], tuple[bool | None, str]]:
        def fig(p: str) -> tuple[bool | None, str]:
            a, b = look.stat(*wrapped, p), look.stat(*plain, p)
            if a is None or b is None:
                return None, "not measured"
            x = a["median_us"] / b["median_us"]
            return x <= limit, f"{a['median_us']:.0f} / {b['median_us']:.0f} µs = {x:.3f}×"

        return fig

    def absolute_goal(
        row: str, column: str, limit_us: float
    ) -> Callable[[str], tuple[bool | None, str]]:
        def fig(p: str) -> tuple[bool | None, str]:
            s = look.stat(row, column, p)
            if s is None:
                return None, "not measured"
            return s["median_us"] <= limit_us, f"{s['median_us']:.1f} µs"

        return fig

    # Issue 24's goals: the engine alone, then Redis, then a real ToolNode step.
    per_placement(
        "In-memory engine, first run ≤ 15 µs", absolute_goal("ours_memory", FIRST_RUN, 15.0)
    )
    per_placement("In-memory engine, replay ≤ 5 µs", absolute_goal("ours_memory", REPLAY, 5.0))
    per_placement("Redis replay ≤ 1.05× one r.ping()", ratio_goal("ours_redis", REPLAY, 1.05))
    per_placement("Redis first run ≤ 2.0× one r.ping()", ratio_goal("ours_redis", FIRST_RUN, 2.0))
    per_placement(
        "Redis first run ≥ 2.5× faster than the reference approach",
        speedup_goal(("reference", FIRST_RUN), ("ours_redis", FIRST_RUN), 2.5),
    )
    per_placement(
        "Redis replay ≥ 5× faster than Powertools",
        speedup_goal(("powertools", REPLAY), ("ours_redis", REPLAY), 5.0),
    )

    # Throughput, 4 processes.
    ref_d, our_d = (look.tput(i, "processes", 4, "distinct") for i in ("reference", "ours_redis"))
    if ref_d and our_d:
        x = our_d["results_per_s"] / ref_d["results_per_s"]
        goals.append(
            {
                "goal": "4 processes, distinct keys: ≥ 2.4× the reference approach's throughput",
                "status": MET if x >= 2.4 else NOT_MET,
                "figures": f"{our_d['results_per_s']:.0f} vs {ref_d['results_per_s']:.0f} "
                f"results/s = {x:.2f}×",
            }
        )
    else:
        goals.append(
            {
                "goal": "4 processes, distinct keys: ≥ 2.4× the reference approach's throughput",
                "status": NOT_MEASURED,
                "figures": "",
            }
        )
    ref_h, our_h = (look.tput(i, "processes", 4, "hot") for i in ("reference", "ours_redis"))
    text = "4 processes, hot set of 16 keys: ahead of the reference, with 0 duplicate executions"
    if ref_h and our_h:
        x = our_h["results_per_s"] / ref_h["results_per_s"]
        ok = x > 1.0 and our_h["duplicate_executions"] == 0
        ref_err = sum(ref_h["errors"].values())
        goals.append(
            {
                "goal": text,
                "status": MET if ok else NOT_MET,
                "figures": f"{our_h['results_per_s']:.0f} vs {ref_h['results_per_s']:.0f} "
                f"results/s = {x:.2f}×; duplicate executions: ours "
                f"{our_h['duplicate_executions']}, reference {ref_h['duplicate_executions']} "
                f"({ref_h['keys_run_more_than_once']} of {ref_h['key_count']} keys ran more than "
                f"once; {ref_err} calls answered 'Lock contention')",
            }
        )
    else:
        goals.append({"goal": text, "status": NOT_MEASURED, "figures": ""})

    for store, row, limit in (("in-memory", "graph_memory", 1.05), ("Redis", "graph_redis", 1.10)):
        per_placement(
            f"LangGraph step, wrapped ({store} store), fresh thread ≤ {limit:.2f}× unwrapped",
            overhead_goal((row, FIRST_RUN), ("graph_plain", FIRST_RUN), limit),
        )
        per_placement(
            f"LangGraph step, wrapped ({store} store), same thread again ≤ {limit:.2f}× unwrapped",
            overhead_goal((row, REPLAY), ("graph_plain", REPLAY), limit),
        )

    reported = [
        look.stat(row, col, p)
        for row in ("ours_sqlite", "ours_memory")
        for col in (REPLAY, FIRST_RUN)
        for p in placement_labels
    ]
    sqlite_tp = [look.tput("ours_sqlite", "processes", 4, k) for k in ("distinct", "hot")]
    lat_ok = all(s is not None for s in reported)
    tp_ok = all(t is not None for t in sqlite_tp)
    figs = []
    if tp_ok:
        figs = [
            f"{t['keys']} {t['results_per_s']:.0f} results/s, "
            f"{t['duplicate_executions']} duplicates"
            for t in sqlite_tp
            if t is not None
        ]
    goals.append(
        {
            "goal": "SQLite and in-memory replay / first-run latency reported; "
            "SQLite throughput across 4 processes",
            "status": MET if lat_ok and tp_ok else NOT_MEASURED,
            "figures": ("latency: see table; " if lat_ok else "latency missing; ")
            + ("; ".join(f"4 processes {f}" for f in figs) if tp_ok else "throughput missing"),
        }
    )
    text = "Refund demo with protection ≤ 1.1× the unprotected wall time (same seeded faults)"
    walls = (demo or {}).get("wall_time_s") or {}
    if demo and demo.get("status") == "ok" and walls.get("none") and walls.get("idempotent"):
        x = walls["idempotent"] / walls["none"]
        ref = f", reference {walls['reference']:.1f} s" if walls.get("reference") else ""
        goals.append(
            {
                "goal": text,
                "status": MET if x <= 1.1 else NOT_MET,
                "figures": f"{demo['tickets']} tickets: protected {walls['idempotent']:.1f} s, "
                f"unprotected {walls['none']:.1f} s = {x:.2f}×{ref} (`{demo['command']}`)",
            }
        )
    else:
        why = (demo or {}).get("detail") or "run with --demo TICKETS to time graphs.batch"
        goals.append({"goal": text, "status": NOT_MEASURED, "figures": str(why)[:300]})
    return goals


# -- Markdown --------------------------------------------------------------------------


def _cell(e: dict[str, Any] | None, placement: str, base: dict[str, Any] | None = None) -> str:
    """A median with its ratio to ``r.ping()``, or to ``base``'s median (the unwrapped
    ToolNode step, for the other LangGraph rows)."""
    if e is None:
        return ""
    if e["status"] != "ok" and not e["placements"]:
        return str(e.get("detail") or e["status"])
    s = e["placements"].get(placement)
    if s is None:
        return ""
    under = (base or {}).get("placements", {}).get(placement)
    if under is not None:
        ratio = f"{s['median_us'] / under['median_us']:.3f}× unwrapped"
    else:
        ratio = f"{s['ratio_to_ping']:.2f}×" if "ratio_to_ping" in s else "–"
    return f"{s['median_us']:.1f} µs ({ratio}; p90 {s['p90_us']:.1f})"


def _latency_table(latency: list[dict[str, Any]], placement: str) -> list[str]:
    by = {(e["row"], e["column"]): e for e in latency}
    lines = [
        "| | replay | first run |",
        "|---|---|---|",
    ]
    for row, label in ROWS:
        rep, first = by.get((row, REPLAY)), by.get((row, FIRST_RUN))
        if rep is None and first is None:
            continue
        base_rep = base_first = None
        if row.startswith("graph"):
            label += " ¹"
            if row != "graph_plain":
                base_rep, base_first = (
                    by.get(("graph_plain", REPLAY)),
                    by.get(("graph_plain", FIRST_RUN)),
                )
        cells = f"{_cell(rep, placement, base_rep)} | {_cell(first, placement, base_first)}"
        lines.append(f"| {label} | {cells} |")
    return lines


_IMPL = {
    "reference": "reference approach",
    "ours_redis": "ours, Redis",
    "ours_sqlite": "ours, SQLite",
    "ours_memory": "ours, in-memory",
}


def _throughput_table(throughput: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| workers | keys | implementation | calls/s | results/s | errors | executions "
        "| keys run > once | duplicate executions |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    order = {"reference": 0, "ours_redis": 1, "ours_sqlite": 2, "ours_memory": 3}
    rows = sorted(
        throughput,
        key=lambda e: (e["mode"] != "threads", e["workers"], e["keys"], order[e["impl"]]),
    )
    for e in rows:
        who = f"{e['workers']} {e['mode']}"
        name = _IMPL.get(e["impl"], e["impl"])
        if e.get("status") not in ("ok", "partial"):
            lines.append(f"| {who} | {e['keys']} | {name} | {e.get('detail')} | | | | | |")
            continue
        errs = ", ".join(f"{n} {k}" for k, n in e["errors"].items()) or "0"
        lines.append(
            f"| {who} | {e['keys']} | {name} | {e['calls_per_s']:.0f} | {e['results_per_s']:.0f} "
            f"| {errs} | {e['executions']} for {e['key_count']} keys "
            f"| {e['keys_run_more_than_once']} | {e['duplicate_executions']} |"
        )
    return lines


def render_markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    cfg = report["config"]
    out = [
        f"# Benchmark results ({report['mode']} run, {report['date']})",
        "",
        f"Command: `{report['command']}`",
        "",
        f"Machine: {m['nproc']} vCPU {m['cpu_model']}, {m['platform']}; Python {m['python']}; "
        f"redis-server {m['redis_server']}; redis-py {m['redis_py']} with hiredis "
        f"{m['hiredis']}; langgraph {m['langgraph']}; langchain-core {m['langchain_core']}; "
        f"aws-lambda-powertools {m['aws_lambda_powertools']}; commit {m['git_commit']}. "
        f"Pinning: {m['pinning']}. Load average at start / end: "
        f"{report['loadavg_start']} / {report['loadavg_end']}.",
        "",
        f"Latency: medians over {cfg['rounds']} shuffled rounds (after one warm-up round) of "
        f"{cfg['batch']} calls per case ({cfg['graph_batch']} for the LangGraph rows), "
        "every case interleaved with the others; in brackets the ratio to one `r.ping()` "
        "measured in the same rounds, and the p90.",
        "",
    ]
    for name, label in report["placements"].items():
        out += [f"## Per-call latency — {label}", ""]
        out += _latency_table(report["latency"], name)
        out.append("")
    out += [
        "¹ One `graph.invoke` of `START → ToolNode → END` with an in-memory checkpointer; "
        '"replay" = the same thread invoked again (the wrapped tool replays, the unwrapped '
        'tool runs again), "first run" = a fresh thread. The wrapped rows and the floor row '
        "give their ratio to the unwrapped step of the same column; the floor row's tool "
        "makes the minimal protocol's round trips itself (no key, fences, events or "
        "serialization): what any two-round-trip design costs inside this step.",
        "",
    ]
    if report["throughput"]:
        out += [
            "## Throughput (client and server unpinned)",
            "",
            f"{cfg['throughput_calls']} calls per case and repetition, "
            f"{cfg['throughput_reps']} repetition(s) in shuffled order; rates are medians over "
            "repetitions, counts are totals. `hot` = all workers go through the same "
            "generations of 16 keys; one execution per key is right. Results/s counts calls "
            "answered with a result; errors (the reference's 'Lock contention') are counted "
            "apart.",
            "",
        ]
        out += _throughput_table(report["throughput"])
        out.append("")
    postgres = report.get("postgres")
    if postgres is not None:
        out += ["## PostgreSQL (`benchmarks/postgres.py`, run by `--postgres`)", ""]
        if postgres["status"] == "ok":
            out += [postgres["markdown"], ""]
        else:
            out += [f"The run failed: {postgres['detail']}", ""]
    out += ["## Goals", ""]
    for g in report["goals"]:
        out.append(f"- **{g['status']}** — {g['goal']}: {g['figures']}")
    out.append("")
    if report.get("notes"):
        out += ["## Notes", ""]
        out += [f"- {n}" for n in report["notes"]]
        out.append("")
    return "\n".join(out)
