"""Every operation of the PostgreSQL store, described once (a :class:`._pools.Op`).

An operation is its statements (from :class:`._sql._Queries`, which holds their text), the
parameters it binds and how its answer is read from the rows, with no I/O of its own: the
store runs the same operation through its sync or its async runner (``_run`` / ``_arun``,
over :func:`._pools.run_sync` / ``run_async``, where errors are translated), so the two faces
cannot drift. :func:`setup_op` and :func:`drop_op` are atomic (one transaction under the
schema's advisory lock); every other operation is one statement, one round trip.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Sequence
from typing import Any

from ...core.record import Claim, Completion, Record, UncertainReason, abandoned_owner
from ...core.store import ClaimRequest, CompleteRequest, Held
from ...errors import CorruptRecordError, StoreUnavailableError
from ._pools import Op, Stmt, single
from ._sql import _claim_answer, _completion, _decode, _live, _meta, _Queries

__all__ = [
    "abandon_op",
    "claim_many_op",
    "claim_op",
    "complete_op",
    "delete_op",
    "drop_op",
    "list_op",
    "mark_effect_op",
    "now_op",
    "probe_op",
    "purge_op",
    "release_op",
    "renew_op",
    "setup_op",
]

_log = logging.getLogger("langchain_idempotent.stores.postgres")


# -- schema ------------------------------------------------------------------------------


def setup_op(q: _Queries) -> Op[None]:
    """Create the table, its indexes and functions, or check that an existing table is this
    layout, under the advisory lock; refuse anything else without changing it."""

    def steps() -> Generator[Any, Any, None]:
        reserved = yield Stmt(q.reserved, (q.table,))
        if reserved is not None:
            raise ValueError(
                f"table {q.table!r} is a word PostgreSQL reserves ({reserved[0]}), so "
                "it cannot name the store's table: pass another table= (the default is safe)"
            )
        yield Stmt(q.lock)
        yield Stmt(q.schema_table, fetch="none")
        row = yield Stmt(q.read_version, (q.table,))
        functions = list((yield Stmt(q.functions, fetch="all")))
        has_table, has_development = yield Stmt(q.found, (q.table,))
        if row is not None:
            refusal = q.refusal(int(row[0]), functions, has_table)
        elif not has_table and not functions:
            for query, params in q.creation():
                yield Stmt(query, params, fetch="none")
            return
        else:
            old = (yield Stmt(q.development_version, (q.table,))) if has_development else None
            refusal = q.refusal(None, functions, has_table, old[0] if old else None)
        if refusal is not None:
            raise StoreUnavailableError(refusal)

    return Op(steps, atomic=True)


def drop_op(q: _Queries) -> Op[None]:
    """Drop the functions, the table and its schema row, under the advisory lock."""

    def steps() -> Generator[Any, Any, None]:
        yield Stmt(q.lock)
        yield Stmt(q.schema_table, fetch="none")
        functions = yield Stmt(q.functions, fetch="all")
        for query, params in q.drops(list(functions)):
            yield Stmt(query, params, fetch="none")

    return Op(steps, atomic=True)


# -- record operations -------------------------------------------------------------------


def claim_op(q: _Queries, r: ClaimRequest, *, sweep: Callable[[], int]) -> Op[Claim]:
    """The claim statement: a replay read folded in front of the function call, except
    on the claims that also sweep: ``sweep()``, asked once the arguments are valid, says
    how many expired rows this claim purges at most (0: none; :mod:`._sql`)."""
    if r.on_expired not in ("takeover", "raise"):
        raise ValueError(f'on_expired must be "takeover" or "raise", got {r.on_expired!r}')
    sweeping = sweep()
    params = {
        "key": r.key,
        "owner": r.owner,
        "fingerprint": r.fingerprint,
        "lease_ms": int(r.lease_ms),
        "ttl_ms": int(r.ttl_ms),
        "takeover": r.on_expired == "takeover",
        "meta": _meta(r.meta),
        "sweep": sweeping,
        "boundary": bool(r.boundary),
    }
    query = q.claim if sweeping else q.replay_or_claim
    return single(Stmt(query, params), lambda row: _claim_answer(r.key, row, q.table))


def claim_many_op(q: _Queries, requests: Sequence[ClaimRequest]) -> Op[list[Claim]]:
    """Every claim in one statement (``unnest`` + ``LATERAL`` over the claim function)."""
    for r in requests:
        if r.on_expired not in ("takeover", "raise"):
            raise ValueError(
                f'on_expired must be "takeover" or "raise", got {r.on_expired!r} '
                f"(claim of {r.key!r})"
            )
    params = {
        "keys": [r.key for r in requests],
        "owners": [r.owner for r in requests],
        "fingerprints": [r.fingerprint for r in requests],
        "leases": [int(r.lease_ms) for r in requests],
        "ttls": [int(r.ttl_ms) for r in requests],
        "takeovers": [r.on_expired == "takeover" for r in requests],
        "metas": [_meta(r.meta) for r in requests],
        "boundaries": [bool(r.boundary) for r in requests],
    }

    def decode(rows: Any) -> list[Claim]:
        if len(rows) != len(requests):
            raise CorruptRecordError(
                f"claim_many on {q.table} answered {len(rows)} rows for {len(requests)} claims",
                key=requests[0].key,
            )
        return [_claim_answer(r.key, row, q.table) for r, row in zip(requests, rows, strict=True)]

    return single(Stmt(q.claim_many, params, fetch="all"), decode)


def renew_op(q: _Queries, held: Held, lease_ms: int) -> Op[bool]:
    params = (int(lease_ms), int(lease_ms), *_held(held))
    return single(Stmt(q.renew, params), lambda row: row is not None)


def complete_params(r: CompleteRequest, *, strict: bool) -> tuple[Any, ...]:
    """The parameters of ``<table>_complete`` (``strict``: only for the lease's holder, in
    its transaction; :mod:`._transaction`)."""
    return (*_held(r), r.fingerprint, r.payload, r.failed, int(r.ttl_ms), _meta(r.meta), strict)


def complete_op(q: _Queries, r: CompleteRequest) -> Op[Completion]:
    params = complete_params(r, strict=False)
    return single(Stmt(q.complete, params), lambda row: _completion(r.key, row, q.table))


def mark_effect_op(q: _Queries, held: Held) -> Op[bool]:
    return single(Stmt(q.mark_effect, _held(held)), lambda row: row is not None)


def release_op(q: _Queries, held: Held) -> Op[bool]:
    return single(Stmt(q.release, _held(held)), _counted)


def abandon_op(
    q: _Queries, held: Held, reason: UncertainReason, error_type: str | None = None
) -> Op[bool]:
    params = (abandoned_owner(reason, error_type), *_held(held))
    return single(Stmt(q.abandon, params), _counted)


def _held(held: Held | CompleteRequest) -> tuple[str, str, int]:
    return (held.key, held.owner, held.fence)


def probe_op(q: _Queries, key: str) -> Op[tuple[Record | None, int]]:
    """The live record under ``key`` and the server's clock, in one round trip."""
    return single(Stmt(q.get, (key,)), lambda row: _live(key, row, q.table))


def now_op(q: _Queries) -> Op[int]:
    return single(Stmt(q.now), _first_int)


# -- operator helpers --------------------------------------------------------------------


def delete_op(q: _Queries, key: str) -> Op[bool]:
    return single(Stmt(q.delete, (key,)), _counted)


def list_op(
    q: _Queries,
    namespace: str | None,
    thread_id: str | None,
    limit: int | None,
) -> Op[list[Record]]:
    """The matching records; an unreadable one is skipped with a warning."""
    query, params = q.listing(namespace, thread_id, limit)

    def decode(rows: Any) -> list[Record]:
        out = []
        for row in rows:
            try:
                out.append(_decode(row, q.table))
            except CorruptRecordError as exc:
                _log.warning("skipping an unreadable record: %s", exc)
        return out

    return single(Stmt(query, params, fetch="all"), decode)


def purge_op(q: _Queries, thread_id: str, namespace: str | None) -> Op[int]:
    return single(Stmt(*q.purging(thread_id, namespace)), _first_int)


def _counted(row: Any) -> bool:
    """A ``(count, ...)`` row: whether the statement changed a row."""
    return bool(row and row[0])


def _first_int(row: Any) -> int:
    return int(row[0])
