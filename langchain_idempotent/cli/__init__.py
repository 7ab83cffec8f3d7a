"""``langchain-idempotent``: look at, clean up and repair idempotency records.

::

    langchain-idempotent ls      [--namespace N] [--thread T] [--limit K] [--json] [--uncertain]
    langchain-idempotent show    KEY [--json] [--decrypt]
    langchain-idempotent purge   --thread T [--namespace N] [--yes]
    langchain-idempotent delete  KEY [--yes]
    langchain-idempotent resolve KEY (--result JSON | --text TEXT | --free) [--force] [--yes]
    langchain-idempotent rotate  [--namespace N] [--thread T] [--seal-plaintext] [--yes]
    langchain-idempotent doctor  [--pings N] [--strict] [--json]
    langchain-idempotent explain --tool NAME --args JSON --thread T [--node N] [--key K [--url U]]
    langchain-idempotent --version

Every command takes ``--url``, any URL ``store_from_url`` accepts (``redis://…``,
``rediss://…``, ``unix://…``, ``redis+cluster://…``, ``rediss+cluster://…``,
``sqlite:///relative.db``, ``sqlite:////absolute.db``, ``postgresql://…?table=…``,
``postgres://…``, ``memory://``), parsed by the same
:func:`~langchain_idempotent.stores._url.parse_store_url`; without it the URL comes from
``IDEMPOTENCY_STORE_URL``, ``IDEMPOTENCY_REDIS_URL``, ``REDIS_URL`` or
``IDEMPOTENCY_SQLITE_PATH``, in that order. What the application set in code is given
the same way: ``--prefix`` (Redis ``prefix=``; default ``IDEMPOTENCY_REDIS_PREFIX``),
``--table`` (PostgreSQL ``table=``, or ``?table=`` in the URL, percent-decoded); the
policy's ``namespace=`` is ``--namespace`` of ``ls`` and ``purge``. Every command works
through the store's own API, so Sentinel, Cluster, TLS and the key prefix apply as they
do for the application.

- **Read-only means read-only.** No command creates a file, a table or a key to look
  at: on a missing SQLite file, PostgreSQL table or Redis key prefix (no record under it)
  each command says so, names the option that would point it elsewhere, and exits 1.
- ``show``, ``delete`` and ``resolve`` take a unique prefix of a key; hints are printed with the
  ``--url`` / ``--prefix`` / ``--table`` the command was given.
- Times are read on the store's clock (``store.now_ms()``: Redis ``TIME``, PostgreSQL
  ``clock_timestamp()``), like leases.
  A running record whose lease has passed without a result is shown as ``running
  (expired)``: its outcome is unknown (the tool may or may not have done its effect).
- Payloads are decoded with the library's strict serializer (no pickle, an allow-list of
  types); one that cannot be decoded is reported, never executed. An encrypted payload
  (docs/encryption.md) is shown as encrypted, with its key id, unless ``show --decrypt`` is
  given and ``IDEMPOTENCY_ENCRYPTION_KEYS`` holds its key; ``resolve`` seals the result it
  stores when that variable is set; ``rotate`` re-seals every completed and failed record
  under the primary key, each with a compare-and-set that leaves a record changed
  meanwhile alone.
- Nothing is deleted or written without confirmation: on a terminal the command asks,
  elsewhere it needs ``--yes``.
- ``resolve`` acts only on a record whose lease has passed without a result (or a live
  one with ``--force``), with the record's own owner and fence, so it cannot overwrite a
  result that another caller stored meanwhile.

Exit status: 0 done; 1 the store could not be reached, holds nothing where it was pointed
(no file, table or record under the key prefix), the record is missing or in a state the
command does not apply to, or the operator declined; 2 bad arguments; 3 ``doctor
--strict`` found a risk; 141 the reader of the output closed the pipe early (``ls --json |
head``): the command stops quietly, as one killed by SIGPIPE would.

The package: this module (``main``, the argument parser), :mod:`._common` (what the
commands share: confirmation, redaction, hints, "nothing there"), :mod:`.records` (``ls``,
``show``, ``purge``, ``delete``, ``resolve``), :mod:`.doctor` and :mod:`.explain`
(``explain``: the parts of a key; needs no store). Each imports :mod:`._common`, never
this module, so the package has no import circle.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TextIO

from ..core._durations import to_seconds
from ._common import PROG, Refused, nothing_there, redact

if TYPE_CHECKING:
    from ..settings import IdempotencySettings

__all__ = ["main"]

#: The schemes named in ``--url``'s help (a test checks them against ``parse_store_url``).
URL_HELP = (
    "store URL: redis://…, rediss://…, unix://…, redis+cluster://…, rediss+cluster://…, "
    "sqlite:///path.db, postgresql://…, postgres://… or memory:// (default: "
    "$IDEMPOTENCY_STORE_URL, $IDEMPOTENCY_REDIS_URL, $REDIS_URL, $IDEMPOTENCY_SQLITE_PATH)"
)


# -- entry point ------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit status (``langchain-idempotent --help``)."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error argparse already printed
        return exc.code if isinstance(exc.code, int) else 2
    out, err = sys.stdout, sys.stderr
    if args.command == "explain" and not args.url:  # needs no store
        from . import explain

        return _reader_gone_quietly(lambda: explain.run(args, out=out, err=err), out)
    return _reader_gone_quietly(lambda: _with_store(args, out, err), out)


#: The exit status when the reader of the output went away (``ls --json | head``): the
#: status of a process killed by SIGPIPE, as ``ls`` or ``git log`` would end.
BROKEN_PIPE = 141


def _reader_gone_quietly(command: Callable[[], int], out: TextIO) -> int:
    """Run ``command``; if whoever reads its output closed the pipe (``| head``), end quietly
    with :data:`BROKEN_PIPE`: that is no failure of the store, and no traceback."""
    try:
        status = command()
        out.flush()  # inside the try: a pipe closed under the last lines breaks here
        return status
    except BrokenPipeError:
        # Python flushes stdout again at exit; point it at /dev/null so that does not fail.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, out.fileno())
            os.close(devnull)
        except (OSError, ValueError):  # not a file descriptor (a captured stream)
            pass
        return BROKEN_PIPE


def _with_store(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Open the store ``--url`` (or the environment) names and run the command on it."""
    # Imported only once a command runs, so that --help and usage errors stay cheap: the
    # settings load pydantic-settings and, through the policy, LangGraph's serializer; a
    # store loads its client library (redis-py).
    from pydantic import ValidationError

    from ..errors import CorruptRecordError, IdempotencyError
    from ..settings import IdempotencySettings
    from ..stores._url import parse_store_url
    from . import doctor, explain, records

    commands: dict[str, Callable[..., int]] = {
        "ls": records.ls,
        "show": records.show,
        "purge": records.purge,
        "delete": records.delete,
        "resolve": records.resolve,
        "rotate": records.rotate,
        "doctor": doctor.run,
        "explain": lambda args, store, **_: explain.run(args, out=out, err=err, store=store),
    }
    try:
        settings = IdempotencySettings()
        url = args.url or _url_from_env(settings)
        target = parse_store_url(url)
        # Never auto_setup: no command creates a table (a mistyped one is reported below).
        store = target.build(
            redis_prefix=settings.redis_prefix if args.prefix is None else args.prefix,
            postgres_table=args.table,
            postgres_auto_setup=False,
        )
    except ValidationError as exc:
        print(f"{PROG}: error: invalid IDEMPOTENCY_* environment: {exc}", file=err)
        return 2
    except (ValueError, ImportError) as exc:
        print(f"{PROG}: error: {exc}", file=err)
        return 2
    if target.kind == "memory" and args.command != "doctor":
        print(
            f"{PROG}: note: memory:// is a new, empty store in this process; point --url at "
            "your application's Redis or SQLite store",
            file=err,
        )
    try:
        if args.command != "doctor" and target.kind in ("sqlite", "postgres"):
            # Before anything reads: a read of a missing table or file would create it.
            missing = nothing_there(store)
            if missing is not None:
                raise Refused(missing)
        return commands[args.command](args, store=store, url=url, settings=settings, out=out)
    except Refused as exc:
        print(f"{PROG}: {exc}", file=err)
        return exc.code
    except CorruptRecordError as exc:
        print(f"{PROG}: corrupt record: {exc}", file=err)
        return 1
    except BrokenPipeError:  # the reader of our output left: not the store's failure
        raise
    except (IdempotencyError, OSError) as exc:  # the store's errors, as it translates them
        print(f"{PROG}: error: cannot use the store at {redact(url)}: {exc}", file=err)
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
    common.add_argument("--url", help=URL_HELP)
    common.add_argument(
        "--prefix",
        help="Redis key prefix, as prefix= in code (default: $IDEMPOTENCY_REDIS_PREFIX or idem:)",
    )
    common.add_argument(
        "--table",
        help="PostgreSQL table, as table= in code (or ?table= in the URL; default "
        "idempotency_records)",
    )
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Inspect and repair the records of langchain-idempotent "
        "(leases and memoized tool results).",
    )
    parser.add_argument(
        "--version", action=_Version, nargs=0, help="print the installed version and exit"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    ls = sub.add_parser("ls", parents=[common], help="list records")
    ls.add_argument("--namespace", help="only this namespace")
    ls.add_argument("--thread", help="only this thread id")
    ls.add_argument("--limit", type=_positive_int, help="at most this many (oldest first)")
    ls.add_argument("--json", action="store_true", help="one JSON document")
    ls.add_argument(
        "--uncertain",
        action="store_true",
        help="only records whose last attempt did not finish (its effect may have happened)",
    )

    show = sub.add_parser("show", parents=[common], help="one record, payload decoded")
    show.add_argument("key")
    show.add_argument("--json", action="store_true", help="one JSON document")
    show.add_argument(
        "--decrypt",
        action="store_true",
        help="decrypt an encrypted payload with $IDEMPOTENCY_ENCRYPTION_KEYS and show it",
    )

    purge = sub.add_parser("purge", parents=[common], help="delete every record of a thread")
    purge.add_argument("--thread", required=True, type=_non_empty, help="thread id")
    purge.add_argument("--namespace", help="only in this namespace")
    purge.add_argument("--yes", action="store_true", help="do not ask for confirmation")

    delete = sub.add_parser(
        "delete", parents=[common], help="delete one record (also an unreadable one)"
    )
    delete.add_argument("key")
    delete.add_argument("--yes", action="store_true", help="do not ask for confirmation")

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
        type=_seconds("--ttl"),
        help="seconds to keep a stored result (default: $IDEMPOTENCY_TTL or 86400)",
    )
    resolve.add_argument("--yes", action="store_true", help="do not ask for confirmation")

    rotate = sub.add_parser(
        "rotate",
        parents=[common],
        help="re-encrypt results under the primary key of $IDEMPOTENCY_ENCRYPTION_KEYS",
    )
    rotate.add_argument("--namespace", help="only this namespace")
    rotate.add_argument("--thread", help="only this thread id")
    rotate.add_argument(
        "--seal-plaintext",
        action="store_true",
        help="also encrypt records stored before encryption was turned on",
    )
    rotate.add_argument("--yes", action="store_true", help="do not ask for confirmation")

    doctor = sub.add_parser(
        "doctor", parents=[common], help="check the store and what puts records at risk"
    )
    doctor.add_argument("--pings", type=_positive_int, default=10, help="latency samples")
    doctor.add_argument("--strict", action="store_true", help="exit 3 when a risk is found")
    doctor.add_argument("--json", action="store_true", help="one JSON document")

    from .explain import add_parser as add_explain

    add_explain(sub, common)
    return parser


class _Version(argparse.Action):
    """``--version``: the installed version, read from the package metadata only when asked
    (argparse's own ``version`` action would need it each time the parser is built)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        from .. import __version__

        print(f"{PROG} {__version__}")  # on stdout, as argparse's own version action does
        parser.exit()


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


def _seconds(name: str) -> Callable[[str], float]:
    """An argparse type: a positive, finite duration in seconds (the library's parser)."""

    def parse(text: str) -> float:
        try:
            return to_seconds(text, name)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def _non_empty(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("must not be empty")
    return text
