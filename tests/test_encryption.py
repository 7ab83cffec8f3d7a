"""Results at rest: sealed with AES-256-GCM, bound to their record, refused when tampered
with (on every store, the raw bytes written the way each store keeps them), rotated, and
configured from the environment with clear errors that never show key bytes."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from langchain_core.tools import tool

from langchain_idempotent import (
    CorruptRecordError,
    InMemoryIdempotencyStore,
    Policy,
    ResultEncryption,
    SqliteIdempotencyStore,
    idempotent,
)
from langchain_idempotent.core.engine import Engine
from langchain_idempotent.core.store import BaseIdempotencyStore
from tests.support.postgres_fixtures import pg_server, pg_table, pg_url
from tests.support.raw_records import get_payload, set_payload

__all__ = ["pg_server", "pg_table", "pg_url"]  # fixtures used by this module

K1, K2, K9 = (bytes([n]) * 32 for n in (1, 2, 9))
KEYS = ResultEncryption({"k2": K2, "k1": K1})


def _b64(key: bytes) -> str:
    return base64.urlsafe_b64encode(key).decode()


@pytest.fixture(params=["memory", "sqlite", "redis", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BaseIdempotencyStore]:
    if request.param == "memory":
        yield InMemoryIdempotencyStore()
    elif request.param == "sqlite":
        s = SqliteIdempotencyStore(str(tmp_path / "records.db"))
        yield s
        s.close()
    elif request.param == "redis":
        yield request.getfixturevalue("redis_store")
    else:
        from langchain_idempotent import PostgresIdempotencyStore

        url, table = request.getfixturevalue("pg_url"), request.getfixturevalue("pg_table")
        pg = PostgresIdempotencyStore.from_url(url, table=table)
        yield pg
        pg.drop()
        pg.close()


class Tool:
    """An action that counts its runs and returns a receipt with a customer's name."""

    def __init__(self) -> None:
        self.runs = 0

    def __call__(self) -> dict[str, object]:
        self.runs += 1
        return {"refund": 140, "customer": "Ada Lovelace"}


def _engine(
    store: BaseIdempotencyStore, encryption: ResultEncryption | None, **kw: object
) -> Engine:
    return Engine(store, Policy(encryption=encryption, **kw))  # type: ignore[arg-type]


# -- the tampering table, on every store ---------------------------------------------------


def _flip(payload: bytes) -> bytes:
    return payload[:-1] + bytes([payload[-1] ^ 1])


def test_a_sealed_result_replays_and_is_not_plaintext_at_rest(store: BaseIdempotencyStore) -> None:
    action = Tool()
    engine = _engine(store, KEYS)
    first = engine.run("at-rest", fingerprint="fp", action=action)
    assert engine.run("at-rest", fingerprint="fp", action=action) == first
    assert action.runs == 1
    raw = get_payload(store, "at-rest")
    assert raw.startswith(b"aesgcm1\n") and b"Ada Lovelace" not in raw


Tamper = Callable[[BaseIdempotencyStore, Engine], None]


def _flipped_byte(store: BaseIdempotencyStore, engine: Engine) -> None:
    set_payload(store, "victim", _flip(get_payload(store, "victim")))


def _copied_from_another_record(store: BaseIdempotencyStore, engine: Engine) -> None:
    engine.run("other", fingerprint="fp", action=lambda: {"refund": 1, "customer": "Eve"})
    set_payload(store, "victim", get_payload(store, "other"))


def _a_failure_in_a_results_place(store: BaseIdempotencyStore, engine: Engine) -> None:
    failing = _engine(store, KEYS, terminal_exceptions=(KeyError,))

    def boom() -> None:
        raise KeyError("no such order")

    with pytest.raises(KeyError):
        failing.run("failed-one", fingerprint="fp", action=boom)
    set_payload(store, "victim", get_payload(store, "failed-one"))


def _key_id_not_in_the_set(store: BaseIdempotencyStore, engine: Engine) -> None:
    store.delete("victim")
    _engine(store, ResultEncryption({"k9": K9})).run("victim", fingerprint="fp", action=Tool())


def _key_id_changed_in_the_header(store: BaseIdempotencyStore, engine: Engine) -> None:
    raw = get_payload(store, "victim")
    assert b"\x02k2" in raw
    set_payload(store, "victim", raw.replace(b"\x02k2", b"\x02k1", 1))


def _plaintext_record(store: BaseIdempotencyStore, engine: Engine) -> None:
    store.delete("victim")
    _engine(store, None).run("victim", fingerprint="fp", action=Tool())


