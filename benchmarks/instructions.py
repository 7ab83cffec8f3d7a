# ruff: noqa: RUF001  (the report prints multiplication signs on purpose)
"""The wrapper's own cost as instructions executed, which a noisy 2-core machine cannot blur.

``python -m benchmarks.instructions [--calls N] [--out DIR] [--name NAME]``

Wall-clock medians of a ToolNode step swing by ±5 % between two runs of the same code
here (thread hand-offs and the garbage collector dominate a 4-5 ms step), more than the
cuts they are meant to judge. ``valgrind --tool=callgrind`` counts the instructions a
process executes, the same count run after run whatever else the machine does. Each case
runs in its own ``python`` under callgrind with instrumentation off through the imports,
the graph's construction and 50 warm-up calls, then on (``callgrind_control -i on``) for
``N`` calls, the garbage collector off, ``PYTHONHASHSEED=0``; the count is divided by N.

Cases on the in-memory store: ``tool.invoke(call, config)`` with the config a real
ToolNode step passes (:mod:`benchmarks.adapter_profile`) for the unwrapped tool, the
wrapped tool on a fresh thread (a first run) and again (a replay); and the whole
``graph.invoke`` of :mod:`benchmarks.graph_step`, unwrapped and wrapped, on fresh threads
and again. The unwrapped cases run in a process that has wrapped a tool too, as in the
latency run (the library's tracker of calling tools then sees every tool run).

Cases on Redis: the same ToolNode step wrapped with the Redis store (``from_url``, its
held-connection fast path), fresh threads and again, each compared with the step whose
tool runs inside the protocol floor (``build_floor_step`` with ``LuaFloor(client,
held=True)``: one claim script, the action, one complete script; a replay in one round
trip). They run against a throwaway ``redis-server`` this command starts on a free
loopback port (:mod:`benchmarks.server`), flushed before each case. Callgrind counts the
client process alone, which is exactly the part that differs: the server runs a Lua
script of the same kind per round trip in both. Writes
``results/instructions.{md,json}``. ``--against REV`` counts the same cases at another
commit too (a temporary ``git worktree`` of REV, given this module), side by side. Without
valgrind it says so and exits 1.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ._outputs import finish, started

__all__ = ["CASES", "main", "measure"]

#: case id -> (label, the unwrapped case it is compared with)
CASES: dict[str, tuple[str, str | None]] = {
    "tool_plain": ("`tool.invoke(call, config)`, unwrapped", None),
    "tool_first": ("… wrapped, fresh thread (first run)", "tool_plain"),
    "tool_replay": ("… wrapped, same thread again (replay)", "tool_plain"),
    "graph_plain": ("ToolNode step, tool unwrapped, fresh thread", None),
    "graph_first": ("… tool wrapped, fresh thread (first run)", "graph_plain"),
    "graph_plain_again": ("ToolNode step, tool unwrapped, same thread again", None),
    "graph_again": ("… tool wrapped, same thread again (replay)", "graph_plain_again"),
    "graph_floor": ("ToolNode step, tool inside the Redis floor, fresh thread", None),
    "graph_redis": ("… tool wrapped, Redis store, fresh thread (first run)", "graph_floor"),
    "graph_floor_again": ("ToolNode step, tool inside the Redis floor, same thread again", None),
    "graph_redis_again": (
        "… tool wrapped, Redis store, same thread again (replay)",
        "graph_floor_again",
    ),
}

#: the cases that need a Redis server (its URL reaches the child in ``REDIS_ENV``)
REDIS_CASES = frozenset({"graph_floor", "graph_redis", "graph_floor_again", "graph_redis_again"})
REDIS_ENV = "BENCHMARK_INSTRUCTIONS_REDIS_URL"

WARMUP = 50


def _child(case: str, calls: int) -> None:
    """The measured process: build the case, warm it up, count ``calls`` calls."""
    import gc
    import itertools

    from langchain_idempotent import InMemoryIdempotencyStore, RedisIdempotencyStore, idempotent

    from .adapter_profile import _captured
    from .graph_step import ToolCounter, _noop_tool, build_step, step_input

    idempotent(_noop_tool(ToolCounter()), InMemoryIdempotencyStore())  # as in the latency run
    wrapped = CASES[case][1] is not None  # a case measured against an unwrapped one
    store: Any = InMemoryIdempotencyStore() if wrapped else None
    same = case.endswith(("replay", "again"))
    if case in REDIS_CASES:
        import redis

        from .floor import LuaFloor
        from .graph_step import build_floor_step

        url = os.environ[REDIS_ENV]
        if wrapped:
            store = RedisIdempotencyStore.from_url(url)  # as benchmarks.ours.make_store
            graph, _ = build_step(store)
        else:
            graph, _ = build_floor_step(LuaFloor(redis.Redis.from_url(url), held=True))
        message = step_input()
        threads = (f"t{i}" if not same else "again" for i in itertools.count())

        def call() -> None:
            graph.invoke(message, {"configurable": {"thread_id": next(threads)}})

    elif case.startswith("graph"):
        graph, _ = build_step(store)
        message = step_input()
        threads = (f"t{i}" if not same else "again" for i in itertools.count())

        def call() -> None:
            graph.invoke(message, {"configurable": {"thread_id": next(threads)}})

    else:
        tool_call, config = _captured()
        tool = _noop_tool(ToolCounter())
        if store is not None:
            tool = idempotent(tool, store)
        fresh: Iterator[Any] = (
            {**config, "configurable": {**config["configurable"], "thread_id": f"t{i}"}}
            for i in itertools.count()
        )
        again = next(fresh)

        def call() -> None:
            tool.invoke(tool_call, again if same else next(fresh))

    for _ in range(WARMUP):
        call()
    gc.collect()
    gc.disable()
    pid = str(os.getpid())
    subprocess.run(["callgrind_control", "-i", "on", pid], check=True, capture_output=True)
    for _ in range(calls):
        call()
    subprocess.run(["callgrind_control", "-i", "off", pid], check=True, capture_output=True)


def measure(
    case: str, calls: int, cwd: str | Path | None = None, redis_url: str | None = None
) -> int:
    """Instructions per call of ``case``, counted by callgrind in a fresh process (``cwd``:
    the checkout to import ``langchain_idempotent`` and ``benchmarks`` from; ``redis_url``:
    the server of a Redis case)."""
    root = Path(cwd) if cwd is not None else Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory(prefix="callgrind-") as tmp:
        out = Path(tmp) / "callgrind.out"
        env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(root)}
        if redis_url is not None:
            env[REDIS_ENV] = redis_url
        argv = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={out}",
            sys.executable,
            "-m",
            "benchmarks.instructions",
            "--child",
            case,
            "--calls",
            str(calls),
        ]
        done = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{case}: callgrind run failed:\n{done.stderr[-2000:]}")
        found = re.search(r"^totals:\s+(\d+)", out.read_text(), re.MULTILINE)
        if found is None:
            raise RuntimeError(f"{case}: callgrind wrote no totals")
        return int(found.group(1)) // calls


@contextlib.contextmanager
def _checkout(rev: str) -> Iterator[Path]:
    """A temporary worktree of ``rev`` holding this module (an older commit may lack it)."""
    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory(prefix="instructions-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(tree), rev],
            cwd=root,
            check=True,
            capture_output=True,
        )
        try:
            shutil.copy(__file__, tree / "benchmarks" / "instructions.py")
            yield tree
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(tree)], cwd=root, capture_output=True
            )


@contextlib.contextmanager
def _redis_server(cases: list[str], report: dict[str, Any]) -> Iterator[Any | None]:
    """A throwaway ``redis-server`` on a free loopback port when a Redis case is asked for
    (``None`` otherwise, or when it cannot start: the report says why)."""
    if not REDIS_CASES.intersection(cases):
        yield None
        return
    from .server import RedisServer

    try:
        server = RedisServer()
    except RuntimeError as exc:
        report["problems"].append(f"no redis-server for the Redis cases: {exc}")
        yield None
        return
    try:
        yield server
    finally:
        server.close()


def _markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# Instructions per call, in-memory and Redis stores ({report['date']})",
        "",
        f"Command: `{report['command']}` ({report['calls']} counted calls per case after "
        f"{WARMUP} warm-up calls, each case in its own process under callgrind; the counts "
        "repeat to within 0.1 % run after run).",
        "",
    ]
    counts, before, rev = report["instructions"], report.get("against", {}), report.get("rev")
    if rev:
        lines += [
            f"| case | at {rev}: instructions | × base | now: instructions | × base |",
            "|---|---:|---:|---:|---:|",
        ]
    else:
        lines += [
            "| case | instructions per call | × unwrapped (Redis: × floor) |",
            "|---|---:|---:|",
        ]

    def cells(got: dict[str, int], case: str, base: str | None) -> str:
        if case not in got:
            return " | "
        ratio = f"{got[case] / got[base]:.3f}×" if base in got else ""
        return f"{got[case]:,} | {ratio}"

    for case, (label, base) in CASES.items():
        if case not in counts and case not in before:
            continue
        row = f"| {label} | {cells(before, case, base)} | " if rev else f"| {label} | "
        lines.append(row + cells(counts, case, base) + " |")
    return "\n".join(lines) + "\n"


def _count(
    report: dict[str, Any],
    field: str,
    cases: list[str],
    calls: int,
    tree: Path | None,
    server: Any | None,
) -> None:
    for case in cases:
        try:
            url = None
            if case in REDIS_CASES:
                if server is None:
                    raise RuntimeError(f"{case}: no redis-server to run it against")
                with contextlib.closing(server.client()) as client:
                    client.flushdb()  # no record of an earlier case turns a first run into a replay
                url = server.url
            report[field][case] = measure(case, calls, tree, url)
        except RuntimeError as exc:
            report["problems"].append(str(exc))
        where = f" at {report['rev']}" if tree is not None else ""
        print(f"{case}{where}: {report[field].get(case, 'failed')}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.instructions", description=__doc__)
    p.add_argument("--calls", type=int, default=100, help="counted calls per case")
    p.add_argument("--cases", default=",".join(CASES), help="comma-separated case ids")
    p.add_argument("--out", default=str(Path(__file__).with_name("results")))
    p.add_argument("--name", default="instructions")
    p.add_argument("--against", metavar="REV", help="also count the cases at commit REV")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        _child(args.child, args.calls)
        return 0
    if args.calls < 1:
        p.error("--calls must be at least 1")
    cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        p.error(f"unknown case(s) {', '.join(unknown)}; choose from {', '.join(CASES)}")
    report = started("benchmarks.instructions", argv)
    report.update(calls=args.calls, instructions={}, problems=[])
    missing = [tool for tool in ("valgrind", "callgrind_control") if shutil.which(tool) is None]
    if missing:
        report["problems"].append(
            f"{' and '.join(missing)} not found (Debian package valgrind): nothing measured"
        )
    else:
        with _redis_server(cases, report) as server:
            _count(report, "instructions", cases, args.calls, None, server)
            if args.against:
                report.update(rev=args.against, against={})
                try:
                    with _checkout(args.against) as tree:
                        _count(report, "against", cases, args.calls, tree, server)
                except subprocess.CalledProcessError as exc:
                    report["problems"].append(
                        f"could not check out {args.against!r}: {exc.stderr.decode().strip()}"
                    )
    return finish(report, args.out, args.name, _markdown, lambda r, path: None)


if __name__ == "__main__":
    raise SystemExit(main())
