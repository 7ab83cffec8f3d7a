"""Transactional mode (``Policy(transactional=True)``): the tool's writes and its result
commit in one database transaction.

The engine's drivers call these only when the policy says so. A protected run opens a
transaction on the store (``PostgresIdempotencyStore.transaction()``) and hands its
connection to the tool through the context (``ctx.connection``). The complete step
writes the result inside that transaction and commits both; a run that raised has had
its transaction rolled back, so its failure is recorded in a transaction of its own. A
completion refused with nothing stored means the run lost its lease: both were rolled
back, and the caller gets :class:`LeaseLostError`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from .context import IdempotencyContext
from .errors import LeaseLostError
from .record import Completion
from .stores.base import BaseIdempotencyStore

__all__ = ["abegin", "acomplete", "begin", "check_store", "complete"]


def check_store(store: BaseIdempotencyStore) -> None:
    """Refuse a store that cannot write a completion inside the tool's transaction."""
    if not callable(getattr(store, "transaction", None)):
        raise ValueError(
            f"transactional=True needs a store that can write the completion inside the "
            f"tool's own database transaction (PostgresIdempotencyStore); "
            f"{type(store).__name__} cannot. Drop transactional=True, or use a "
            "PostgresIdempotencyStore on the database the tool writes to"
        )


def begin(store: BaseIdempotencyStore, ctx: IdempotencyContext) -> tuple[Any, IdempotencyContext]:
    """Open the run's transaction; the context the tool runs with carries its connection."""
    txn = store.transaction()  # type: ignore[attr-defined]
    return txn, dataclasses.replace(ctx, connection=txn.connection)


async def abegin(
    store: BaseIdempotencyStore, ctx: IdempotencyContext
) -> tuple[Any, IdempotencyContext]:
    txn = await store.atransaction()  # type: ignore[attr-defined]
    return txn, dataclasses.replace(ctx, connection=txn.connection)


def complete(store: BaseIdempotencyStore, txn: Any, args: Mapping[str, Any]) -> Completion:
    """Write the completion in the run's transaction (``None``: a failure to record, in an
    empty one of its own) and commit."""
    if txn is None:
        txn = store.transaction()  # type: ignore[attr-defined]
    return _refused(txn.complete(**args), args)


async def acomplete(store: BaseIdempotencyStore, txn: Any, args: Mapping[str, Any]) -> Completion:
    if txn is None:
        txn = await store.atransaction()  # type: ignore[attr-defined]
    return _refused(await txn.complete(**args), args)


def _refused(completion: Completion, args: Mapping[str, Any]) -> Completion:
    """A completion refused with nothing stored: the run lost its lease.

    Its transaction was rolled back, so the tool's writes are gone; the caller learns it
    from :class:`LeaseLostError` (a retry replays the new owner's result or runs again).
    """
    if completion.stored or completion.payload is not None:
        return completion
    raise LeaseLostError(
        f"this run (fence {args['fence']}) lost its lease before its transaction could "
        "commit: another worker took the call over, so its writes were rolled back and "
        "nothing was recorded; retry to get the other worker's result",
        key=args["key"],
    )
