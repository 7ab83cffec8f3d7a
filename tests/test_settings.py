"""Configuration: production defaults in one place, the environment read only when asked,
typed options, clear errors for bad options."""

from __future__ import annotations

import dataclasses
import typing
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from langchain_core.tools import tool

from langchain_idempotent import IdempotencyMiddleware, InMemoryIdempotencyStore, Policy, idempotent
from langchain_idempotent.core.policy import PolicyOptions, env_fields, option_names
from langchain_idempotent.settings import IdempotencySettings, store_from_env, store_from_url


@tool
def ping(x: int) -> int:
    """Ping."""
    return x


def test_policy_defaults_are_production_defaults() -> None:
    p = Policy()
    assert p.lease_s == 2 and p.ttl_s == 86400 and p.wait_timeout_s == 60
    assert p.fail_open is False and p.scope == "thread"
    # on_expired and approval are left None (not given): an effect class's preset fills
    # them, else the defaults a call uses, "takeover" and no approval.
    assert p.on_expired is None and p.approval is None
    assert p.for_tool(None).on_expired == "takeover" and p.for_tool(None).approval is False


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
        idempotent(ping, store=InMemoryIdempotencyStore(), leese=3)  # type: ignore[call-overload]


def test_a_ttl_shorter_than_the_lease_names_both_options_and_the_fix() -> None:
    with pytest.raises(ValueError) as raised:
        idempotent(ping, store=InMemoryIdempotencyStore(), ttl=1)
    message = str(raised.value)
    assert "ttl (1s) must be at least the lease (2s)" in message
    assert "ttl=" in message and "lease=" in message
    # Following the advice works.
    assert idempotent(ping, store=InMemoryIdempotencyStore(), ttl=1, lease=1).policy.ttl_s == 1


def test_policy_options_are_the_fields_of_the_policy_with_the_same_types() -> None:
    fields = {f.name for f in dataclasses.fields(Policy) if f.init}
    assert set(PolicyOptions.__annotations__) == fields == set(option_names())
    policy_hints = typing.get_type_hints(Policy)
    assert typing.get_type_hints(PolicyOptions) == {name: policy_hints[name] for name in fields}
    assert PolicyOptions.__total__ is False


def test_options_win_over_a_whole_policy() -> None:
    base = Policy(lease=5, namespace="billing")
    wrapped = idempotent(ping, InMemoryIdempotencyStore(), policy=base, wait_timeout=3)
    assert wrapped.policy == Policy(lease=5, namespace="billing", wait_timeout=3).for_tool("ping")
    with pytest.raises(TypeError, match="policy must be a Policy"):
        idempotent(ping, InMemoryIdempotencyStore(), policy={"lease": 5})  # type: ignore[call-overload]


def test_the_environment_is_read_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IDEMPOTENCY_LEASE", "12")
    monkeypatch.setenv("IDEMPOTENCY_NAMESPACE", "billing")
    monkeypatch.setenv("IDEMPOTENCY_ON_EXPIRED", "raise")
    # idempotent() and the middleware never read it ...
    assert idempotent(ping, InMemoryIdempotencyStore()).policy == Policy().for_tool("ping")
    middleware = IdempotencyMiddleware(InMemoryIdempotencyStore(), tools=["ping"])
    assert middleware.engine.policy == Policy().for_tool(None)
    # ... Policy.from_env() does, and options given in code win over it.
    wrapped = idempotent(ping, InMemoryIdempotencyStore(), policy=Policy.from_env(), wait_timeout=3)
    assert wrapped.policy.lease_s == 12 and wrapped.policy.namespace == "billing"
    assert wrapped.policy.on_expired == "raise" and wrapped.policy.wait_timeout_s == 3
    assert IdempotencySettings().policy() == Policy.from_env()


