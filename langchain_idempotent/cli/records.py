"""The record commands: ``ls``, ``show``, ``purge``, ``delete``, ``resolve``, ``rotate``.

Each reads records through the store's own API, times them on the store's clock
(``store.now_ms()``), and writes only through compare-and-set operations (``resolve``:
the store's own; ``rotate``: :func:`~langchain_idempotent.stores._reseal.replace_payload`)
or after confirmation (``purge``, ``delete``, ``resolve``, ``rotate``). An encrypted
payload is decrypted only by ``show --decrypt``, with ``IDEMPOTENCY_ENCRYPTION_KEYS``.
"""

from __future__ import annotations

import argparse
import json
import os
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TextIO

from pydantic_core import to_jsonable_python

from ..core.encryption import ENV_VARIABLE, ResultEncryption, sealed_key_id
from ..core.encryption import TAG as _SEALED
from ..core.record import Record, State
from ..core.serde import ResultSerializer
from ..core.store import CompleteRequest, Held
from ..errors import CorruptRecordError, IdempotencyError
from ..stores._reseal import replace_payload
from ._common import Refused, again, confirm, nothing_there, redact

if TYPE_CHECKING:
    from ..core.store import BaseIdempotencyStore
    from ..settings import IdempotencySettings

__all__ = ["delete", "existing", "ls", "purge", "resolve", "rotate", "show"]

_MAX_SHOWN = 4000


# -- ls ---------------------------------------------------------------------------------


def ls(args: argparse.Namespace, *, store: BaseIdempotencyStore, out: TextIO, **_: Any) -> int:
    uncertain = getattr(args, "uncertain", False)
    limit = None if uncertain else args.limit
    records = store.list(namespace=args.namespace, thread_id=args.thread, limit=limit)
    now = store.now_ms()
    if uncertain:  # the last attempt started and did not finish (lease over or abandoned)
        records = [rec for rec in records if rec.uncertain(now)][: args.limit]
    if not records and (missing := nothing_there(store)) is not None:
        raise Refused(missing)
    if args.json:
        docs = [_summary(rec, now) for rec in records]
        print(json.dumps({"records": docs, "count": len(docs)}, indent=2), file=out)
        return 0
    if not records:
        print("no records", file=out)
        return 0
    header = ("KEY", "STATE", "AGE", "ATTEMPT", "FENCE", "TOOL", "THREAD")
    rows = [
        (
            rec.key,
            _state_label(rec, now),
            _duration(now - rec.created_at),
            str(rec.attempt),
            str(rec.fence),
            rec.meta.get("tool", ""),
            rec.meta.get("thread_id", ""),
        )
        for rec in records
    ]
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    for row in (header, *rows):
        print(
            "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip(), file=out
        )
    print(f"{len(rows)} record(s)", file=out)
    return 0


def _status(rec: Record, now: int) -> str:
    """``running``, ``outcome_unknown`` (a passed lease, no result), ``completed``, …"""
    if rec.state is State.RUNNING and rec.lease_until <= now:
        return "outcome_unknown"
    return rec.state.value


def _state_label(rec: Record, now: int) -> str:
    return "running (expired)" if _status(rec, now) == "outcome_unknown" else rec.state.value


def _summary(rec: Record, now: int) -> dict[str, Any]:
    return {
        "key": rec.key,
        "state": rec.state.value,
        "status": _status(rec, now),
        "namespace": rec.meta.get("namespace"),
        "thread_id": rec.meta.get("thread_id"),
        "tool": rec.meta.get("tool"),
        "node": rec.meta.get("node"),
        "graph_path": rec.meta.get("graph_path"),
        "attempt": rec.attempt,
        "fence": rec.fence,
        "owner": rec.owner,
        "lease_left_ms": max(0, rec.lease_until - now) if rec.state is State.RUNNING else None,
        "age_s": round((now - rec.created_at) / 1000, 3),
        "created_at": _iso(rec.created_at),
        "updated_at": _iso(rec.updated_at),
        "fingerprint": rec.fingerprint,
        "version": rec.version,
        "payload_bytes": None if rec.payload is None else len(rec.payload),
        "meta": dict(rec.meta),
    }


def _approval_text(meta: Any) -> str:
    """``approve by alice``, ``edit of <key> by bob``: the human decision behind a record."""
    text = str(meta["approval"])
    if meta.get("approval_of"):
        text += f" of {meta['approval_of']}"
    if meta.get("reviewer"):
        text += f" by {meta['reviewer']}"
    return text


def _duration(ms: int) -> str:
    s = max(0, ms) // 1000
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")


# -- show -------------------------------------------------------------------------------


