"""``langchain-idempotent``: look at, clean up and repair idempotency records.

::

    langchain-idempotent ls      [--namespace N] [--thread T] [--limit K] [--json]
    langchain-idempotent show    KEY [--json]
    langchain-idempotent purge   --thread T [--namespace N] [--yes]
    langchain-idempotent delete  KEY [--yes]
    langchain-idempotent resolve KEY (--result JSON | --text TEXT | --free) [--force] [--yes]
    langchain-idempotent doctor  [--pings N] [--strict] [--json]

Every command takes ``--url`` (``redis://…``, ``rediss://…``, ``unix://…``,
``sqlite:///relative.db``, ``sqlite:////absolute.db``, ``memory://``); without it the URL
comes from ``IDEMPOTENCY_STORE_URL``, ``IDEMPOTENCY_REDIS_URL``, ``REDIS_URL`` or
``IDEMPOTENCY_SQLITE_PATH``, in that order (``IDEMPOTENCY_REDIS_PREFIX`` sets the key
prefix, as for the library).

- Times are read on the store's clock (Redis ``TIME``), like leases. A running record
  whose lease has passed without a result is shown as ``running (expired)``: its outcome
  is unknown (the tool may or may not have done its effect).
- Payloads are decoded with the library's strict serializer (no pickle, an allow-list of
  types); one that cannot be decoded is reported, never executed.
- Nothing is deleted or written without confirmation: on a terminal the command asks,
  elsewhere it needs ``--yes``.
- ``resolve`` acts only on a record whose lease has passed without a result (or a live
  one with ``--force``), with the record's own owner and fence, so it cannot overwrite a
  result that another caller stored meanwhile.

Exit status: 0 done; 1 the store could not be reached, the record is missing or in a
state the command does not apply to, or the operator declined; 2 bad arguments;
3 ``doctor --strict`` found a risk.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, TextIO
from urllib.parse import urlsplit, urlunsplit

import redis
from pydantic import ValidationError
from pydantic_core import to_jsonable_python

from .doctor import Report, diagnose, sqlite_file, store_kind, store_time_ms
from .errors import CorruptRecordError, IdempotencyError
from .record import Record, State
from .settings import IdempotencySettings, store_from_url
from .stores.base import BaseIdempotencyStore

__all__ = ["main"]

PROG = "langchain-idempotent"
_MAX_SHOWN = 4000


class _Refused(Exception):
    """The command cannot go on; the message says why (exit status 1, or ``code``)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


# -- entry point ------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit status (``langchain-idempotent --help``)."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error argparse already printed
        return exc.code if isinstance(exc.code, int) else 2
    out, err = sys.stdout, sys.stderr
    try:
        settings = IdempotencySettings()
        url = args.url or _url_from_env(settings)
        kind = store_kind(url)
        store = store_from_url(url, redis_prefix=settings.redis_prefix)
    except ValidationError as exc:
        print(f"{PROG}: error: invalid IDEMPOTENCY_* environment: {exc}", file=err)
        return 2
    except (ValueError, ImportError) as exc:
        print(f"{PROG}: error: {exc}", file=err)
        return 2
    if kind == "memory" and args.command != "doctor":
        print(
            f"{PROG}: note: memory:// is a new, empty store in this process; point --url at "
            "your application's Redis or SQLite store",
            file=err,
        )
    command: Callable[..., int] = args.handler
    try:
        if kind == "sqlite" and args.command != "doctor":
            path = sqlite_file(store)
            if not os.path.exists(path):
                raise _Refused(
                    f"no SQLite database at {path}; check --url (sqlite:///relative.db, "
                    "sqlite:////absolute/path.db)"
                )
        return command(args, store=store, url=url, settings=settings, out=out)
    except _Refused as exc:
        print(f"{PROG}: {exc}", file=err)
        return exc.code
    except CorruptRecordError as exc:
        print(f"{PROG}: corrupt record: {exc}", file=err)
        return 1
    except (IdempotencyError, redis.RedisError, OSError) as exc:
        print(f"{PROG}: error: cannot use the store at {_redact(url)}: {exc}", file=err)
        return 1
    finally:
        store.close()


