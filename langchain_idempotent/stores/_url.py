"""The one parser of store URLs: which store a URL names, and how to build it.

``store_from_url``, ``IDEMPOTENCY_STORE_URL`` and every ``langchain-idempotent`` command
go through :func:`parse_store_url`, so they accept the same schemes:

==========================================  =============================================
scheme                                      store
==========================================  =============================================
``redis://``, ``rediss://`` (TLS),          :class:`~.redis.RedisIdempotencyStore`
``unix://``, ``redis+cluster://``,          (``RedisIdempotencyStore.from_url``)
``rediss+cluster://``
``sqlite:///relative.db``,                  :class:`~.sqlite.SqliteIdempotencyStore`
``sqlite:////absolute.db``                  (``SqliteIdempotencyStore.from_url``)
``postgresql://``, ``postgres://``          :class:`~.postgres.PostgresIdempotencyStore`
                                            (``PostgresIdempotencyStore.from_url``; needs
                                            the ``postgres`` extra)
``memory://``                               a new, empty
                                            :class:`~.memory.InMemoryIdempotencyStore`
==========================================  =============================================

This module imports no store: :meth:`StoreURL.build` imports the one it builds (and
so redis-py only for a Redis URL).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

from .._lazy import needs_extra

if TYPE_CHECKING:
    from ..core.store import BaseIdempotencyStore

__all__ = ["SCHEMES", "StoreKind", "StoreURL", "parse_store_url"]

StoreKind = Literal["redis", "sqlite", "postgres", "memory"]

#: Every accepted scheme, and the kind of store it names.
SCHEMES: dict[str, StoreKind] = {
    "redis": "redis",
    "rediss": "redis",
    "unix": "redis",
    "redis+cluster": "redis",
    "rediss+cluster": "redis",
    "sqlite": "sqlite",
    "postgresql": "postgres",
    "postgres": "postgres",
    "memory": "memory",
}


@dataclass(frozen=True, slots=True)
class StoreURL:
    """A store URL, understood: its ``scheme``, the ``kind`` of store it names, and
    :meth:`build` to make that store."""

    url: str
    scheme: str
    kind: StoreKind

    def build(
        self,
        *,
        redis_prefix: str = "idem:",
        redis_replicas: int = 0,
        redis_replica_timeout: float | timedelta = 0.1,
        postgres_table: str | None = None,
        postgres_auto_setup: bool = True,
    ) -> BaseIdempotencyStore:
        """The store (it connects on first use, not here). The ``redis_*`` options apply to
        Redis only (``prefix``, ``replicas``, ``replica_timeout`` of ``from_url``), the
        ``postgres_*`` ones to PostgreSQL only (``table``, which wins over the URL's
        ``?table=``, and ``auto_setup``)."""
        if self.kind == "redis":
            from .redis import RedisIdempotencyStore

            return RedisIdempotencyStore.from_url(
                self.url,
                prefix=redis_prefix,
                replicas=redis_replicas,
                replica_timeout=redis_replica_timeout,
            )
        if self.kind == "sqlite":
            from .sqlite import SqliteIdempotencyStore

            return SqliteIdempotencyStore.from_url(self.url)
        if self.kind == "postgres":
            try:
                from .postgres import PostgresIdempotencyStore
            except ModuleNotFoundError as exc:  # psycopg: the extra's, named
                named = needs_extra(exc, f"a {self.url.partition(':')[0]}:// store")
                if named is None:
                    raise
                raise named from exc

            options: dict[str, Any] = {"auto_setup": postgres_auto_setup}
            if postgres_table is not None:
                options["table"] = postgres_table
            return PostgresIdempotencyStore.from_url(self.url, **options)
        from .memory import InMemoryIdempotencyStore

        return InMemoryIdempotencyStore()


def parse_store_url(url: str) -> StoreURL:
    """What ``url`` names; a ``ValueError`` naming the accepted schemes for anything else.

    The scheme is read case-insensitively; the rest of the URL is checked when the store is
    built (by the store's own ``from_url``).
    """
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    kind = SCHEMES.get(scheme)
    if kind is None:
        raise ValueError(
            f"unsupported store URL {url!r}: use one of "
            + ", ".join(_EXAMPLES.get(s, f"{s}://") for s in SCHEMES)
        )
    return StoreURL(url, scheme, kind)


_EXAMPLES = {
    "sqlite": "sqlite:///path.db",
    "unix": "unix:///path/redis.sock",
    "postgresql": "postgresql://user@host/db",
}