def show(args: argparse.Namespace, *, store: BaseIdempotencyStore, out: TextIO, **_: Any) -> int:
    rec = existing(store, args.key, args)
    now = store.now_ms()
    doc = _summary(rec, now)
    sealed = _sealed(rec)
    if sealed is not None:
        doc["encrypted"] = {"key_id": sealed[0], "namespace": sealed[1]}
    hidden = sealed is not None and not args.decrypt
    decoded: Any = None
    problem: str | None = None
    if not hidden:
        decoded, problem = _decode(rec, decrypt=args.decrypt)
    if args.json:
        if problem is not None:
            doc["payload_error"] = problem
        elif hidden:
            pass
        elif rec.state is State.FAILED:
            doc["error"] = decoded
        elif rec.state is State.COMPLETED:
            doc["result"] = to_jsonable_python(decoded, fallback=repr, bytes_mode="base64")
        print(json.dumps(doc, indent=2, ensure_ascii=False), file=out)
        return 1 if problem else 0

    status = doc["status"]
    lines = [
        ("key", rec.key),
        ("state", _state_label(rec, now)),
        ("namespace", doc["namespace"]),
        ("thread", doc["thread_id"]),
        ("tool", doc["tool"]),
        ("node", doc["node"]),
        ("graph path", doc["graph_path"]),
        ("attempt", rec.attempt),
        ("fence", rec.fence),
        ("owner", rec.owner or "-"),
        ("lease", _lease_text(rec, now)),
        ("created", f"{doc['created_at']} ({_duration(now - rec.created_at)} ago)"),
        ("updated", f"{doc['updated_at']} ({_duration(now - rec.updated_at)} ago)"),
        ("fingerprint", rec.fingerprint),
        ("format", f"version {rec.version}"),
        ("payload", _payload_text(rec, sealed)),
    ]
    if "approval" in rec.meta:
        lines.append(("approval", _approval_text(rec.meta)))
    for name, value in lines:
        print(f"{name + ':':<13}{'' if value is None else value}", file=out)
    if status == "outcome_unknown":
        print(
            "\nThe lease passed without a result: the tool may or may not have done its "
            "effect. Check downstream (the key was passed as the idempotency key), then "
            f"run `{again(args, 'resolve', rec.key, '--result', 'JSON')}` (or --free to "
            "run it again).",
            file=out,
        )
    if problem is not None:
        print(f"\npayload cannot be decoded (it was not executed): {problem}", file=out)
        return 1
    if sealed is not None and hidden:
        print(
            f"\n{'error' if rec.state is State.FAILED else 'result'}: encrypted (key id "
            f"{sealed[0]!r}); `{again(args, 'show', rec.key, '--decrypt')}` with "
            "IDEMPOTENCY_ENCRYPTION_KEYS set shows it",
            file=out,
        )
        return 0
    if rec.state is State.FAILED:
        print(f"\nerror (re-raised on replay): {decoded['type']}: {decoded['message']}", file=out)
    elif rec.state is State.COMPLETED:
        print(f"\nresult ({type(decoded).__name__}):", file=out)
        print(_clip(_render(decoded)), file=out)
    return 0


def existing(store: BaseIdempotencyStore, key: str, args: argparse.Namespace) -> Record:
    """The record under ``key``, or the one record whose key starts with ``key`` (as ``git``
    takes a unique commit prefix): what ``show``, ``delete``, ``resolve`` and ``explain
    --key`` act on. Refused, saying what was looked for and where: none, or several."""
    rec = store.get(key)
    if rec is not None:
        return rec
    if key:
        found = [r for r in store.list() if r.key.startswith(key)]
        if len(found) == 1:
            return found[0]
        if found:
            shown = ", ".join(r.key for r in found[:5]) + (", …" if len(found) > 5 else "")
            raise Refused(
                f"{len(found)} records have keys starting {key!r}: {shown}; give more of the key"
            )
    missing = nothing_there(store)
    if missing is not None:
        raise Refused(missing)
    raise Refused(
        f"no record under key {key!r}, nor one whose key starts with it (expired, purged, or "
        f"never written); `{again(args, 'ls')}` lists the records there"
    )


def _sealed(rec: Record) -> tuple[str, str] | None:
    """``(key id, namespace)`` of an encrypted payload (its clear header), else ``None``."""
    if rec.payload is None:
        return None
    tag, _, data = bytes(rec.payload).partition(b"\n")
    return sealed_key_id(data) if tag == _SEALED.encode() else None


def _payload_text(rec: Record, sealed: tuple[str, str] | None) -> str:
    if rec.payload is None:
        return "-"
    if sealed is None:
        return f"{len(rec.payload)} bytes"
    return f"{len(rec.payload)} bytes, encrypted (key id {sealed[0]!r})"


def _encryption(*, accept_plaintext: bool | None = None) -> ResultEncryption:
    """The keys of ``IDEMPOTENCY_ENCRYPTION_KEYS``; a missing or bad value is refused."""
    try:
        return ResultEncryption.from_env(accept_plaintext=accept_plaintext)
    except (ValueError, ImportError) as exc:
        raise Refused(str(exc), code=2) from None