def _url_from_env(settings: IdempotencySettings) -> str:
    if settings.store_url or settings.redis_url:
        return str(settings.store_url or settings.redis_url)
    if settings.sqlite_path:
        return "sqlite:///" + os.path.abspath(settings.sqlite_path)
    raise ValueError(
        "no store given: pass --url redis://host:6379/0 (or sqlite:///path.db), or set "
        "IDEMPOTENCY_STORE_URL, IDEMPOTENCY_REDIS_URL, REDIS_URL or IDEMPOTENCY_SQLITE_PATH"
    )


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--url",
        help="store URL: redis://…, rediss://…, unix://…, sqlite:///path.db or memory:// "
        "(default: $IDEMPOTENCY_STORE_URL, $IDEMPOTENCY_REDIS_URL, $REDIS_URL, "
        "$IDEMPOTENCY_SQLITE_PATH)",
    )
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Inspect and repair the records of langchain-idempotent "
        "(leases and memoized tool results).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    ls = sub.add_parser("ls", parents=[common], help="list records")
    ls.add_argument("--namespace", help="only this namespace")
    ls.add_argument("--thread", help="only this thread id")
    ls.add_argument("--limit", type=_positive_int, help="at most this many (oldest first)")
    ls.add_argument("--json", action="store_true", help="one JSON document")
    ls.set_defaults(handler=_ls)

    show = sub.add_parser("show", parents=[common], help="one record, payload decoded")
    show.add_argument("key")
    show.add_argument("--json", action="store_true", help="one JSON document")
    show.set_defaults(handler=_show)

    purge = sub.add_parser("purge", parents=[common], help="delete every record of a thread")
    purge.add_argument("--thread", required=True, type=_non_empty, help="thread id")
    purge.add_argument("--namespace", help="only in this namespace")
    purge.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    purge.set_defaults(handler=_purge)

    delete = sub.add_parser(
        "delete", parents=[common], help="delete one record (also an unreadable one)"
    )
    delete.add_argument("key")
    delete.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    delete.set_defaults(handler=_delete)

    resolve = sub.add_parser(
        "resolve", parents=[common], help="settle a record whose outcome is unknown"
    )
    resolve.add_argument("key")
    what = resolve.add_mutually_exclusive_group(required=True)
    what.add_argument("--result", metavar="JSON", help="store this JSON value as the result")
    what.add_argument("--text", help="store this string as the result")
    what.add_argument("--free", action="store_true", help="free the key: the next call runs")
    resolve.add_argument(
        "--force", action="store_true", help="also act on a live lease (its owner is hung)"
    )
    resolve.add_argument(
        "--ttl",
        type=_positive_float,
        help="seconds to keep a stored result (default: $IDEMPOTENCY_TTL or 86400)",
    )
    resolve.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    resolve.set_defaults(handler=_resolve)

    doctor = sub.add_parser(
        "doctor", parents=[common], help="check the store and what puts records at risk"
    )
    doctor.add_argument("--pings", type=_positive_int, default=10, help="latency samples")
    doctor.add_argument("--strict", action="store_true", help="exit 3 when a risk is found")
    doctor.add_argument("--json", action="store_true", help="one JSON document")
    doctor.set_defaults(handler=_doctor)
    return parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds: {text!r}")
    return value


