"""Configuration from the environment (``IDEMPOTENCY_*``), so a deployment needs no code.

==============================  =========================================================
variable                        meaning
==============================  =========================================================
``IDEMPOTENCY_STORE_URL``       ``redis://…``, ``rediss://…``, ``unix://…``, ``redis+cluster://…``,
                                ``sqlite:///path/file.db`` or ``memory://``
``IDEMPOTENCY_REDIS_URL``       a Redis URL (``REDIS_URL`` is accepted too)
``IDEMPOTENCY_SQLITE_PATH``     a SQLite file, when no Redis URL is set
``IDEMPOTENCY_NAMESPACE``       separates applications / tenants (default ``default``)
``IDEMPOTENCY_LEASE``           seconds (default 30)
``IDEMPOTENCY_TTL``             seconds records are kept (default 86400)
``IDEMPOTENCY_WAIT_TIMEOUT``    seconds a duplicate waits (default 60)
``IDEMPOTENCY_ON_EXPIRED``      ``takeover`` (default) or ``raise``
``IDEMPOTENCY_FAIL_OPEN``       ``true`` to run tools when the store is down (default false)
``IDEMPOTENCY_MAX_RESULT_BYTES``  default 1048576
``IDEMPOTENCY_REDIS_PREFIX``    key prefix in Redis (default ``idem:``)
``IDEMPOTENCY_REDIS_REPLICAS``  replicas that must acknowledge each claim and completion
                                (``WAIT``; default 0: none)
``IDEMPOTENCY_REDIS_REPLICA_TIMEOUT``  seconds to wait for them (default 0.1)
==============================  =========================================================

Arguments given in code win over the environment.
"""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from .policy import Policy
from .serde import DEFAULT_MAX_RESULT_BYTES
from .stores._url import parse_store_url
from .stores.base import BaseIdempotencyStore

__all__ = ["IdempotencySettings", "store_from_url"]


class IdempotencySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="IDEMPOTENCY_", extra="ignore")

    store_url: str | None = None
    redis_url: str | None = Field(
        default=None, validation_alias=AliasChoices("IDEMPOTENCY_REDIS_URL", "REDIS_URL")
    )
    sqlite_path: str | None = None
    redis_prefix: str = "idem:"
    redis_replicas: int = Field(default=0, ge=0)
    redis_replica_timeout: float = Field(default=0.1, gt=0)
    namespace: str = "default"
    lease: float = Field(default=30.0, gt=0)
    ttl: float = Field(default=86400.0, gt=0)
    wait_timeout: float = Field(default=60.0, ge=0)
    on_expired: Literal["takeover", "raise"] = "takeover"
    fail_open: bool = False
    max_result_bytes: int = Field(default=DEFAULT_MAX_RESULT_BYTES, gt=0)

    def policy(self) -> Policy:
        return Policy(
            lease=self.lease,
            ttl=self.ttl,
            wait_timeout=self.wait_timeout,
            on_expired=self.on_expired,
            fail_open=self.fail_open,
            max_result_bytes=self.max_result_bytes,
            namespace=self.namespace,
        )

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
            "idempotent() needs a store: pass store=InMemoryIdempotencyStore() / "
            "SqliteIdempotencyStore('file.db') / RedisIdempotencyStore.from_url(url), or set "
            "IDEMPOTENCY_REDIS_URL, IDEMPOTENCY_SQLITE_PATH or IDEMPOTENCY_STORE_URL"
        )


def store_from_url(
    url: str,
    *,
    redis_prefix: str = "idem:",
    redis_replicas: int = 0,
    redis_replica_timeout: float = 0.1,
) -> BaseIdempotencyStore:
    """A store for ``redis://``, ``rediss://``, ``unix://``, ``redis+cluster://``,
    ``rediss+cluster://``, ``sqlite:///…`` or ``memory://`` (see
    :func:`~langchain_idempotent.stores._url.parse_store_url`). The ``redis_*`` options
    apply to Redis only."""
    return parse_store_url(url).build(
        redis_prefix=redis_prefix,
        redis_replicas=redis_replicas,
        redis_replica_timeout=redis_replica_timeout,
    )