def _serializer(rec: Record, encryption: ResultEncryption | None) -> ResultSerializer:
    """A serializer for ``rec``: bound to the namespace its header (or meta) names."""
    sealed = _sealed(rec)
    namespace = sealed[1] if sealed else str(rec.meta.get("namespace") or "default")
    return ResultSerializer(encryption=encryption, namespace=namespace)


def _decode(rec: Record, *, decrypt: bool = False) -> tuple[Any, str | None]:
    """The stored result (or failure) decoded strictly, or ``(None, why it failed)``;
    ``decrypt``: with the keys of ``IDEMPOTENCY_ENCRYPTION_KEYS`` (plaintext accepted)."""
    if rec.state not in (State.COMPLETED, State.FAILED):
        return None, None
    keys = _encryption(accept_plaintext=True) if decrypt else None
    serializer = _serializer(rec, keys)
    try:
        if rec.state is State.FAILED:
            failure = serializer.loads_failure(rec.payload, key=rec.key)
            return {"type": failure.type, "message": failure.message}, None
        return serializer.loads(rec.payload, key=rec.key), None
    except CorruptRecordError as exc:
        return None, str(exc)


def _render(value: Any) -> str:
    if isinstance(value, str):
        return value
    doc = to_jsonable_python(value, fallback=repr, bytes_mode="base64")
    return json.dumps(doc, indent=2, ensure_ascii=False)


def _clip(text: str) -> str:
    if len(text) <= _MAX_SHOWN:
        return text
    return f"{text[:_MAX_SHOWN]}\n… ({len(text) - _MAX_SHOWN} more characters; use --json)"


def _lease_text(rec: Record, now: int) -> str:
    if rec.state is not State.RUNNING:
        return "-"
    left = rec.lease_until - now
    if left > 0:
        return f"live, {left / 1000:.1f}s left"
    return f"expired {_duration(-left)} ago"


# -- purge ------------------------------------------------------------------------------


def purge(
    args: argparse.Namespace, *, store: BaseIdempotencyStore, url: str, out: TextIO, **_: Any
) -> int:
    records = store.list(namespace=args.namespace, thread_id=args.thread)
    where = f"thread {args.thread!r}" + (
        f" in namespace {args.namespace!r}" if args.namespace else " (every namespace)"
    )
    if not records:
        if (missing := nothing_there(store)) is not None:
            raise Refused(missing)
        print(f"no records for {where}", file=out)
        return 0
    now = store.now_ms()
    live = sum(1 for rec in records if rec.lease_live(now))
    warning = (
        f" {live} of them hold a live lease: their tools may be running, and deleting the "
        "record lets a duplicate call run too."
        if live
        else ""
    )
    confirm(
        f"Delete {len(records)} record(s) of {where} from {redact(url)}?{warning} "
        "Their calls will run again if retried.",
        yes=args.yes,
    )
    deleted = store.purge(thread_id=args.thread, namespace=args.namespace)
    print(f"deleted {deleted} record(s) of {where}", file=out)
    return 0


# -- delete -----------------------------------------------------------------------------


def delete(
    args: argparse.Namespace, *, store: BaseIdempotencyStore, url: str, out: TextIO, **_: Any
) -> int:
    key = args.key  # or the full key of the one record it is a prefix of, as `show` takes
    try:
        rec = existing(store, args.key, args)
    except CorruptRecordError as exc:  # the one record `show` and `resolve` cannot act on
        what, warning = f"unreadable: {exc}", ""
    else:
        key = rec.key
        now = store.now_ms()
        what = f"{_state_label(rec, now)}, tool {rec.meta.get('tool', '?')!r}"
        warning = (
            " It holds a live lease: its tool may be running, and deleting the record lets "
            "a duplicate call run too."
            if rec.lease_live(now)
            else ""
        )
    confirm(
        f"Delete record {key} ({what}) from {redact(url)}?{warning} Its call will run "
        "again if retried.",
        yes=args.yes,
    )
    if not store.delete(key):
        raise Refused(f"no record under key {key!r}: it expired or was deleted meanwhile")
    print(f"deleted record {key}", file=out)
    return 0


# -- resolve ----------------------------------------------------------------------------