def _non_empty(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("must not be empty")
    return text


# -- ls ---------------------------------------------------------------------------------


def _ls(
    args: argparse.Namespace, *, store: BaseIdempotencyStore, url: str, out: TextIO, **_: Any
) -> int:
    records = store.list(namespace=args.namespace, thread_id=args.thread, limit=args.limit)
    now = store_time_ms(url)
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


def _show(
    args: argparse.Namespace, *, store: BaseIdempotencyStore, url: str, out: TextIO, **_: Any
) -> int:
    rec = _existing(store, args.key)
    now = store_time_ms(url)
    doc = _summary(rec, now)
    decoded, problem = _decode(rec)
    if args.json:
        if problem is not None:
            doc["payload_error"] = problem
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
        ("payload", "-" if rec.payload is None else f"{len(rec.payload)} bytes"),
    ]
    for name, value in lines:
        print(f"{name + ':':<13}{'' if value is None else value}", file=out)
    if status == "outcome_unknown":
        print(
            "\nThe lease passed without a result: the tool may or may not have done its "
            "effect. Check downstream (the key was passed as the idempotency key), then "
            f"run `{PROG} resolve {rec.key} --result JSON` (or --free to run it again).",
            file=out,
        )
    if problem is not None:
        print(f"\npayload cannot be decoded (it was not executed): {problem}", file=out)
        return 1
    if rec.state is State.FAILED:
        print(f"\nerror (re-raised on replay): {decoded['type']}: {decoded['message']}", file=out)
    elif rec.state is State.COMPLETED:
        print(f"\nresult ({type(decoded).__name__}):", file=out)
        print(_clip(_render(decoded)), file=out)
    return 0


def _existing(store: BaseIdempotencyStore, key: str) -> Record:
    rec = store.get(key)
    if rec is None:
        raise _Refused(f"no record under key {key!r} (expired, purged, or never written)")
    return rec


def _decode(rec: Record) -> tuple[Any, str | None]:
    """The stored result (or failure) decoded strictly, or ``(None, why it failed)``."""
    if rec.state not in (State.COMPLETED, State.FAILED):
        return None, None
    from .serde import ResultSerializer  # loads LangGraph: only when a payload is shown

    serializer = ResultSerializer()
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


def _purge(
    args: argparse.Namespace, *, store: BaseIdempotencyStore, url: str, out: TextIO, **_: Any
) -> int:
    records = store.list(namespace=args.namespace, thread_id=args.thread)
    where = f"thread {args.thread!r}" + (
        f" in namespace {args.namespace!r}" if args.namespace else " (every namespace)"
    )
    if not records:
        print(f"no records for {where}", file=out)
        return 0
    now = store_time_ms(url)
    live = sum(1 for rec in records if rec.lease_live(now))
    warning = (
        f" {live} of them hold a live lease: their tools may be running, and deleting the "
        "record lets a duplicate call run too."
        if live
        else ""
    )
    _confirm(
        f"Delete {len(records)} record(s) of {where} from {_redact(url)}?{warning} "
        "Their calls will run again if retried.",
        yes=args.yes,
    )
    deleted = store.purge(thread_id=args.thread, namespace=args.namespace)
    print(f"deleted {deleted} record(s) of {where}", file=out)
    return 0


# -- delete -----------------------------------------------------------------------------


def _delete(
    args: argparse.Namespace, *, store: BaseIdempotencyStore, url: str, out: TextIO, **_: Any
) -> int:
    try:
        rec = _existing(store, args.key)
    except CorruptRecordError as exc:  # the one record `show` and `resolve` cannot act on
        what, warning = f"unreadable: {exc}", ""
    else:
        now = store_time_ms(url)
        what = f"{_state_label(rec, now)}, tool {rec.meta.get('tool', '?')!r}"
        warning = (
            " It holds a live lease: its tool may be running, and deleting the record lets "
            "a duplicate call run too."
            if rec.lease_live(now)
            else ""
        )
    _confirm(
        f"Delete record {args.key} ({what}) from {_redact(url)}?{warning} Its call will run "
        "again if retried.",
        yes=args.yes,
    )
    if not store.delete(args.key):
        raise _Refused(f"no record under key {args.key!r}: it expired or was deleted meanwhile")
    print(f"deleted record {args.key}", file=out)
    return 0


# -- resolve ----------------------------------------------------------------------------


