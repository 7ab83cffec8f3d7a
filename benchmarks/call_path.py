"""The path a reader follows: from ``ToolNode`` to the store's Lua script and back.

``python -m benchmarks.call_path [--store redis|memory]``

Runs the step of :mod:`benchmarks.graph_step` once unmeasured and then once traced (a sync
first run, on a throwaway ``redis-server`` by default), with a profile hook on every thread
(ToolNode runs its tools on an executor thread). It prints the package's modules in the
order the call first enters them, how many there are, and the *moves*: calls from one of
the package's modules into another, or between the package and LangChain / LangGraph (a
call inside one module, or inside the libraries, is not a move). The same count, at two
commits, says whether a reader's path got shorter; it counts what runs, so a module that
is only imported is not on the path.
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from .graph_step import build_step, step_input

__all__ = ["main", "trace_first_run"]

_PACKAGE = "/langchain_idempotent/"
_LIBRARIES = ("/langchain_core/", "/langgraph/")


def _room(filename: str) -> str | None:
    """The module a frame runs in, as a reader names it (``core/engine.py``), or
    ``"LangChain"`` for LangChain / LangGraph; ``None`` for anything else."""
    if _PACKAGE in filename:
        return filename.rsplit(_PACKAGE, 1)[1]
    if any(lib in filename for lib in _LIBRARIES):
        return "LangChain"
    return None


@contextmanager
def _traced(rooms: list[str], moves: list[tuple[str, str]]) -> Iterator[None]:
    def hook(frame: Any, event: str, _: Any) -> None:
        if event != "call":
            return
        here = _room(frame.f_code.co_filename)
        if here is None:
            return
        caller = frame.f_back
        while caller is not None and _room(caller.f_code.co_filename) is None:
            caller = caller.f_back  # through the standard library (contextlib, threading)
        there = None if caller is None else _room(caller.f_code.co_filename)
        if here != "LangChain" and here not in rooms:
            rooms.append(here)
        if there is not None and there != here:
            moves.append((there, here))

    threading.setprofile(hook)
    sys.setprofile(hook)
    try:
        yield
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]


def trace_first_run(store: Any) -> tuple[list[str], list[tuple[str, str]]]:
    """The modules (in order of first entry) and the moves of one first run of the step."""
    graph, _ = build_step(store)
    graph.invoke(step_input(), {"configurable": {"thread_id": "call-path-warm-up"}})
    rooms: list[str] = []
    moves: list[tuple[str, str]] = []
    with _traced(rooms, moves):
        graph.invoke(step_input(), {"configurable": {"thread_id": "call-path-traced"}})
    return rooms, moves


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.call_path", description=__doc__)
    p.add_argument("--store", choices=("redis", "memory"), default="redis")
    args = p.parse_args(argv)
    with ExitStack() as stack:
        if args.store == "redis":
            from langchain_idempotent import RedisIdempotencyStore

            from .server import RedisServer

            server = stack.enter_context(RedisServer())
            store: Any = RedisIdempotencyStore.from_url(server.url)
        else:
            from langchain_idempotent import InMemoryIdempotencyStore

            store = InMemoryIdempotencyStore()
        stack.callback(store.close)
        rooms, moves = trace_first_run(store)
    crossings = sum(1 for a, b in moves if "LangChain" in (a, b))
    print(f"A first run on the {args.store} store, from ToolNode to the store and back:")
    for i, room in enumerate(rooms, 1):
        print(f"{i:3} {room}")
    print(
        f"{len(rooms)} modules of the package; {len(moves)} moves between modules "
        f"({crossings} of them into or out of LangChain / LangGraph)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
