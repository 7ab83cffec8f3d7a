"""What the commands share: the program's name, a refusal, confirmation, the URL without
its password, a hint to paste, and whether a store's place holds any records."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

if TYPE_CHECKING:
    from ..core.store import BaseIdempotencyStore

__all__ = ["PROG", "Refused", "again", "confirm", "nothing_there", "redact"]

PROG = "langchain-idempotent"


class Refused(Exception):
    """The command cannot go on; the message says why (exit status 1, or ``code``)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def nothing_there(store: BaseIdempotencyStore) -> str | None:
    """Why the place ``store`` names holds no records, or ``None`` when it may: no SQLite
    file, no PostgreSQL table, no record under the Redis key prefix. Creates nothing."""
    from ..stores.sqlite import SqliteIdempotencyStore

    if isinstance(store, SqliteIdempotencyStore):
        if os.path.exists(store.path):
            return None
        return (
            f"no SQLite database at {store.path}; check --url (sqlite:///relative.db, "
            "sqlite:////absolute/path.db)"
        )
    if type(store).__name__ == "PostgresIdempotencyStore":
        facts = store.describe()
        if facts["has_table"]:
            return None
        others = ", ".join(facts.get("tables_set_up") or []) or "none"
        return (
            f"no table {facts['table']!r} in database {facts['database']!r}: nothing was "
            "created. The table is table= in code; pass it as --table NAME or "
            f"?table=NAME in the URL (tables set up in this database: {others})"
        )
    prefix = getattr(store, "prefix", None)  # RedisIdempotencyStore
    if isinstance(prefix, str) and not store.list(limit=1):
        return (
            f"no records under the key prefix {prefix!r}: the prefix is prefix= in code; "
            "pass it as --prefix PREFIX or set IDEMPOTENCY_REDIS_PREFIX"
        )
    return None


def again(args: argparse.Namespace, *command: str) -> str:
    """``langchain-idempotent COMMAND...`` with the store options this run was given, so a
    hint can be pasted as it is (a password in ``--url`` shows as ``***``)."""
    words = [PROG, *command]
    if args.url:
        words += ["--url", redact(args.url)]
    if args.prefix is not None:
        words += ["--prefix", args.prefix]
    if args.table is not None:
        words += ["--table", args.table]
    return shlex.join(words)


def confirm(question: str, *, yes: bool) -> None:
    """Go on only with ``--yes`` or a "y" typed on a terminal."""
    if yes:
        return
    stdin = sys.stdin
    if stdin is None or stdin.closed or not stdin.isatty():
        raise Refused(
            f"{question}\nnot confirmed: standard input is not a terminal; add --yes to "
            "confirm from a script",
        )
    print(f"{question} [y/N] ", end="", file=sys.stderr, flush=True)
    answer = stdin.readline().strip().lower()
    if answer not in ("y", "yes"):
        raise Refused("aborted: nothing was changed")


def redact(url: str) -> str:
    """The URL without its password."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))
