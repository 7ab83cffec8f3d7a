"""Configuration from the environment (``IDEMPOTENCY_*``), read when asked, never implicitly.

``store_from_env()`` builds the store a deployment configured; ``Policy.from_env()``
(:mod:`.policy`, the one home of the defaults) reads the policy fields, one variable per
field (``IDEMPOTENCY_LEASE``, ``IDEMPOTENCY_TTL``, ``IDEMPOTENCY_WAIT_TIMEOUT``,
``IDEMPOTENCY_ON_EXPIRED``, ``IDEMPOTENCY_FAIL_OPEN``, ``IDEMPOTENCY_MAX_RESULT_BYTES``,
``IDEMPOTENCY_RENEW_FRACTION``, ``IDEMPOTENCY_NAMESPACE``, ``IDEMPOTENCY_SCOPE``), and
``IDEMPOTENCY_ENCRYPTION_KEYS`` (``k2:<urlsafe base64>,k1:<...>``, the first sealing new
records; :class:`~.encryption.ResultEncryption`, docs/encryption.md) with
``IDEMPOTENCY_ENCRYPTION_ACCEPT_PLAINTEXT``::

    tools = idempotent(tools, store_from_env(), policy=Policy.from_env())

The store variables:

==============================  =========================================================
variable                        meaning
==============================  =========================================================
``IDEMPOTENCY_STORE_URL``       ``redis://…``, ``rediss://…``, ``unix://…``, ``redis+cluster://…``,
                                ``rediss+cluster://…``, ``sqlite:///path/file.db``,
                                ``postgresql://…`` / ``postgres://…`` (``?table=``), or
                                ``memory://`` (:data:`~.stores._url.SCHEMES`)
``IDEMPOTENCY_REDIS_URL``       a Redis URL (``REDIS_URL`` is accepted too)
``IDEMPOTENCY_SQLITE_PATH``     a SQLite file, when no URL is set
``IDEMPOTENCY_REDIS_PREFIX``    key prefix in Redis (default ``idem:``)
``IDEMPOTENCY_REDIS_REPLICAS``  replicas that must acknowledge each claim and completion
                                (``WAIT``; default 0: none)
``IDEMPOTENCY_REDIS_REPLICA_TIMEOUT``  seconds to wait for them (default 0.1)
==============================  =========================================================
"""

from __future__ import annotations

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from .core.policy import Policy
from .core.store import BaseIdempotencyStore
from .stores._url import parse_store_url

__all__ = ["IdempotencySettings", "store_from_env", "store_from_url"]


class IdempotencySettings(BaseSettings):
    """Where the records live, from ``IDEMPOTENCY_*`` (read when this object is built)."""

    model_config = SettingsConfigDict(env_prefix="IDEMPOTENCY_", extra="ignore")

    store_url: str | None = None
    redis_url: str | None = Field(
        default=None, validation_alias=AliasChoices("IDEMPOTENCY_REDIS_URL", "REDIS_URL")
    )
    sqlite_path: str | None = None
    redis_prefix: str = "idem:"
    redis_replicas: int = Field(default=0, ge=0)
    redis_replica_timeout: float = Field(default=0.1, gt=0)

    def policy(self) -> Policy:
        """``Policy.from_env()``: the policy fields have one home (:mod:`.policy`)."""
        return Policy.from_env(self.model_config.get("env_prefix") or "IDEMPOTENCY_")

    def store(self) -> BaseIdempotencyStore:
        url = self.store_url or self.redis_url
        if url:
            return store_from_url(
                url,
                redis_prefix=self.redis_prefix,
                redis_replicas=self.redis_replicas,
                redis_replica_timeout=self.redis_replica_timeout,
            )
        if self.sqlite_path:
            from .stores.sqlite import SqliteIdempotencyStore

            return SqliteIdempotencyStore(self.sqlite_path)
        raise ValueError(
            "no idempotency store is configured in the environment: set "
            "IDEMPOTENCY_STORE_URL (or IDEMPOTENCY_REDIS_URL / REDIS_URL, or "
            "IDEMPOTENCY_SQLITE_PATH), or pass a store in code: "
            "SqliteIdempotencyStore('file.db'), RedisIdempotencyStore.from_url(url), "
            "InMemoryIdempotencyStore()"
        )


def store_from_env() -> BaseIdempotencyStore:
    """The store the ``IDEMPOTENCY_*`` variables configure (read now, once)."""
    return IdempotencySettings().store()


def store_from_url(
    url: str,
    *,
    redis_prefix: str = "idem:",
    redis_replicas: int = 0,
    redis_replica_timeout: float = 0.1,
) -> BaseIdempotencyStore:
    """A store for ``redis://``, ``rediss://``, ``unix://``, ``redis+cluster://``,
    ``rediss+cluster://``, ``sqlite:///…``, ``postgresql://…``, ``postgres://…`` or
    ``memory://`` (see :func:`~langchain_idempotent.stores._url.parse_store_url`). The
    ``redis_*`` options apply to Redis only."""
    return parse_store_url(url).build(
        redis_prefix=redis_prefix,
        redis_replicas=redis_replicas,
        redis_replica_timeout=redis_replica_timeout,
    )
