"""The docs/effects.md sequence, each worker a real process that really dies.

A enters its ``side_effect()`` block, refunds (a line in the ledger file) and dies
(``os._exit``) before its result is stored; B takes over after A's lease expired and dies
before its own block; C (:func:`run_sequence`, in the test's process) takes over with a
``reconcile=`` hook, which finds A's refund. On a correct store: 1 refund, the hook asked
once. A store whose claim forgot that B took over an attempt that had entered its block
answers C with a free retry: 2 refunds, the hook asked 0 times.

    python -m tests.support.effects_sequence A|B KIND TARGET TABLE LEDGER [--no-setup]

``setup=False`` (``--no-setup``) opens every PostgreSQL store with ``auto_setup=False``:
the table's functions are used as they are. For Redis, TARGET is the server's URL and TABLE
the key prefix; ``claim_lua=`` (``--claim-lua PATH``) makes every worker send that claim
script instead of today's (an earlier build's, from tests/fixtures/schema_history/redis/).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from langchain_idempotent import Policy, get_idempotency_context
from langchain_idempotent.core.engine import Engine
from langchain_idempotent.core.reconcile import ReconcileCall
from langchain_idempotent.core.store import BaseIdempotencyStore

__all__ = ["KEY", "LEASE_S", "SequenceResult", "claim_script", "open_store", "run_sequence"]

KEY = "effects-md-refund"
FINGERPRINT = "fp-refund"
LEASE_S = 0.5
ROOT = Path(__file__).resolve().parents[2]


def open_store(kind: str, target: str, table: str, *, setup: bool = True) -> BaseIdempotencyStore:
    if kind == "redis":
        from langchain_idempotent.stores.redis import RedisIdempotencyStore

        return RedisIdempotencyStore.from_url(target, prefix=table)
    if kind == "sqlite":
        from langchain_idempotent.stores.sqlite import SqliteIdempotencyStore

        return SqliteIdempotencyStore(target, table=table)
    from langchain_idempotent.stores.postgres import PostgresIdempotencyStore

    return PostgresIdempotencyStore.from_url(target, table=table, auto_setup=setup)


def _refunds(ledger: Path) -> list[str]:
    return ledger.read_text().split() if ledger.exists() else []


class SequenceResult:
    def __init__(self, refunds: list[str], asked: int, result: object) -> None:
        self.refunds, self.asked, self.result = refunds, asked, result


@contextlib.contextmanager
def claim_script(path: str | None) -> Iterator[None]:
    """Every Redis store in this process sends the claim script at ``path`` (as an earlier
    build sent it, prelude included) while inside; ``None``: today's."""
    if path is None:
        yield
        return
    from langchain_idempotent.stores.redis import _scripts, _store

    source = Path(path).read_text()
    old = _scripts._Script(source, hashlib.sha1(source.encode()).hexdigest())
    saved = _store._CLAIM_SCRIPT
    _store._CLAIM_SCRIPT = old  # type: ignore[misc]
    try:
        yield
    finally:
        _store._CLAIM_SCRIPT = saved  # type: ignore[misc]


def run_sequence(
    kind: str,
    target: str,
    table: str,
    ledger: Path,
    *,
    setup: bool = True,
    claim_lua: str | None = None,
) -> SequenceResult:
    """Run A and B as processes that die, then C here."""
    for worker in ("A", "B"):
        argv = [worker, kind, target, table, str(ledger), *([] if setup else ["--no-setup"])]
        argv += ["--claim-lua", claim_lua] if claim_lua else []
        done = subprocess.run(
            [sys.executable, "-m", "tests.support.effects_sequence", *argv],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 3, (worker, done.returncode, done.stderr[-2000:])
        time.sleep(LEASE_S * 1.5)  # its lease expires: the next claim takes over
    asked: list[ReconcileCall] = []

    def reconcile(call: ReconcileCall) -> str | None:
        asked.append(call)
        return "refunded 140" if "A" in _refunds(ledger) else None

    def refund() -> str:
        with _ctx().side_effect(), ledger.open("a") as f:
            f.write("C\n")
        return "refunded 140"

    store = open_store(kind, target, table, setup=setup)
    try:
        engine = Engine(store, Policy(lease=LEASE_S, boundary=True, reconcile=reconcile))
        with claim_script(claim_lua):
            result = engine.run(KEY, fingerprint=FINGERPRINT, action=refund)
    finally:
        store.close()
    return SequenceResult(_refunds(ledger), len(asked), result)


def _ctx() -> Any:
    ctx = get_idempotency_context()
    assert ctx is not None
    return ctx


def main() -> None:
    worker, kind, target, table, ledger = sys.argv[1:6]
    store = open_store(kind, target, table, setup="--no-setup" not in sys.argv[6:])
    engine = Engine(store, Policy(lease=LEASE_S, boundary=True))

    def refund() -> str:
        ctx = _ctx()
        if worker == "B":
            os._exit(3)  # B dies before its block
        with ctx.side_effect():
            with open(ledger, "a") as f:
                f.write(f"{worker}\n")
                f.flush()
                os.fsync(f.fileno())
            os._exit(3)  # A dies inside its block, its refund sent, its result not stored
        return "unreachable"

    flags = sys.argv[6:]
    lua = flags[flags.index("--claim-lua") + 1] if "--claim-lua" in flags else None
    with claim_script(lua):
        engine.run(KEY, fingerprint=FINGERPRINT, action=refund)
    sys.exit(1)  # the action never returns


if __name__ == "__main__":
    main()
