"""``python -m tests.torture --store {memory,sqlite,redis,postgres} --runs N --seed X``

Runs seeds X .. X+N-1 (each a simulated run whose every history is checked), prints the
table per fault kind, and LAST one line::

    runs=N claims=N effects=N violations=N first_failing_seed=S|-

Exit 0 when nothing was violated, 1 when something was, 2 on bad input (an unknown store,
an unreachable server, an impossible flag) — and then nothing is left behind.

More flags: ``--plant NAME`` (``--plant list``) plants a store bug; ``--faults a,b`` limits
the fault kinds; ``--durability SETTING --restarts N`` measures what store restarts lose
(see ``tests/torture/RESULTS.md``); ``--url`` runs against a server you started instead
of a throwaway one; ``--verbose`` prints the first failing run's violations.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from langchain_idempotent.core.store import BaseIdempotencyStore

from .campaign import Totals, run_seeds, table, to_json
from .plants import PLANTS
from .sim import FAULTS
from .stores import DURABILITY, STORES, UsageError, open_backend


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tests.torture", description=__doc__.split("\n")[0])
    p.add_argument("--store", required=True, help=f"one of {', '.join(STORES)}")
    p.add_argument("--runs", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plant", help="plant a store bug (`--plant list` names them)")
    p.add_argument("--faults", help=f"comma-separated subset of: {', '.join(FAULTS)}")
    p.add_argument("--durability", help="the store's durability setting for store restarts")
    p.add_argument("--url", help="a running Redis / PostgreSQL server to use instead")
    p.add_argument("--keep-going", action="store_true", help="do not stop at the first failure")
    p.add_argument("--json", help="also write the figures to this file (to merge shards)")
    p.add_argument("--verbose", action="store_true")
    return p


def _progress(totals: Totals, path: str | None) -> None:
    """Every thousand runs: a line on stderr, and the figures so far in ``--json``."""
    t = totals.total
    print(f"... {t.runs} runs, {t.violations} violations", file=sys.stderr, flush=True)
    if path:
        Path(path).write_text(json.dumps(to_json(totals)))


def main(argv: list[str]) -> int:
    parser = _parser()
    if "--plant" in argv and argv[argv.index("--plant") + 1 : argv.index("--plant") + 2] == [
        "list"
    ]:
        for name, cls in PLANTS.items():
            print(f"{name}: {(cls.__doc__ or '').strip()}")
        return 0
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return 2 if exc.code else 0
    try:
        if args.store not in STORES:
            raise UsageError(f"unknown store {args.store!r}; choose one of {', '.join(STORES)}")
        if args.runs < 1:
            raise UsageError(f"--runs must be at least 1, got {args.runs}")
        if args.seed < 0:
            raise UsageError(f"--seed must be >= 0, got {args.seed}")
        plant: Callable[[BaseIdempotencyStore], Any] | None = None
        if args.plant is not None:
            if args.plant not in PLANTS:
                raise UsageError(f"unknown plant {args.plant!r}; `--plant list` names them")
            plant = PLANTS[args.plant]
        allow: tuple[str, ...] = FAULTS
        if args.faults:
            allow = tuple(f.strip() for f in args.faults.split(","))
            unknown = [f for f in allow if f not in FAULTS]
            if unknown:
                raise UsageError(
                    f"unknown fault kind(s) {unknown}; choose from {', '.join(FAULTS)}"
                )
        if args.store in ("redis", "postgres") and args.durability is None:
            # A server restart takes a second or more: measured apart, with --durability.
            allow = tuple(f for f in allow if f != "store_restart")
        if args.durability is not None and "store_restart" not in allow:
            raise UsageError("--durability measures store restarts: do not leave out store_restart")
        if args.durability is not None and args.durability not in DURABILITY[args.store]:
            raise UsageError(
                f"--durability {args.durability!r} does not apply to {args.store}; choose one "
                f"of {', '.join(DURABILITY[args.store])}"
            )
        backend = open_backend(args.store, args.durability, args.url)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        totals = run_seeds(
            backend,
            range(args.seed, args.seed + args.runs),
            allow=allow,
            plant=plant,
            stop_on_failure=not args.keep_going,
            progress=lambda t: _progress(t, args.json),
            restart=args.durability is not None,
        )
    finally:
        backend.close()
    print(table(totals))
    if args.json:
        Path(args.json).write_text(json.dumps(to_json(totals)))
    if totals.first and (args.verbose or plant is not None):
        print("first failing run:")
        for line in totals.first:
            print(f"  {line}")
    t = totals.total
    first = str(t.seeds[0]) if t.seeds else "-"
    print(
        f"runs={t.runs} claims={t.claims} effects={t.effects} violations={t.violations} "
        f"first_failing_seed={first}"
    )
    return 1 if t.violations else 0


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # through the finally blocks: servers stopped, keys removed


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _terminate)
    try:
        code = main(sys.argv[1:])
    except SystemExit as exc:  # SIGTERM mid-run: the backend was closed on the way out
        code = exc.code if isinstance(exc.code, int) else 1
    sys.stdout.flush()
    sys.stderr.flush()
    # Not through interpreter shutdown: a run interrupted mid-way leaves suspended worker
    # greenlets, whose unwinding at shutdown would call back into a scheduler that is gone.
    os._exit(code)
