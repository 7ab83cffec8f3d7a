"""Configuration: production defaults, environment variables, clear errors for bad options."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from langchain_core.tools import tool

from langchain_idempotent import (
    IdempotencySettings,
    InMemoryIdempotencyStore,
    Policy,
    idempotent,
    store_from_url,
)


@tool
def ping(x: int) -> int:
    """Ping."""
    return x


def test_policy_defaults_are_production_defaults() -> None:
    p = Policy()
    assert p.lease_s == 30 and p.ttl_s == 86400 and p.wait_timeout_s == 60
    assert p.on_expired == "takeover" and p.fail_open is False and p.scope == "thread"


def test_durations_accept_seconds_or_timedelta() -> None:
    assert Policy(lease=timedelta(seconds=5)).lease_ms == 5000
    assert Policy(ttl=3600.0).ttl_ms == 3_600_000


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lease": 0}, "lease must be a positive"),
        ({"lease": float("nan")}, "lease must be a positive"),
        ({"ttl": 1, "lease": 10}, "ttl .* must be at least the lease"),
        ({"on_expired": "ignore"}, "on_expired"),
        ({"scope": "session"}, "scope must be"),
        ({"namespace": ""}, "namespace"),
        ({"wait_timeout": -1}, "wait_timeout"),
    ],
)
def test_bad_policies_are_rejected_with_the_field_named(
    kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        Policy(**kwargs)  # type: ignore[arg-type]


def test_an_unknown_option_to_idempotent_is_named() -> None:
    with pytest.raises(TypeError, match="leese"):
        idempotent(ping, store=InMemoryIdempotencyStore(), leese=3)


def test_environment_configures_the_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IDEMPOTENCY_LEASE", "12")
    monkeypatch.setenv("IDEMPOTENCY_NAMESPACE", "billing")
    monkeypatch.setenv("IDEMPOTENCY_ON_EXPIRED", "raise")
    wrapped = idempotent(ping, store=InMemoryIdempotencyStore(), wait_timeout=3)
    assert wrapped.policy.lease_s == 12 and wrapped.policy.namespace == "billing"
    assert wrapped.policy.on_expired == "raise" and wrapped.policy.wait_timeout_s == 3


def test_redis_url_is_read_from_either_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("IDEMPOTENCY_REDIS_URL", raising=False)
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    assert IdempotencySettings().redis_url == "redis://127.0.0.1:1/0"
    monkeypatch.setenv("IDEMPOTENCY_REDIS_URL", "redis://127.0.0.1:2/0")
    assert IdempotencySettings().redis_url == "redis://127.0.0.1:2/0"


def test_replica_acknowledgement_is_configured_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("IDEMPOTENCY_STORE_URL", "redis://127.0.0.1:1/0")
    monkeypatch.setenv("IDEMPOTENCY_REDIS_REPLICAS", "2")
    monkeypatch.setenv("IDEMPOTENCY_REDIS_REPLICA_TIMEOUT", "0.25")
    store: Any = IdempotencySettings().store()  # constructing must not connect
    assert store._durability.wait == ("WAIT", 2, 250)
    monkeypatch.setenv("IDEMPOTENCY_STORE_URL", "redis+cluster://127.0.0.1:1")
    with pytest.raises(ValueError, match="not supported on a Redis Cluster"):
        IdempotencySettings().store()
    monkeypatch.setenv("IDEMPOTENCY_REDIS_REPLICAS", "-1")
    with pytest.raises(ValueError, match="redis_replicas"):
        IdempotencySettings()


def test_no_store_configured_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (
        "IDEMPOTENCY_REDIS_URL",
        "REDIS_URL",
        "IDEMPOTENCY_SQLITE_PATH",
        "IDEMPOTENCY_STORE_URL",
    ):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ValueError, match="needs a store"):
        idempotent(ping)


def test_store_urls(tmp_path: Path) -> None:
    assert isinstance(store_from_url("memory://"), InMemoryIdempotencyStore)
    sqlite = store_from_url(f"sqlite:///{tmp_path}/records.db")
    assert type(sqlite).__name__ == "SqliteIdempotencyStore"
    redis = store_from_url("redis://127.0.0.1:1/0")  # constructing must not connect
    assert type(redis).__name__ == "RedisIdempotencyStore"
    with pytest.raises(ValueError, match="unsupported store URL"):
        store_from_url("postgres://x")


def test_wrapping_twice_is_refused() -> None:
    once = idempotent(ping, store=InMemoryIdempotencyStore())
    with pytest.raises(ValueError, match="already idempotent"):
        idempotent(once, store=InMemoryIdempotencyStore())


def test_a_list_of_tools_gives_a_list_sharing_one_engine() -> None:
    @tool
    def pong(x: int) -> int:
        """Pong."""
        return x

    wrapped = idempotent([ping, pong], store=InMemoryIdempotencyStore())
    assert [t.name for t in wrapped] == ["ping", "pong"]
    assert wrapped[0].engine is wrapped[1].engine


def test_plain_functions_are_turned_into_tools() -> None:
    def charge(amount: int) -> str:
        """Charge a card."""
        return f"charged {amount}"

    wrapped = idempotent(charge, store=InMemoryIdempotencyStore())
    assert wrapped.name == "charge"
    assert (
        wrapped.invoke({"amount": 3}, {"configurable": {"idempotency_scope": "o1"}}) == "charged 3"
    )
