"""A store URL that points at the wrong place is named as such, at once, in code and CLI.

A wrong PostgreSQL database, user or password is in the error itself (not only in the
pool's log lines after its timeout); a URL of another kind given to a store's ``from_url``
is refused when the store is built, not at its first use.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from langchain_idempotent.cli import main
from langchain_idempotent.errors import StoreUnavailableError
from langchain_idempotent.stores.postgres import PostgresIdempotencyStore
from langchain_idempotent.stores.redis import RedisIdempotencyStore
from tests.support.postgres_fixtures import pg_server, pg_url
from tests.support.postgres_server import PostgresServer

__all__ = ["pg_server", "pg_url"]  # fixtures used by this module

#: Longer than any test runs: an error that waited for the pool would time the test out.
POOL_TIMEOUT = 600


@pytest.fixture(scope="module")
def password_user(pg_server: PostgresServer | None) -> Iterator[tuple[str, str]]:
    """A role that must log in with a password (the session's cluster trusts the others)."""
    if pg_server is None:
        pytest.skip("needs the throwaway cluster (its pg_hba.conf is edited)")
    user, password = f"pw_{uuid.uuid4().hex[:8]}", "right-password"
    with pg_server.connect() as conn:
        conn.execute(f"CREATE ROLE {user} LOGIN PASSWORD '{password}'")
        hba = pg_server.data / "pg_hba.conf"
        hba.write_text(f"host all {user} 127.0.0.1/32 scram-sha-256\n" + hba.read_text())
        conn.execute("SELECT pg_reload_conf()")
    yield user, password


def url_with(base: str, *, user: str | None = None, database: str | None = None) -> str:
    scheme, _, rest = base.partition("://")
    userinfo, _, hostpart = rest.partition("@")
    host, _, db = hostpart.partition("/")
    return f"{scheme}://{user or userinfo}@{host}/{database or db}"


def failure(url: str) -> str:
    store = PostgresIdempotencyStore.from_url(url, timeout=POOL_TIMEOUT)
    try:
        with pytest.raises(StoreUnavailableError) as caught:
            store.get("k")
        return str(caught.value)
    finally:
        store.close()


async def afailure(url: str) -> str:
    store = PostgresIdempotencyStore.from_url(url, timeout=POOL_TIMEOUT)
    try:
        with pytest.raises(StoreUnavailableError) as caught:
            await store.aget("k")
        return str(caught.value)
    finally:
        await store.aclose()


def test_a_wrong_database_is_named_in_the_error(pg_url: str) -> None:
    url = url_with(pg_url, database="no_such_db")
    assert 'database "no_such_db" does not exist' in failure(url)


async def test_a_wrong_database_is_named_in_the_async_error(pg_url: str) -> None:
    url = url_with(pg_url, database="no_such_db")
    assert 'database "no_such_db" does not exist' in await afailure(url)


def test_a_wrong_user_is_named_in_the_error(pg_url: str) -> None:
    assert 'role "nobody_here" does not exist' in failure(url_with(pg_url, user="nobody_here"))


def test_a_wrong_password_is_named_in_the_error_and_never_shown(
    pg_url: str, password_user: tuple[str, str]
) -> None:
    user, password = password_user
    good = PostgresIdempotencyStore.from_url(url_with(pg_url, user=f"{user}:{password}"))
    try:
        assert good.now_ms() > 0  # the role works with its password
    finally:
        good.close()
    message = failure(url_with(pg_url, user=f"{user}:wrong-password"))
    assert f'password authentication failed for user "{user}"' in message
    assert "wrong-password" not in message


def test_the_cli_names_a_wrong_database_and_exits_1(
    pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["ls", "--url", url_with(pg_url, database="no_such_db")])
    err = capsys.readouterr().err
    assert code == 1 and 'database "no_such_db" does not exist' in err


def test_a_redis_store_refuses_a_postgresql_url_when_built() -> None:
    with pytest.raises(ValueError, match=r"not a Redis URL.*PostgresIdempotencyStore\.from_url"):
        RedisIdempotencyStore.from_url("postgresql://app:secret@db.example/app")
    with pytest.raises(ValueError, match="not a Redis URL") as caught:
        RedisIdempotencyStore.from_url("sqlite:///idem.db")
    assert "store_from_url" in str(caught.value)
    assert "secret" not in str(caught.value)