def test_every_string_option_has_its_environment_variable() -> None:
    values = {
        "lease": ("PT5S", 5.0),
        "ttl": ("7200", 7200.0),
        "wait_timeout": ("0", 0.0),
        "on_expired": ("raise", "raise"),
        "fail_open": ("true", True),
        "max_result_bytes": ("4096", 4096),
        "renew_fraction": ("0.5", 0.5),
        "namespace": ("tenant-a", "tenant-a"),
        "scope": ("call", "call"),
    }
    assert set(env_fields()) == set(values)
    code_only = {
        "terminal_exceptions",
        "allowed_types",
        "transactional",
        "approval",
        "reconcile",
        "effect",
        "boundary",
        "not_sent",
        "identical_calls",
        "on_fork",
        "interrupt_mode",
        "approval_ttl",
        "authorize",
        "key_state",
        "key_exclude",
        "encryption",  # IDEMPOTENCY_ENCRYPTION_KEYS, parsed by ResultEncryption.from_env
    }
    assert set(option_names()) - set(env_fields()) == code_only
    environ = {f"APP_{name.upper()}": raw for name, (raw, _) in values.items()}
    policy = Policy.from_env("APP_", environ=environ)
    for name, (_, expected) in values.items():
        seconds = getattr(policy, f"{name}_s", None)
        assert (seconds if seconds is not None else getattr(policy, name)) == expected, name


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"IDEMPOTENCY_LEASE": "soon"}, "IDEMPOTENCY_LEASE='soon'"),
        ({"IDEMPOTENCY_ON_EXPIRED": "ignore"}, "IDEMPOTENCY_ON_EXPIRED='ignore'"),
        ({"IDEMPOTENCY_LEASE": "0"}, "lease must be a positive duration.*IDEMPOTENCY_LEASE"),
        ({"IDEMPOTENCY_TTL": "1"}, "ttl .* at least the lease.*IDEMPOTENCY_TTL"),
    ],
)
def test_a_bad_environment_variable_is_named(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Policy.from_env(environ=environ)


def test_settings_hold_only_the_store_part() -> None:
    assert not set(IdempotencySettings.model_fields) & set(option_names())


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


def test_no_store_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(TypeError, match=r"idempotent\(\) needs a store.*store_from_env\(\)"):
        idempotent(ping)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match=r"IdempotencyMiddleware needs a store.*SqliteIdempotency"):
        IdempotencyMiddleware(tools=["ping"])
    for var in (
        "IDEMPOTENCY_REDIS_URL",
        "REDIS_URL",
        "IDEMPOTENCY_SQLITE_PATH",
        "IDEMPOTENCY_STORE_URL",
    ):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(
        ValueError, match=r"no idempotency store is configured.*IDEMPOTENCY_STORE_URL"
    ):
        store_from_env()


def test_the_store_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("IDEMPOTENCY_STORE_URL", raising=False)
    monkeypatch.delenv("IDEMPOTENCY_REDIS_URL", raising=False)
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.setenv("IDEMPOTENCY_SQLITE_PATH", str(tmp_path / "records.db"))
    assert type(store_from_env()).__name__ == "SqliteIdempotencyStore"


def test_store_urls(tmp_path: Path) -> None:
    assert isinstance(store_from_url("memory://"), InMemoryIdempotencyStore)
    sqlite = store_from_url(f"sqlite:///{tmp_path}/records.db")
    assert type(sqlite).__name__ == "SqliteIdempotencyStore"
    redis = store_from_url("redis://127.0.0.1:1/0")  # constructing must not connect
    assert type(redis).__name__ == "RedisIdempotencyStore"
    postgres = store_from_url("postgresql://app@127.0.0.1:1/app")  # nor this one
    assert type(postgres).__name__ == "PostgresIdempotencyStore"
    with pytest.raises(ValueError, match="unsupported store URL"):
        store_from_url("mysql://x")


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


def test_the_settings_docs_name_every_policy_variable() -> None:
    from langchain_idempotent import settings

    doc = settings.__doc__ or ""
    assert [n for n in env_fields() if f"``IDEMPOTENCY_{n.upper()}``" not in doc] == []


def test_the_settings_and_store_from_url_name_every_scheme_the_parser_accepts() -> None:
    import langchain_idempotent.settings as settings_module
    from langchain_idempotent.stores._url import SCHEMES

    for doc in (settings_module.__doc__ or "", settings_module.store_from_url.__doc__ or ""):
        for scheme in SCHEMES:
            assert f"``{scheme}:" in doc, scheme