def _resolve(
    args: argparse.Namespace,
    *,
    store: BaseIdempotencyStore,
    url: str,
    out: TextIO,
    settings: IdempotencySettings,
    **_: Any,
) -> int:
    payload = None if args.free else _payload(args)
    rec = _existing(store, args.key)
    if rec.done:
        raise _Refused(
            f"record {rec.key} is already {rec.state.value}: nothing to resolve (its result "
            f"replays to every call; `{PROG} show {rec.key}` shows it)"
        )
    now = store_time_ms(url)
    if rec.lease_live(now) and not args.force:
        raise _Refused(
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
        _confirm(f"Free {rec.key} ({who})? The next call runs the tool again.", yes=args.yes)
        if not store.release(rec.key, owner=rec.owner, fence=rec.fence):
            raise _Refused(
                f"record {rec.key} changed since it was read (another caller claimed or "
                f"completed it); nothing was done. `{PROG} show {rec.key}` shows it now"
            )
        print(f"freed {rec.key}: the next call runs the tool (fence {rec.fence + 1})", file=out)
        return 0

    _confirm(f"Store this result for {rec.key} ({who})? Every later call replays it.", yes=args.yes)
    ttl = args.ttl if args.ttl is not None else settings.policy().ttl_s
    completion = store.complete(
        rec.key,
        owner=rec.owner,
        fence=rec.fence,
        fingerprint=rec.fingerprint,
        payload=payload,
        failed=False,
        ttl_ms=max(1, int(ttl * 1000)),
        meta=rec.meta,
    )
    if not completion.stored:
        raise _Refused(
            f"another result was stored for {rec.key} meanwhile; it stands (`{PROG} show "
            f"{rec.key}`)"
        )
    print(f"stored the result for {rec.key}: later calls replay it", file=out)
    return 0


def _payload(args: argparse.Namespace) -> bytes:
    if args.text is not None:
        value: Any = args.text
    else:
        try:
            value = json.loads(args.result)
        except json.JSONDecodeError as exc:
            raise _Refused(
                f"--result must be JSON ({exc}); quote a string as '\"text\"' or use --text",
                code=2,
            ) from None
    try:
        from .serde import ResultSerializer

        return ResultSerializer().dumps(value)
    except (IdempotencyError, ValueError) as exc:
        raise _Refused(f"cannot store that result: {exc}", code=2) from None


# -- doctor -----------------------------------------------------------------------------


def _doctor(
    args: argparse.Namespace, *, store: BaseIdempotencyStore, url: str, out: TextIO, **_: Any
) -> int:
    report = diagnose(url, store, pings=args.pings)
    if args.json:
        doc = {
            "url": _redact(url),
            "kind": report.kind,
            "facts": report.facts,
            "findings": [
                {"level": f.level, "topic": f.topic, "message": f.message} for f in report.findings
            ],
        }
        print(json.dumps(doc, indent=2), file=out)
    else:
        _print_report(report, url, out)
    return 3 if args.strict and report.risks else 0


def _print_report(report: Report, url: str, out: TextIO) -> None:
    rows = [("store", f"{report.kind} at {_redact(url)}")]
    for name, value in report.facts.items():
        if name == "latency_ms":
            value = (
                f"{value['median']:.2f} ms median, {value['max']:.2f} ms max "
                f"({value['pings']} pings)"
            )
        elif value == "":
            value = "(empty)"
        elif value is None:
            value = "(unknown)"
        rows.append((name.replace("_", " "), str(value)))
    width = max(len(name) for name, _ in rows) + 2
    for name, value in rows:
        print(f"{name + ':':<{width}}{value}", file=out)
    print("", file=out)
    for finding in report.findings:
        print(f"[{finding.level.upper():>4}] {finding.topic}: {finding.message}", file=out)
    risks = len(report.risks)
    print(f"\n{risks} risk(s) to records" if risks else "\nno risk to records found", file=out)


# -- shared -----------------------------------------------------------------------------


def _confirm(question: str, *, yes: bool) -> None:
    """Go on only with ``--yes`` or a "y" typed on a terminal."""
    if yes:
        return
    stdin = sys.stdin
    if stdin is None or stdin.closed or not stdin.isatty():
        raise _Refused(
            f"{question}\nnot confirmed: standard input is not a terminal; add --yes to "
            "confirm from a script",
        )
    print(f"{question} [y/N] ", end="", file=sys.stderr, flush=True)
    answer = stdin.readline().strip().lower()
    if answer not in ("y", "yes"):
        raise _Refused("aborted: nothing was changed")


def _redact(url: str) -> str:
    """The URL without its password."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))
