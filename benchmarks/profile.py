"""Where our Redis engine spends its time: cProfile of replay and first run next to r.ping().

For each operation: Python function calls per call (a good proxy for interpreter cost on
the fast path), and the functions with the most own time. Written to
``benchmarks/results/profile.txt`` by ``python -m benchmarks --profile``.
"""

from __future__ import annotations

import cProfile
import io
import itertools
import os
import pstats
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import redis

from . import ours

__all__ = ["profile_ours"]

CALLS = 2000


def _profile(name: str, op: Callable[[int], object], top: int = 25) -> str:
    for i in range(200):
        op(i)  # warm up outside the profile
    prof = cProfile.Profile()
    prof.enable()
    for i in range(CALLS):
        op(i)
    prof.disable()
    stats = pstats.Stats(prof)
    total_calls = stats.total_calls  # type: ignore[attr-defined]
    total_tt = stats.total_tt  # type: ignore[attr-defined]
    groups: dict[str, list[float]] = {}
    for (filename, _line, func), row in stats.stats.items():  # type: ignore[attr-defined]
        g = groups.setdefault(_group(filename, func), [0.0, 0.0])
        g[0] += row[1]  # calls (all, including recursive)
        g[1] += row[2]  # own time
    lines = [
        f"=== {name}: {total_calls / CALLS:.0f} function calls per call, "
        f"{total_tt / CALLS * 1e6:.1f} µs per call under the profiler ===",
        "own time by where the code lives (calls per call, share of own time):",
    ]
    for where, (calls, tt) in sorted(groups.items(), key=lambda kv: -kv[1][1]):
        lines.append(f"  {where:<44} {calls / CALLS:6.1f} calls  {tt / total_tt:6.1%}")
    buf = io.StringIO()
    stats.stream = buf  # type: ignore[attr-defined]
    stats.sort_stats("tottime").print_stats(top)
    return "\n".join(lines) + "\n" + buf.getvalue()


def _group(filename: str, func: str) -> str:
    """A coarse place for a profiled function: our module, redis-py, the socket, ..."""
    if filename == "~":
        if "socket" in func or "recv" in func or "send" in func:
            return "socket I/O (C)"
        return "builtins (C)"
    marker = "langchain_idempotent/"
    if marker in filename:
        return "langchain_idempotent/" + filename.split(marker, 1)[1]
    if "/redis/" in filename:
        return "redis-py"
    if "/langgraph/" in filename or "/langchain_core/" in filename:
        return "langgraph / langchain-core"
    if "benchmarks/" in filename:
        return "benchmark harness"
    return "stdlib / other"


def profile_ours(redis_url: str, workdir: str) -> str:
    r = redis.Redis.from_url(redis_url)
    out = [_profile("r.ping()", lambda i: r.ping())]
    store: Any = ours.make_store("redis", redis_url=redis_url, workdir=workdir)
    engine = ours.make_engine(store)

    def action() -> dict[str, bool]:
        return {"ok": True}

    engine.run("profile:replay", fingerprint="fp", action=action)
    out.append(
        _profile(
            "ours, Redis replay",
            lambda i: engine.run("profile:replay", fingerprint="fp", action=action),
        )
    )
    fresh = itertools.count()
    out.append(
        _profile(
            "ours, Redis first run",
            lambda i: engine.run(f"profile:first:{next(fresh)}", fingerprint="fp", action=action),
        )
    )
    store.close()
    r.close()
    out += _profile_tool(workdir)
    out.append(_renewal_wakeups(workdir))
    return "\n".join(out)


def _profile_tool(workdir: str) -> list[str]:
    """One tool call as ToolNode makes it, unwrapped and wrapped (in-memory store)."""
    from .graph_step import ToolCounter, _noop_tool

    inner = _noop_tool(ToolCounter())
    wrapped = ours.wrap(inner, ours.make_store("memory", redis_url="", workdir=workdir))
    threads = itertools.count()

    def call(tool: Any) -> Callable[[int], object]:
        def op(i: int) -> object:
            tool_call = {
                "name": "noop",
                "args": {"order_id": "A-1", "amount": 140},
                "id": "call_1",
                "type": "tool_call",
            }
            config = {
                "configurable": {"thread_id": f"t{next(threads)}"},
                "metadata": {"langgraph_node": "tools", "langgraph_checkpoint_ns": "tools:x"},
            }
            return tool.invoke(tool_call, config)

        return op

    return [
        _profile("tool.invoke, unwrapped (fresh thread)", call(inner)),
        _profile("tool.invoke, wrapped, in-memory store (fresh thread)", call(wrapped)),
    ]


def _renewal_wakeups(workdir: str) -> str:
    """How often a first run wakes the engine's renewal thread (a GIL hand-off each time).

    Counted in a fresh interpreter: the answer depends on what the scheduler already holds.
    """
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = "from benchmarks.profile import count_wakeups; print(count_wakeups())"
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"renewal wake-ups: not measured ({exc})"
    return proc.stdout.strip() or f"renewal wake-ups: not measured ({proc.stderr[-300:]})"


def count_wakeups() -> str:
    """In this (fresh) process: renewal-thread notifies per 1000 in-memory first runs."""
    from langchain_idempotent.core import heartbeat

    workdir = ""
    scheduler: Any = getattr(heartbeat, "_scheduler", None)
    if scheduler is None or not hasattr(scheduler, "_cond"):
        return "renewal wake-ups: scheduler internals changed; not measured"
    engine = ours.make_engine(ours.make_store("memory", redis_url="", workdir=workdir))
    engine.run("warm", fingerprint="fp", action=lambda: 1)
    cond = scheduler._cond
    original = cond.notify
    count = 0

    def counting(n: int = 1) -> None:
        nonlocal count
        count += 1
        original(n)

    cond.notify = counting
    try:
        for i in range(1000):
            engine.run(f"wake:{i}", fingerprint="fp", action=lambda: 1)
    finally:
        cond.notify = original
    return f"=== renewal thread woken (Condition.notify) {count} times per 1000 first runs ==="