TAMPERING: dict[str, tuple[Tamper, str]] = {
    "a flipped byte": (_flipped_byte, "does not authenticate"),
    "a payload copied from another record": (_copied_from_another_record, "does not authenticate"),
    "a failure's payload in a result's place": (
        _a_failure_in_a_results_place,
        "does not authenticate",
    ),
    "a key id not in the set": (_key_id_not_in_the_set, "key id 'k9', which is not in"),
    "a key id changed in the header": (_key_id_changed_in_the_header, "does not authenticate"),
    "a plaintext record": (_plaintext_record, "is not encrypted"),
}


@pytest.mark.parametrize("case", list(TAMPERING))
def test_a_tampered_record_is_refused_naming_key_and_key_id_and_the_tool_does_not_run(
    store: BaseIdempotencyStore, case: str
) -> None:
    tamper, expected = TAMPERING[case]
    engine = _engine(store, KEYS)
    engine.run("victim", fingerprint="fp", action=Tool())
    tamper(store, engine)
    action = Tool()
    with pytest.raises(CorruptRecordError) as caught:
        engine.run("victim", fingerprint="fp", action=action)
    assert action.runs == 0, "the tool ran on a refused record"
    message = str(caught.value)
    assert caught.value.key == "victim" and "victim" in message
    assert expected in message
    assert "key id" in message or "not encrypted" in message
    assert "Ada Lovelace" not in message and "Eve" not in message


def test_the_same_tampering_replays_unprotected_which_is_what_encryption_prevents(
    store: BaseIdempotencyStore,
) -> None:
    """Without encryption a well-formed substitute replays: the duplicate the table stops."""
    engine = _engine(store, None)
    engine.run("victim", fingerprint="fp", action=Tool())
    engine.run("other", fingerprint="fp", action=lambda: {"refund": 1, "customer": "Eve"})
    set_payload(store, "victim", get_payload(store, "other"))
    assert engine.run("victim", fingerprint="fp", action=Tool()) == {"refund": 1, "customer": "Eve"}


def test_accept_plaintext_replays_records_written_before_encryption_and_seals_new_ones(
    store: BaseIdempotencyStore,
) -> None:
    action = Tool()
    _engine(store, None).run("old", fingerprint="fp", action=action)
    migrating = _engine(store, ResultEncryption({"k1": K1}, accept_plaintext=True))
    assert migrating.run("old", fingerprint="fp", action=action) == action()
    assert action.runs == 2  # once for real, once in the assertion above
    migrating.run("new", fingerprint="fp", action=Tool())
    assert get_payload(store, "new").startswith(b"aesgcm1\n")


def test_records_under_an_older_key_replay_while_it_is_in_the_set(
    store: BaseIdempotencyStore,
) -> None:
    action = Tool()
    _engine(store, ResultEncryption({"k1": K1})).run("rot", fingerprint="fp", action=action)
    rotated = _engine(store, ResultEncryption({"k2": K2, "k1": K1}))
    assert rotated.run("rot", fingerprint="fp", action=action)["refund"] == 140
    assert action.runs == 1
    dropped = _engine(store, ResultEncryption({"k2": K2}))
    with pytest.raises(CorruptRecordError, match="key id 'k1'"):
        dropped.run("rot", fingerprint="fp", action=action)
    assert action.runs == 1


def test_a_stored_failure_is_sealed_and_replays_as_the_same_error(
    store: BaseIdempotencyStore,
) -> None:
    engine = _engine(store, KEYS, terminal_exceptions=(ValueError,))
    runs = []

    def refuse() -> None:
        runs.append(1)
        raise ValueError("card declined for Ada Lovelace")

    for _ in range(2):
        with pytest.raises(ValueError, match="card declined"):
            engine.run("declined", fingerprint="fp", action=refuse)
    assert runs == [1]
    assert b"declined" not in get_payload(store, "declined")


def test_an_encrypted_record_read_without_keys_is_refused_naming_the_key_id(
    store: BaseIdempotencyStore,
) -> None:
    _engine(store, KEYS).run("sealed", fingerprint="fp", action=Tool())
    action = Tool()
    with pytest.raises(CorruptRecordError, match="encrypted under key id 'k2'"):
        _engine(store, None).run("sealed", fingerprint="fp", action=action)
    assert action.runs == 0


# -- the public entry points ---------------------------------------------------------------


