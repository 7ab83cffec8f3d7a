"""The operator's side of encrypted records, on Redis, SQLite and PostgreSQL: ``show``
keeps a payload encrypted unless asked with the keys, ``rotate`` re-seals under the primary
key by compare-and-set (a record changed meanwhile is left alone), ``purge --thread``
erases encrypted records, ``resolve`` seals the result it stores."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from langchain_core.tools import tool

from langchain_idempotent import CorruptRecordError, Policy, ResultEncryption, idempotent
from langchain_idempotent.core.engine import Engine
from langchain_idempotent.stores._reseal import replace_payload
from tests.support.raw_records import get_payload
from tests.test_cli import Backend, backend, pg_server, pg_table, pg_url, run

__all__ = ["backend", "pg_server", "pg_table", "pg_url"]  # fixtures used by this module

K1, K2 = bytes([1]) * 32, bytes([2]) * 32
OLD, NEW = ResultEncryption({"k1": K1}), ResultEncryption({"k2": K2, "k1": K1})


def _env(*pairs: tuple[str, bytes]) -> str:
    return ",".join(f"{kid}:{base64.urlsafe_b64encode(key).decode()}" for kid, key in pairs)


def _seed(b: Backend, key: str, encryption: ResultEncryption | None, value: str) -> None:
    Engine(b.store, Policy(encryption=encryption)).run(key, fingerprint="fp", action=lambda: value)


def test_show_prints_an_encrypted_result_as_encrypted_unless_decrypted_with_the_keys(
    backend: Backend, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _seed(backend, "secret-1", NEW, "refunded 140 to Ada Lovelace")
    code, out, _ = run(capsys, "show", "secret-1", "--url", backend.url)
    assert code == 0 and "Ada" not in out
    assert "encrypted (key id 'k2')" in out and "--decrypt" in out
    code, out, _ = run(capsys, "show", "secret-1", "--url", backend.url, "--json")
    doc = json.loads(out)
    assert doc["encrypted"] == {"key_id": "k2", "namespace": "default"} and "result" not in doc
    code, _, err = run(capsys, "show", "secret-1", "--url", backend.url, "--decrypt")
    assert code == 2 and "IDEMPOTENCY_ENCRYPTION_KEYS is not set" in err
    monkeypatch.setenv("IDEMPOTENCY_ENCRYPTION_KEYS", _env(("k2", K2)))
    code, out, _ = run(capsys, "show", "secret-1", "--url", backend.url, "--decrypt")
    assert code == 0 and "refunded 140 to Ada Lovelace" in out


def test_rotate_reseals_under_the_primary_so_the_old_key_can_be_dropped(
    backend: Backend, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _seed(backend, "under-k1", OLD, "receipt one")
    _seed(backend, "under-k2", NEW, "receipt two")
    _seed(backend, "plain", None, "receipt three")
    monkeypatch.setenv("IDEMPOTENCY_ENCRYPTION_KEYS", _env(("k2", K2), ("k1", K1)))
    code, out, _ = run(capsys, "rotate", "--url", backend.url, "--yes")
    assert code == 0, out
    assert "re-encrypted 1 record(s) under key id 'k2'; 1 already under it" in out
    assert "1 record(s) are not encrypted" in out
    code, out, _ = run(capsys, "rotate", "--url", backend.url, "--yes", "--seal-plaintext")
    assert code == 0 and "re-encrypted 1 record(s)" in out and "2 already under it" in out
    only_new = Engine(backend.store, Policy(encryption=ResultEncryption({"k2": K2})))
    ran: list[str] = []
    for key, value in (("under-k1", "one"), ("under-k2", "two"), ("plain", "three")):
        replayed = only_new.run(key, fingerprint="fp", action=lambda k=key: ran.append(k))
        assert replayed == f"receipt {value}"
    assert ran == []  # every record replays under k2 alone: k1 can leave the set


def test_rotate_reports_a_record_that_does_not_open_and_leaves_it(
    backend: Backend, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _seed(backend, "foreign", ResultEncryption({"k9": bytes([9]) * 32}), "not ours")
    before = get_payload(backend.store, "foreign")
    monkeypatch.setenv("IDEMPOTENCY_ENCRYPTION_KEYS", _env(("k2", K2)))
    code, out, _ = run(capsys, "rotate", "--url", backend.url, "--yes")
    assert code == 1 and "not rotated: foreign" in out and "key id 'k9'" in out
    assert get_payload(backend.store, "foreign") == before


def test_a_rewrite_is_a_compare_and_set_that_never_clobbers_a_concurrent_change(
    backend: Backend,
) -> None:
    _seed(backend, "cas", OLD, "first")
    seen = get_payload(backend.store, "cas")
    assert replace_payload(backend.store, "cas", expected=seen, payload=b"msgpack\n\xa1x")
    # a second rotation that read the record before the first one wrote it
    assert not replace_payload(backend.store, "cas", expected=seen, payload=b"msgpack\n\xa1y")
    assert get_payload(backend.store, "cas") == b"msgpack\n\xa1x"
    backend.store.delete("cas")
    assert not replace_payload(backend.store, "cas", expected=b"msgpack\n\xa1x", payload=seen)
    assert backend.store.get("cas") is None


def test_purge_by_thread_erases_encrypted_records(
    backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    runs: list[str] = []

    @tool
    def note(text: str) -> str:
        """Write a note."""
        runs.append(text)
        return f"noted {text}"

    wrapped = idempotent(note, store=backend.store, encryption=NEW)
    for thread in ("tenant-a-thread", "other-thread"):
        wrapped.invoke({"text": "hi"}, {"configurable": {"thread_id": thread}})
    code, out, _ = run(
        capsys, "purge", "--url", backend.url, "--thread", "tenant-a-thread", "--yes"
    )
    assert code == 0 and "deleted 1 record(s)" in out
    assert [r.meta.get("thread_id") for r in backend.store.list()] == ["other-thread"]


def test_resolve_seals_the_result_it_stores_when_the_keys_are_set(
    backend: Backend,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    engine = Engine(backend.store, Policy(encryption=NEW))

    def cancelled() -> str:
        raise KeyboardInterrupt  # its effect may have happened: the key is left uncertain

    with pytest.raises(KeyboardInterrupt):
        engine.run("unknown", fingerprint="fp", action=cancelled)
    monkeypatch.setenv("IDEMPOTENCY_ENCRYPTION_KEYS", _env(("k2", K2), ("k1", K1)))
    code, _, err = run(
        capsys,
        "resolve",
        "unknown",
        "--url",
        backend.url,
        "--text",
        "refunded",
        "--yes",
    )
    assert code == 0, err
    assert get_payload(backend.store, "unknown").startswith(b"aesgcm1\n")
    assert engine.run("unknown", fingerprint="fp", action=lambda: "ran again") == "refunded"
    with pytest.raises(CorruptRecordError):
        Engine(backend.store, Policy(encryption=ResultEncryption({"k3": bytes(32)}))).run(
            "unknown", fingerprint="fp", action=lambda: "ran again"
        )
