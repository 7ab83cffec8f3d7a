"""The benchmark run: one server, every latency case interleaved, then throughput.

``python -m benchmarks``          full run, writes ``benchmarks/results/latest.{md,json}``
``python -m benchmarks --quick``  under a minute, writes ``quick.{md,json}`` (CI smoke test)
``python -m benchmarks --postgres``  also the PostgreSQL rows (:mod:`benchmarks.postgres`,
                                   on a throwaway cluster or ``--pg-url``), run in a
                                   subprocess after the Redis cases, so that DBOS's
                                   process-wide state never meets this process's workers

The exit status is 0 when the run completed, whatever the timings, and 1 when a case that
could run failed or counted executions wrongly (a first run that did not execute exactly
once, a replay that executed, a duplicate execution by our engine).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from . import regression
from . import report as rep
from .latency import Context, build_cases, latency_results, run_latency
from .server import RedisServer, can_pin, placements, unpin
from .throughput import ProcessPool, ThroughputSpec, run_case

__all__ = ["main"]

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="a short run (< 1 min) for CI")
    p.add_argument("--rounds", type=int, help="latency rounds (default 30; quick 2)")
    p.add_argument("--batch", type=int, help="calls per case per round (default 200; quick 20)")
    p.add_argument("--graph-batch", type=int, help="calls per LangGraph case per round")
    p.add_argument("--throughput-calls", type=int, help="calls per throughput case (default 3200)")
    p.add_argument("--reps", type=int, help="throughput repetitions (default 3; quick 1)")
    p.add_argument("--no-throughput", action="store_true", help="skip the throughput cases")
    p.add_argument("--no-processes", action="store_true", help="skip the process cases")
    p.add_argument("--profile", action="store_true", help="cProfile our Redis engine too")
    p.add_argument(
        "--demo",
        type=int,
        metavar="TICKETS",
        help="also time the refund demo (graphs.batch) with this many tickets (default: skip)",
    )
    p.add_argument(
        "--postgres",
        action="store_true",
        help="also the PostgreSQL rows of benchmarks.postgres (ours vs SELECT 1, DBOS, LangGraph)",
    )
    p.add_argument("--pg-url", help="PostgreSQL server for --postgres (default: a throwaway one)")
    p.add_argument("--out", default=RESULTS_DIR, help="directory for the results")
    p.add_argument("--name", help="file stem of the results (default latest; quick: quick)")
    p.add_argument("--seed", type=int, default=None, help="shuffle seed (default: random)")
    p.add_argument(
        "--baseline",
        default=str(regression.BASELINE),
        help="the ratios to compare with (default: the committed results/baseline.json)",
    )
    p.add_argument(
        "--save-baseline", action="store_true", help="make this run's ratios the new baseline"
    )
    return p.parse_args(argv)


def _throughput_specs(args: argparse.Namespace) -> list[ThroughputSpec]:
    total = args.throughput_calls
    thread_counts = [8] if args.quick else [8, 32]
    specs: list[ThroughputSpec] = []
    for keys in ("distinct", "hot"):
        for workers in thread_counts:
            for impl in ("reference", "ours_redis", "ours_sqlite", "ours_memory"):
                specs.append(ThroughputSpec(impl, "threads", workers, keys, total // workers))
        if not args.no_processes:
            for impl in ("reference", "ours_redis", "ours_sqlite"):
                specs.append(ThroughputSpec(impl, "processes", 4, keys, total // 4))
    return specs


def _check_counts(report: dict[str, Any]) -> list[str]:
    """Execution-count failures: the only thing besides crashes that fails a run."""
    problems: list[str] = []
    for e in report["latency"]:
        if e["status"] == "error":
            problems.append(f"latency {e['row']} {e['column']}: {e['detail']}")
        elif "executions" in e and e["executions"] != e["expected_executions"]:
            problems.append(
                f"latency {e['row']} {e['column']}: {e['executions']} executions for "
                f"{e['calls']} calls (expected {e['expected_executions']})"
            )
    for t in report["throughput"]:
        if t.get("status") == "unavailable":
            continue
        if t.get("status") not in ("ok", "partial"):
            problems.append(f"throughput {t['impl']} {t['mode']}: {t.get('detail')}")
            continue
        if t["impl"].startswith("ours") and (
            t["duplicate_executions"] or t["keys_never_run"] or t["errors"]
        ):
            problems.append(
                f"throughput {t['impl']} {t['workers']} {t['mode']} {t['keys']}: "
                f"{t['duplicate_executions']} duplicates, {t['keys_never_run']} keys never "
                f"run, errors {t['errors']}"
            )
        if t["unexpected_keys"]:
            problems.append(f"throughput {t['impl']}: executions under unexpected keys")
    return problems


def _run_postgres(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """``python -m benchmarks.postgres`` in a subprocess; its report and Markdown rows."""
    from .postgres import markdown

    with tempfile.TemporaryDirectory(prefix="bench-pg-") as out:
        cmd = [sys.executable, "-m", "benchmarks.postgres", "--out", out, "--name", "postgres"]
        cmd += ["--seed", str(seed)] + (["--quick"] if args.quick else [])
        cmd += ["--pg-url", args.pg_url] if args.pg_url else []
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
        proc = subprocess.run(
            cmd, cwd=root, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": path}
        )
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
            return {"status": "error", "detail": " / ".join(tail)}
        with open(os.path.join(out, "postgres.json")) as f:
            pg = json.load(f)
    return {"status": "ok", "report": pg, "markdown": markdown(pg)}


def _postgres_goals(postgres: dict[str, Any]) -> list[dict[str, Any]]:
    from .postgres import GOALS

    texts = {
        "first_vs_select1": f"PostgreSQL: first run ≤ {GOALS['first_vs_select1']}x `SELECT 1`",
        "replay_vs_select1": f"PostgreSQL: replay ≤ {GOALS['replay_vs_select1']}x `SELECT 1`",
        "dbos_vs_ours": f"PostgreSQL: ≥ {GOALS['dbos_vs_ours']}x cheaper per protected call "
        "than a DBOS step",
    }
    if postgres["status"] != "ok":
        return [
            {"goal": t, "status": "not measured", "figures": "run failed"} for t in texts.values()
        ]
    pg = postgres["report"]
    return [
        {
            "goal": text,
            "status": pg["verdicts"][goal],
            "figures": f"{pg['ratios'][goal]:.2f}x" if goal in pg["ratios"] else "-",
        }
        for goal, text in texts.items()
    ]


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    quick = args.quick
    args.rounds = args.rounds or (2 if quick else 30)
    args.batch = args.batch or (20 if quick else 200)
    args.graph_batch = args.graph_batch or (6 if quick else 50)
    args.throughput_calls = args.throughput_calls or (320 if quick else 3200)
    args.reps = args.reps or (1 if quick else 3)
    args.name = args.name or ("quick" if quick else "latest")
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    warnings.simplefilter("ignore", DeprecationWarning)
    command = "python -m benchmarks " + " ".join(sys.argv[1:] if argv is None else argv)
    started = time.monotonic()

    def progress(msg: str) -> None:
        print(f"[{time.monotonic() - started:6.1f}s] {msg}", file=sys.stderr, flush=True)

    where = placements()
    original_cpus = sorted(os.sched_getaffinity(0)) if can_pin() else []
    load_start = [round(x, 2) for x in os.getloadavg()]
    with ExitStack() as stack:
        server = stack.enter_context(RedisServer(cpu=where[0].server_cpu))
        workdir = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-"))
        progress(f"redis-server {server.version} on port {server.port}")
        ctx = Context(server=server, workdir=workdir, stack=stack)
        cases = build_cases(ctx)
        run_latency(
            cases,
            server,
            where,
            rounds=args.rounds,
            batch=args.batch,
            graph_batch=args.graph_batch,
            seed=seed,
            progress=progress,
        )
        latency = latency_results(cases, where)
        if original_cpus:
            unpin(server, original_cpus)

        runs: list[dict[str, Any]] = []
        if not args.no_throughput:
            specs = _throughput_specs(args)
            pool = None
            if any(s.mode == "processes" for s in specs):
                pool = ProcessPool(4)
                stack.callback(pool.close)
            for impl in sorted({s.impl for s in specs if s.mode == "processes"}):
                # Untimed: the first task of a worker pays for imports and connections.
                warm = ThroughputSpec(impl, "processes", 4, "distinct", 4)
                run_case(warm, server.url, workdir, "warm-" + uuid.uuid4().hex[:8], pool)
            rng = random.Random(seed)
            for r in range(args.reps):
                order = list(specs)
                rng.shuffle(order)
                for spec in order:
                    tag = uuid.uuid4().hex[:8]
                    runs.append(run_case(spec, server.url, workdir, tag, pool))
                progress(f"throughput repetition {r + 1}/{args.reps}")

        profile_text = None
        if args.profile:
            from .profile import profile_ours

            profile_text = profile_ours(server.url, workdir)

    progress("servers and workers stopped")
    postgres = None
    if args.postgres:
        progress("postgres rows (benchmarks.postgres, in a subprocess)")
        postgres = _run_postgres(args, seed)
    demo = None
    if args.demo:
        from .demo import run_demo

        progress(f"refund demo, {args.demo} tickets")
        demo = run_demo(args.demo)

    throughput = rep.aggregate_throughput(runs)
    progress("writing the report")
    labels = {p.name: p.label for p in where}
    report: dict[str, Any] = {
        "mode": "quick" if quick else "full",
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command.strip(),
        "seed": seed,
        "machine": rep.machine_info(
            server.version, "taskset + sched_setaffinity" if can_pin() else "none"
        ),
        "loadavg_start": load_start,
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        "config": {
            "rounds": args.rounds,
            "batch": args.batch,
            "graph_batch": args.graph_batch,
            "throughput_calls": args.throughput_calls,
            "throughput_reps": args.reps,
        },
        "placements": labels,
        "latency": latency,
        "throughput": throughput,
        "throughput_runs": runs,
        "demo": demo,
        "postgres": postgres,
        "elapsed_s": round(time.monotonic() - started, 1),
    }
    report["goals"] = rep.evaluate_goals(latency, throughput, labels, demo)
    if postgres is not None:
        report["goals"] += _postgres_goals(postgres)
    problems = _check_counts(report)
    if postgres is not None and postgres["status"] != "ok":
        problems.append(f"postgres: {postgres['detail']}")
    report["problems"] = problems
    report["notes"] = [
        f"Run took {report['elapsed_s']} s; seed {seed}.",
        "Other processes on this machine add noise: compare ratios within one run, not "
        "absolute figures across runs.",
        *[f"PROBLEM: {p}" for p in problems],
    ]
    baseline = regression.load_baseline(Path(args.baseline))
    guard: list[str] = []
    if baseline is not None:
        guard = regression.render(regression.compare(regression.ratios(report), baseline))
    report["regressions"] = guard
    os.makedirs(args.out, exist_ok=True)
    md = rep.render_markdown(report)
    if guard:
        md += "\n## Against the committed baseline\n\n" + "\n".join(guard) + "\n"
    with open(os.path.join(args.out, f"{args.name}.md"), "w") as f:
        f.write(md)
    with open(os.path.join(args.out, f"{args.name}.json"), "w") as f:
        json.dump(report, f, indent=2, default=str)
        f.write("\n")
    if profile_text is not None:
        with open(os.path.join(args.out, "profile.txt"), "w") as f:
            f.write(profile_text)
    if args.save_baseline:
        regression.save_baseline(report, Path(args.baseline))
        progress(f"baseline written to {args.baseline}")
    print(md)
    if guard:
        print(guard[0], file=sys.stderr)
    for p in problems:
        print(f"PROBLEM: {p}", file=sys.stderr)
    return 1 if problems else 0