def test_idempotent_and_policy_from_env_take_the_keys() -> None:
    runs = []

    @tool
    def refund(order: str) -> str:
        """Refund an order."""
        runs.append(order)
        return f"refunded {order} to Ada"

    store = InMemoryIdempotencyStore()
    wrapped = idempotent(refund, store=store, encryption=KEYS)
    config = {"configurable": {"thread_id": "t-enc"}}
    assert wrapped.invoke({"order": "A1"}, config) == "refunded A1 to Ada"
    assert wrapped.invoke({"order": "A1"}, config) == "refunded A1 to Ada"
    assert runs == ["A1"]
    (rec,) = store.list()
    assert rec.payload is not None and b"Ada" not in rec.payload
    env = {"IDEMPOTENCY_ENCRYPTION_KEYS": f"k2:{_b64(K2)},k1:{_b64(K1)}"}
    policy = Policy.from_env(environ=env)
    assert policy.encryption is not None and policy.encryption.key_ids == ("k2", "k1")
    from_env = idempotent(refund, store=store, policy=policy)
    assert from_env.invoke({"order": "A1"}, config) == "refunded A1 to Ada"
    assert runs == ["A1"]


def test_the_middleware_seals_too() -> None:
    from langchain_idempotent import IdempotencyMiddleware

    middleware = IdempotencyMiddleware(
        InMemoryIdempotencyStore(), tools=["refund"], encryption=KEYS
    )
    assert middleware.engine.policy.encryption is KEYS
    assert middleware.engine.serializer.encryption is KEYS


def test_a_payload_is_bound_to_its_namespace_and_kind() -> None:
    from langchain_idempotent.core.serde import ResultSerializer

    a = ResultSerializer(encryption=KEYS, namespace="tenant-a")
    b = ResultSerializer(encryption=KEYS, namespace="tenant-b")
    sealed = a.dumps({"refund": 140}, key="same-key")
    assert a.loads(sealed, key="same-key") == {"refund": 140}
    with pytest.raises(CorruptRecordError, match=r"namespace 'tenant-b'.*does not authenticate"):
        b.loads(sealed, key="same-key")
    with pytest.raises(CorruptRecordError, match=r"stored failure .* does not authenticate"):
        a.loads_failure(sealed, key="same-key")


# -- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: ResultEncryption({}), "empty key set"),
        (lambda: ResultEncryption({"k1": b"\x07" * 16}), "key id 'k1' is 16 bytes"),
        (lambda: ResultEncryption({"k1": K1}, primary="k3"), "primary key id 'k3' is not in"),
        (lambda: ResultEncryption({"bad id!": K1}), "is not 1-64 characters"),
        (lambda: ResultEncryption.parse(f"k1:{_b64(K1)},k1:{_b64(K2)}"), "'k1' is given twice"),
        (lambda: ResultEncryption.parse(""), "IDEMPOTENCY_ENCRYPTION_KEYS is empty"),
        (lambda: ResultEncryption.parse(_b64(K1)), "entry 1 is not key-id:urlsafe-base64"),
        (lambda: ResultEncryption.parse("k1:!!not*base64"), "'k1' is not urlsafe base64"),
        (lambda: ResultEncryption.parse(f"k1:{_b64(K1[:20])}"), "decodes to 20 bytes"),
        (
            lambda: ResultEncryption.from_env(environ={}),
            "IDEMPOTENCY_ENCRYPTION_KEYS is not set",
        ),
        (
            lambda: Policy.from_env(environ={"IDEMPOTENCY_ENCRYPTION_KEYS": "k1:short"}),
            "IDEMPOTENCY_ENCRYPTION_KEYS: key id 'k1'",
        ),
    ],
)
def test_bad_keys_are_refused_at_construction_naming_the_problem_never_the_bytes(
    make: Callable[[], object], message: str
) -> None:
    with pytest.raises(ValueError) as caught:
        make()
    text = str(caught.value)
    assert message in text
    for secret in (K1, K2, b"\x07" * 16):
        assert _b64(secret).rstrip("=") not in text and repr(secret) not in text


def test_the_repr_names_key_ids_not_keys() -> None:
    secret = os.urandom(32)
    text = repr(ResultEncryption({"live": secret}))
    assert "live" in text and _b64(secret) not in text and repr(secret) not in text


def test_the_encryption_benchmark_measures_every_case_and_writes_its_report(
    tmp_path: Path,
) -> None:
    from benchmarks import encryption as bench

    out = tmp_path / "encryption.md"
    assert bench.main(["--rounds", "1", "--batch", "3", "--no-redis", "--out", str(out)]) == 0
    rows = [line for line in out.read_text().splitlines() if line.startswith("| memory")]
    rows += [line for line in out.read_text().splitlines() if line.startswith("| sqlite")]
    assert len(rows) == 8  # 2 stores x 2 sizes x (first run, replay), each off and on
    doc = json.loads(out.with_suffix(".json").read_text())
    assert {d["encryption"] for d in doc} == {"off", "on"} and len(doc) == 16
