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
from typing import Any, Protocol, runtime_checkable

from ..errors import LeaseLostError
from .context import IdempotencyContext
from .record import Completion
from .store import BaseIdempotencyStore, CompleteRequest

__all__ = [
    "AsyncTransaction",
    "Transaction",
    "TransactionalStore",
    "abegin",
    "acomplete",
    "begin",
    "check_store",
    "complete",
]


class Transaction(Protocol):
    """A transaction the tool writes in (``PostgresTransaction``): ``connection`` for the
    tool, ``complete`` writes the completion in it and commits (or rolls back)."""

    connection: Any

    def complete(self, request: CompleteRequest) -> Completion: ...

    def rollback(self) -> None: ...


class AsyncTransaction(Protocol):
    """The async twin of :class:`Transaction` (``AsyncPostgresTransaction``)."""

    connection: Any

    async def complete(self, request: CompleteRequest) -> Completion: ...

    async def rollback(self) -> None: ...


@runtime_checkable
class TransactionalStore(Protocol):
    """A store that can write a completion inside the tool's own database transaction."""

    def transaction(self) -> Transaction: ...

    async def atransaction(self) -> AsyncTransaction: ...


def check_store(store: BaseIdempotencyStore) -> TransactionalStore:
    """``store``, refused unless it can write a completion inside the tool's transaction."""
    if not isinstance(store, TransactionalStore):
        raise ValueError(
            f"transactional=True needs a store that can write the completion inside the "
            f"tool's own database transaction (PostgresIdempotencyStore); "
            f"{type(store).__name__} cannot. Drop transactional=True, or use a "
            "PostgresIdempotencyStore on the database the tool writes to"
        )
    return store


def begin(
    store: BaseIdempotencyStore, ctx: IdempotencyContext
) -> tuple[Transaction, IdempotencyContext]:
    """Open the run's transaction; the context the tool runs with carries its connection."""
    txn = check_store(store).transaction()
    return txn, dataclasses.replace(ctx, connection=txn.connection)


async def abegin(
    store: BaseIdempotencyStore, ctx: IdempotencyContext
) -> tuple[AsyncTransaction, IdempotencyContext]:
    txn = await check_store(store).atransaction()
    return txn, dataclasses.replace(ctx, connection=txn.connection)


def complete(
    store: BaseIdempotencyStore, txn: Transaction | None, request: CompleteRequest
) -> Completion:
    """Write the completion in the run's transaction (``None``: a failure to record, in an
    empty one of its own) and commit."""
    if txn is None:
        txn = check_store(store).transaction()
    return _refused(txn.complete(request), request)


async def acomplete(
    store: BaseIdempotencyStore, txn: AsyncTransaction | None, request: CompleteRequest
) -> Completion:
    if txn is None:
        txn = await check_store(store).atransaction()
    return _refused(await txn.complete(request), request)


def _refused(completion: Completion, request: CompleteRequest) -> Completion:
    """A completion refused with nothing stored: the run lost its lease.

    Its transaction was rolled back, so the tool's writes are gone; the caller learns it
    from :class:`LeaseLostError` (a retry replays the new owner's result or runs again).
    """
    if completion.stored or completion.payload is not None:
        return completion
    raise LeaseLostError(
        f"this run (fence {request.fence}) lost its lease before its transaction could "
        "commit: another worker took the call over, so its writes were rolled back and "
        "nothing was recorded; retry to get the other worker's result",
        key=request.key,
    )
