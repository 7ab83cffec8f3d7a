"""``list``: every record under the store's key prefix, by ``SCAN``, read in pipelined batches.

:func:`scan` / :func:`ascan` walk the keys matching ``{prefix}{*}`` (hashes only; every
primary on a Cluster, as redis-py's ``scan_iter`` does), read each batch of 256 with one
pipeline of ``HGETALL`` and keep the records whose meta match the filters; an unreadable
record is skipped with a warning (:func:`._scripts._to_records`). The store runs them
inside its retries and its one error translation.
"""

from __future__ import annotations

from typing import Any

from ...core.record import Record
from ._scripts import _RAW, _to_records

__all__ = ["ascan", "oldest_first", "scan"]

_BATCH = 256


def scan(client: Any, head: str, namespace: str | None, thread_id: str | None) -> list[Record]:
    out: list[Record] = []
    batch: list[Any] = []
    for rkey in client.scan_iter(match=_pattern(head), count=500, _type="hash"):
        batch.append(rkey)
        if len(batch) >= _BATCH:
            replies = _fetch(client, batch).execute(raise_on_error=False)
            out += _to_records(head, batch, replies, namespace, thread_id)
            batch = []
    if batch:
        replies = _fetch(client, batch).execute(raise_on_error=False)
        out += _to_records(head, batch, replies, namespace, thread_id)
    return out


async def ascan(
    client: Any, head: str, namespace: str | None, thread_id: str | None
) -> list[Record]:
    """The async twin of :func:`scan`."""
    out: list[Record] = []
    batch: list[Any] = []
    async for rkey in client.scan_iter(match=_pattern(head), count=500, _type="hash"):
        batch.append(rkey)
        if len(batch) >= _BATCH:
            replies = await _fetch(client, batch).execute(raise_on_error=False)
            out += _to_records(head, batch, replies, namespace, thread_id)
            batch = []
    if batch:
        replies = await _fetch(client, batch).execute(raise_on_error=False)
        out += _to_records(head, batch, replies, namespace, thread_id)
    return out


def oldest_first(records: list[Record], limit: int | None) -> list[Record]:
    records.sort(key=lambda r: r.created_at)
    return records[:limit] if limit is not None else records


def _fetch(client: Any, rkeys: list[Any]) -> Any:
    """A pipeline of one ``HGETALL`` per key, not yet executed."""
    pipe = client.pipeline(transaction=False)
    for rkey in rkeys:
        pipe.execute_command("HGETALL", rkey, **_RAW)
    return pipe


def _pattern(head: str) -> str:
    """The ``SCAN`` pattern of every record key after ``head`` (``{prefix}{``), escaped."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in head) + "*}"
