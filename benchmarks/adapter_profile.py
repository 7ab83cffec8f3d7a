"""Where the wrapper's cost goes inside a ToolNode step, apart from the store.

``python -m benchmarks.adapter_profile [--calls N] [--out FILE]``

A ``ToolNode`` runs each tool on an executor thread, which a main-thread profiler does not
see. So this captures the ``config`` and ``ToolCall`` that a real ``ToolNode`` step hands
the wrapped tool (``benchmarks.graph_step``: ``START → tools → END`` with ``InMemorySaver``),
and then profiles, on the main thread, ``tool.invoke(call, config)`` for the unwrapped tool,
the wrapped tool on a fresh thread (a first run) and the wrapped tool again (a replay), on
the in-memory store. Function calls per invoke are independent of the machine's load; the
table lists, per function, the calls and the cumulative profiled time the wrapper adds over
the unwrapped tool. Written to ``benchmarks/results/adapter_profile.txt``.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import itertools
import pstats
import time
from pathlib import Path
from typing import Any

from langchain_idempotent import InMemoryIdempotencyStore, idempotent
from langchain_idempotent.adapters.tool import IdempotentTool

from .graph_step import ToolCounter, _noop_tool, build_step, step_input

__all__ = ["main"]

OUT = Path(__file__).with_name("results") / "adapter_profile.txt"


def _captured() -> tuple[Any, dict[str, Any]]:
    """The ToolCall and config a real ToolNode step invokes a wrapped tool with."""
    seen: dict[str, Any] = {}
    original = IdempotentTool.invoke

    def spy(self: IdempotentTool, input: Any, config: Any = None, **kwargs: Any) -> Any:
        seen.setdefault("call", input)
        seen.setdefault("config", config)
        return original(self, input, config, **kwargs)

    IdempotentTool.invoke = spy  # type: ignore[method-assign]
    try:
        graph, _ = build_step(InMemoryIdempotencyStore())
        graph.invoke(step_input(), {"configurable": {"thread_id": "capture"}})
    finally:
        IdempotentTool.invoke = original  # type: ignore[method-assign]
    return seen["call"], seen["config"]


def _profile(
    tool: Any, call: Any, config: dict[str, Any], calls: int, replay: bool
) -> pstats.Stats:
    threads = itertools.count()

    def cfg() -> dict[str, Any]:
        c = dict(config)
        c["configurable"] = {**config["configurable"], "thread_id": f"t{next(threads)}"}
        return c

    same = cfg()
    for _ in range(50):
        tool.invoke(call, same if replay else cfg())
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        tool.invoke(call, same if replay else cfg())
    prof.disable()
    return pstats.Stats(prof)


def _per_function(stats: pstats.Stats, calls: int) -> dict[str, tuple[float, float]]:
    out: dict[str, tuple[float, float]] = {}
    for (path, line, fn), row in stats.stats.items():  # type: ignore[attr-defined]
        where = path.split("site-packages/")[-1].split("python3.11/")[-1]
        if "langchain_idempotent/" in where:
            where = "langchain_idempotent/" + where.split("langchain_idempotent/", 1)[1]
        out[f"{where}:{line}({fn})"] = (row[1] / calls, row[3] / calls * 1e6)
    return out


def profile(calls: int) -> str:
    call, config = _captured()
    plain = _noop_tool(ToolCounter())
    wrapped = idempotent(_noop_tool(ToolCounter()), InMemoryIdempotencyStore())
    runs = {
        "unwrapped": _profile(plain, call, config, calls, replay=False),
        "wrapped, first run": _profile(wrapped, call, config, calls, replay=False),
        "wrapped, replay": _profile(wrapped, call, config, calls, replay=True),
    }
    lines = [
        f"# The wrapper inside a ToolNode step, in-memory store ({calls} invokes each, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
        "",
        "Command: `python -m benchmarks.adapter_profile`. Python function calls per "
        "`tool.invoke(call, config)` with the config a real ToolNode step passes:",
        "",
    ]
    for name, stats in runs.items():
        lines.append(f"- {name}: {stats.total_calls / calls:.0f} calls")  # type: ignore[attr-defined]
    base = _per_function(runs["unwrapped"], calls)
    for name in ("wrapped, first run", "wrapped, replay"):
        mine = _per_function(runs[name], calls)
        rows = []
        for fn in set(mine) | set(base):
            c1, t1 = mine.get(fn, (0.0, 0.0))
            c0, t0 = base.get(fn, (0.0, 0.0))
            if c1 != c0 and "langchain_idempotent/" in fn:
                rows.append((t1 - t0, c1 - c0, fn))
        rows.sort(reverse=True)
        lines += [
            "",
            f"## {name}: our functions, by cumulative profiled time added per invoke",
            "",
            "| µs (profiled, cumulative) | calls | function |",
            "|---:|---:|---|",
        ]
        lines += [f"| {dt:.1f} | {dc:+.1f} | `{fn}` |" for dt, dc, fn in rows[:30]]
    counts: collections.Counter[str] = collections.Counter()
    for fn, (c, _) in _per_function(runs["wrapped, first run"], calls).items():
        counts[fn.split(":")[0].split("/")[0]] += round(c)
    lines += [
        "",
        "Calls per first-run invoke by package: "
        + ", ".join(f"{k} {v}" for k, v in counts.most_common(8)),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.adapter_profile", description=__doc__)
    p.add_argument("--calls", type=int, default=1000)
    p.add_argument("--out", default=str(OUT))
    args = p.parse_args(argv)
    text = profile(args.calls)
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