def resolve(
    args: argparse.Namespace,
    *,
    store: BaseIdempotencyStore,
    url: str,
    out: TextIO,
    settings: IdempotencySettings,
    **_: Any,
) -> int:
    rec = existing(store, args.key, args)
    payload = None if args.free else _payload(args, rec)
    if rec.done:
        raise Refused(
            f"record {rec.key} is already {rec.state.value}: nothing to resolve (its result "
            f"replays to every call; `{again(args, 'show', rec.key)}` shows it)"
        )
    now = store.now_ms()
    if rec.lease_live(now) and not args.force:
        raise Refused(
            f"record {rec.key} holds a live lease ({(rec.lease_until - now) / 1000:.1f}s left, "
            f"attempt {rec.attempt}): its tool may still be running. Wait for the lease to "
            "pass, or add --force if you know that owner is hung"
        )
    if payload is None and rec.state is State.FREE:
        print(f"record {rec.key} is already free: the next call runs the tool", file=out)
        return 0
    who = (
        f"tool {rec.meta.get('tool', '?')!r}, thread {rec.meta.get('thread_id', '?')!r}, "
        f"attempt {rec.attempt}, fence {rec.fence}"
    )
    if payload is None:
        confirm(f"Free {rec.key} ({who})? The next call runs the tool again.", yes=args.yes)
        if not store.release(Held(rec.key, rec.owner, rec.fence)):
            raise Refused(
                f"record {rec.key} changed since it was read (another caller claimed or "
                f"completed it); nothing was done. `{again(args, 'show', rec.key)}` shows it now"
            )
        print(f"freed {rec.key}: the next call runs the tool (fence {rec.fence + 1})", file=out)
        return 0

    confirm(f"Store this result for {rec.key} ({who})? Every later call replays it.", yes=args.yes)
    ttl = args.ttl if args.ttl is not None else settings.policy().ttl_s
    completion = store.complete(
        CompleteRequest(
            rec.key,
            rec.owner,
            rec.fence,
            rec.fingerprint,
            payload,
            failed=False,
            ttl_ms=max(1, int(ttl * 1000)),
            meta=rec.meta,
        )
    )
    if not completion.stored:
        raise Refused(
            f"another result was stored for {rec.key} meanwhile; it stands "
            f"(`{again(args, 'show', rec.key)}`)"
        )
    print(f"stored the result for {rec.key}: later calls replay it", file=out)
    return 0


def _payload(args: argparse.Namespace, rec: Record) -> bytes:
    """The result to store for ``rec``, sealed when ``IDEMPOTENCY_ENCRYPTION_KEYS`` is set
    (the application then refuses a plaintext record)."""
    if args.text is not None:
        value: Any = args.text
    else:
        try:
            value = json.loads(args.result)
        except json.JSONDecodeError as exc:
            raise Refused(
                f"--result must be JSON ({exc}); quote a string as '\"text\"' or use --text",
                code=2,
            ) from None
    keys = _encryption() if os.environ.get(ENV_VARIABLE) is not None else None
    try:
        return _serializer(rec, keys).dumps(value, key=rec.key)
    except (IdempotencyError, ValueError) as exc:
        raise Refused(f"cannot store that result: {exc}", code=2) from None


# -- rotate -----------------------------------------------------------------------------


def rotate(
    args: argparse.Namespace, *, store: BaseIdempotencyStore, url: str, out: TextIO, **_: Any
) -> int:
    """Re-seal every completed and failed record under the primary key (plaintext ones too
    with ``--seal-plaintext``), each by compare-and-set: a record changed meanwhile is left
    alone and counted. A record that does not open is reported and left as it is."""
    keys = _encryption(accept_plaintext=args.seal_plaintext)
    records = [
        rec
        for rec in store.list(namespace=args.namespace, thread_id=args.thread)
        if rec.done and rec.payload is not None
    ]
    todo: list[tuple[Record, bytes]] = []
    current = plaintext = 0
    refused: list[str] = []
    for rec in records:
        sealed = _sealed(rec)
        if sealed is None and not args.seal_plaintext:
            plaintext += 1
            continue
        kind: Any = "failure" if rec.state is State.FAILED else "result"
        try:
            new = _serializer(rec, keys).reseal(bytes(rec.payload or b""), kind=kind, key=rec.key)
        except CorruptRecordError as exc:
            refused.append(f"{rec.key}: {exc}")
            continue
        if new is None:
            current += 1
        else:
            todo.append((rec, new))
    if todo:
        confirm(
            f"Re-encrypt {len(todo)} record(s) in {redact(url)} under key id "
            f"{keys.primary!r}? Workers must already have that key in their set.",
            yes=args.yes,
        )
    done = changed = 0
    for rec, new in todo:
        if replace_payload(store, rec.key, expected=bytes(rec.payload or b""), payload=new):
            done += 1
        else:
            changed += 1
    print(
        f"re-encrypted {done} record(s) under key id {keys.primary!r}; {current} already "
        f"under it; {changed} changed meanwhile (left as they are; run rotate again)",
        file=out,
    )
    if plaintext:
        print(
            f"{plaintext} record(s) are not encrypted (written before encryption was turned "
            "on): add --seal-plaintext to encrypt them",
            file=out,
        )
    for line in refused:
        print(f"not rotated: {line}", file=out)
    return 1 if refused else 0
