"""The in-memory engine and the wrapped tool with a ToolNode config, timed side by side.

``python -m benchmarks.adapter_timing [--rounds N] [--batch N]``

Interleaved rounds (one warm-up round not recorded) of: ``Engine.run`` on the in-memory
store with the benchmarks' policy (``benchmarks.ours.make_engine``), a first run (a new
key) and a replay; and ``tool.invoke(call, config)`` with the ``ToolCall`` and config a
real ``ToolNode`` step passes (as :mod:`benchmarks.adapter_profile` captures them), for
the unwrapped tool, the wrapped tool on a fresh thread (a first run) and again (a replay).
Prints the median per case in µs and the wrapped / unwrapped ratios. Wall-clock figures:
on a loaded machine compare runs made one right after the other.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from langchain_idempotent import InMemoryIdempotencyStore, idempotent

from . import ours
from .adapter_profile import _captured
from .graph_step import ToolCounter, _noop_tool

__all__ = ["interleaved", "main"]

_K = TypeVar("_K")


def _cases() -> dict[str, tuple[Callable[[Any], object], Callable[[int], list[Any]]]]:
    engine = ours.make_engine(InMemoryIdempotencyStore())

    def act() -> dict[str, bool]:
        return {"ok": True}

    engine.run("replay", fingerprint="fp", action=act)
    keys = (f"k{i}" for i in itertools.count())
    call, config = _captured()
    plain = _noop_tool(ToolCounter())
    wrapped = idempotent(_noop_tool(ToolCounter()), InMemoryIdempotencyStore())
    threads = itertools.count()

    def fresh() -> dict[str, Any]:
        return {
            **config,
            "configurable": {**config["configurable"], "thread_id": f"t{next(threads)}"},
        }

    same = fresh()
    wrapped.invoke(call, same)

    def run(key: str) -> object:
        return engine.run(key, fingerprint="fp", action=act)

    return {
        "engine, first run": (run, lambda n: [next(keys) for _ in range(n)]),
        "engine, replay": (run, lambda n: ["replay"] * n),
        "tool unwrapped": (lambda c: plain.invoke(call, c), lambda n: [fresh() for _ in range(n)]),
        "tool wrapped, first run": (
            lambda c: wrapped.invoke(call, c),
            lambda n: [fresh() for _ in range(n)],
        ),
        "tool wrapped, replay": (lambda c: wrapped.invoke(call, c), lambda n: [same] * n),
    }


def timing(rounds: int, batch: int) -> dict[str, float]:
    """The median µs per case over ``rounds`` interleaved rounds of ``batch`` calls."""
    return interleaved(_cases(), rounds, batch)


def interleaved(
    cases: Mapping[_K, tuple[Callable[[Any], object], Callable[[int], list[Any]]]],
    rounds: int,
    batch: int,
) -> dict[_K, float]:
    """Each case's median µs: ``rounds`` rounds (after one warm-up round, not recorded) in
    which every case in turn makes ``batch`` arguments and times one call per argument."""
    samples: dict[_K, list[int]] = {name: [] for name in cases}
    clock = time.perf_counter_ns
    for r in range(rounds + 1):
        gc.collect()
        for name, (op, make) in cases.items():
            args = make(batch)
            out = []
            for a in args:
                t0 = clock()
                op(a)
                out.append(clock() - t0)
            if r:
                samples[name].extend(out)
    return {name: statistics.median(v) / 1000 for name, v in samples.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.adapter_timing", description=__doc__)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--batch", type=int, default=400)
    args = p.parse_args(argv)
    med = timing(args.rounds, args.batch)
    for name, value in med.items():
        print(f"{name:24s} {value:8.1f} µs")
    plain = med["tool unwrapped"]
    for name in ("tool wrapped, first run", "tool wrapped, replay"):
        print(f"{name} / unwrapped: {med[name] / plain:.3f} (+{med[name] - plain:.1f} µs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
