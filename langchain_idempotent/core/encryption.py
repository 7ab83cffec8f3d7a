"""Results at rest: AES-256-GCM, bound to the record it belongs to, with key rotation.

``ResultEncryption({"k2": key, "k1": old_key}, primary="k2")`` seals every stored result
and stored failure under the primary key (``encryption=`` on :func:`~.idempotent`,
:class:`~.IdempotencyMiddleware` or :class:`~.Policy`; ``IDEMPOTENCY_ENCRYPTION_KEYS``
through :meth:`ResultEncryption.from_env` and :meth:`.Policy.from_env`). The other keys
only open records written under them, so a rotation is: put the new key first, keep the old
one until ``langchain-idempotent rotate`` has re-sealed the records (or they expired), then
drop it (docs/encryption.md).

A sealed payload is, after the serializer's ``aesgcm1`` tag line::

    <1 byte: key id length> <key id> <2 bytes: namespace length> <namespace>
    <12 bytes: nonce> <ciphertext + 16-byte GCM tag>

The key id and namespace are in the clear (the CLI shows and rotates a record without
knowing which application wrote it); the associated data, which GCM authenticates but does
not store, is the format, the kind (``result`` or ``failure``), the namespace, the record's
key and the key id, each length-prefixed. So a flipped byte, a payload copied from another
record (another key, another namespace, a result moved into a failure's place) or a key id
changed in the header fails to open: :class:`~.errors.CorruptRecordError` naming the key
and the key id, and the tool does not run. A record in plaintext (written before encryption
was turned on, or planted) is refused the same way unless ``accept_plaintext=True``, the
migration switch. Key bytes are never part of any message or ``repr``.
"""

from __future__ import annotations

import base64
import binascii
import functools
import os
import re
import struct
from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

from ..errors import CorruptRecordError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

__all__ = ["ENV_VARIABLE", "TAG", "ResultEncryption", "sealed_key_id"]

#: The serializer's tag line of a sealed payload (``<tag>\\n<data>``, :mod:`.serde`).
TAG = "aesgcm1"
#: The variable :meth:`ResultEncryption.from_env` reads.
ENV_VARIABLE = "IDEMPOTENCY_ENCRYPTION_KEYS"
#: What a payload holds: authenticated as part of the associated data.
Kind = Literal["result", "failure"]

_KEY_ID = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
_NONCE = 12
_GCM_TAG = 16
_AAD_HEAD = b"langchain-idempotent:" + TAG.encode()


def _aesgcm(key: bytes) -> AESGCM:
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise ImportError(
            "ResultEncryption needs the cryptography package: "
            "pip install 'langchain-idempotent[encryption]'"
        ) from exc
    return AESGCM(key)


@functools.cache
def _invalid_tag() -> type[Exception]:
    from cryptography.exceptions import InvalidTag

    return InvalidTag


def _field(value: bytes) -> bytes:
    return struct.pack(">I", len(value)) + value


@functools.lru_cache(maxsize=256)
def _aad_head(kind: Kind, namespace: str, key_id: str) -> bytes:
    return _AAD_HEAD + _field(kind.encode()) + _field(namespace.encode()) + _field(key_id.encode())


def _aad(kind: Kind, namespace: str, key: str, key_id: str) -> bytes:
    """The associated data: format, kind, namespace and key id (cached), then the key."""
    return _aad_head(kind, namespace, key_id) + _field(key.encode())


def _split(data: bytes) -> tuple[str, str, bytes, bytes] | None:
    """``(key id, namespace, nonce, ciphertext)`` of a sealed payload's data, or ``None``
    when it is not laid out as one (the key id is checked by whoever looks it up)."""
    try:
        n = data[0]
        key_id = data[1 : 1 + n].decode("ascii")
        m = int.from_bytes(data[1 + n : 3 + n], "big")
        namespace = data[3 + n : 3 + n + m].decode("utf-8")
    except (IndexError, UnicodeDecodeError):
        return None
    start = 3 + n + m
    if len(data) < start + _NONCE + _GCM_TAG:
        return None
    return key_id, namespace, data[start : start + _NONCE], data[start + _NONCE :]


def sealed_key_id(data: bytes) -> tuple[str, str] | None:
    """``(key id, namespace)`` named in a sealed payload's data (after its tag line), or
    ``None``; read from the clear header, not authenticated (for ``show`` and ``rotate``)."""
    parts = _split(data)
    if parts is None or not _KEY_ID.fullmatch(parts[0]):
        return None
    return parts[0], parts[1]


class ResultEncryption:
    """A set of 32-byte AES-256-GCM keys by key id; the primary one seals, all of them open.

    ``keys`` maps key ids (1-64 of ``A-Z a-z 0-9 _ . -``) to 32 raw bytes; ``primary``
    (default: the first) seals every new payload. ``accept_plaintext=True`` replays records
    written before encryption was turned on (the migration switch: leave it on only until
    those records expired or were re-sealed by ``langchain-idempotent rotate``).

    A key that is not 32 bytes, a duplicate key id, an empty set or a ``primary`` that is
    not in the set is a ``ValueError`` here, naming the key id, never the key bytes.
    """

    __slots__ = ("_ciphers", "accept_plaintext", "primary")

    def __init__(
        self,
        keys: Mapping[str, bytes],
        *,
        primary: str | None = None,
        accept_plaintext: bool = False,
    ) -> None:
        if not isinstance(keys, Mapping):
            raise TypeError(
                f"ResultEncryption takes a dict of key ids to 32-byte keys, got "
                f"{type(keys).__name__}"
            )
        if not keys:
            raise ValueError(
                "ResultEncryption needs at least one key (an empty key set): pass "
                '{"k1": os.urandom(32)} or set IDEMPOTENCY_ENCRYPTION_KEYS'
            )
        ciphers: dict[str, AESGCM] = {}
        for key_id, key in keys.items():
            _check_key_id(key_id)
            if not isinstance(key, bytes | bytearray):
                raise TypeError(
                    f"the key for key id {key_id!r} must be 32 bytes, got {type(key).__name__}"
                )
            if len(key) != 32:
                raise ValueError(
                    f"the key for key id {key_id!r} is {len(key)} bytes; AES-256-GCM takes "
                    "exactly 32 (os.urandom(32), or ResultEncryption.generate_key())"
                )
            ciphers[key_id] = _aesgcm(bytes(key))
        chosen = next(iter(ciphers)) if primary is None else primary
        if chosen not in ciphers:
            raise ValueError(
                f"primary key id {primary!r} is not in the key set "
                f"({', '.join(map(repr, ciphers))})"
            )
        if not isinstance(accept_plaintext, bool):
            raise TypeError(f"accept_plaintext must be True or False, got {accept_plaintext!r}")
        self._ciphers = ciphers
        self.primary: str = chosen
        self.accept_plaintext: bool = accept_plaintext

    # -- construction from text --------------------------------------------------------

    @classmethod
    def parse(
        cls, text: str, *, accept_plaintext: bool = False, source: str = ENV_VARIABLE
    ) -> ResultEncryption:
        """Keys from ``"k2:<urlsafe base64>,k1:<urlsafe base64>"``; the first is primary.
        ``source`` names the text in errors (the variable it came from)."""
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"{source} is empty: give key-id:urlsafe-base64 pairs, e.g. k1:…")
        keys: dict[str, bytes] = {}
        for position, entry in enumerate(text.split(","), start=1):
            key_id, sep, encoded = entry.strip().partition(":")
            key_id = key_id.strip()
            if not sep or not key_id:
                raise ValueError(
                    f"{source}: entry {position} is not key-id:urlsafe-base64 "
                    "(comma-separated pairs, e.g. k2:…,k1:…)"
                )
            _check_key_id(key_id, where=f"{source}: entry {position}: ")
            if key_id in keys:
                raise ValueError(f"{source}: key id {key_id!r} is given twice")
            keys[key_id] = _decode_key(encoded.strip(), f"{source}: key id {key_id!r}")
        return cls(keys, accept_plaintext=accept_plaintext)

    @classmethod
    def from_env(
        cls,
        variable: str = ENV_VARIABLE,
        *,
        environ: Mapping[str, str] | None = None,
        accept_plaintext: bool | None = None,
    ) -> ResultEncryption:
        """The keys in ``variable`` (``IDEMPOTENCY_ENCRYPTION_KEYS``), read now; the first is
        the primary. ``accept_plaintext`` defaults to ``IDEMPOTENCY_ENCRYPTION_ACCEPT_PLAINTEXT``
        (``true``/``false``; unset: false). A missing or malformed variable is a
        ``ValueError`` naming it."""
        env = os.environ if environ is None else environ
        text = env.get(variable)
        if text is None:
            raise ValueError(f"{variable} is not set: give key-id:urlsafe-base64 pairs")
        if accept_plaintext is None:
            accept_plaintext = _flag(env, variable.removesuffix("_KEYS") + "_ACCEPT_PLAINTEXT")
        return cls.parse(text, accept_plaintext=accept_plaintext, source=variable)

    @staticmethod
    def generate_key() -> str:
        """A fresh random key as urlsafe base64 (for ``IDEMPOTENCY_ENCRYPTION_KEYS``)."""
        return base64.urlsafe_b64encode(os.urandom(32)).decode("ascii")

    # -- what it knows -----------------------------------------------------------------

    @property
    def key_ids(self) -> tuple[str, ...]:
        return tuple(self._ciphers)

    def __repr__(self) -> str:
        return (
            f"ResultEncryption(key_ids={list(self._ciphers)!r}, primary={self.primary!r}, "
            f"accept_plaintext={self.accept_plaintext!r})"
        )

    # -- seal and open -----------------------------------------------------------------

    def seal(self, plaintext: bytes, *, kind: Kind, key: str, namespace: str) -> bytes:
        """The sealed data (after the tag line) of ``plaintext`` for record ``key``."""
        key_id = self.primary
        nonce = os.urandom(_NONCE)
        sealed = self._ciphers[key_id].encrypt(nonce, plaintext, _aad(kind, namespace, key, key_id))
        ns = namespace.encode()
        return (
            bytes([len(key_id)])
            + key_id.encode()
            + struct.pack(">H", len(ns))
            + ns
            + nonce
            + sealed
        )

    def open(
        self, data: bytes, *, kind: Kind, key: str | None, namespace: str | None = None
    ) -> bytes:
        """The plaintext of a sealed payload's data, checked against record ``key`` and
        ``namespace`` (``None``: the namespace the header names, for the CLI).
        :class:`CorruptRecordError` when it does not authenticate."""
        parts = _split(data)
        if parts is None:
            raise CorruptRecordError(
                f"the stored {kind} of key {key} is not a well-formed encrypted payload: "
                f"refusing to replay it{_ADVICE.format(key=key)}",
                key=key,
            )
        key_id, stored_ns, nonce, sealed = parts
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            raise CorruptRecordError(
                f"the stored {kind} of key {key} is encrypted under key id {key_id!r}, which "
                f"is not in this worker's key set ({', '.join(map(repr, self._ciphers))}): "
                f"refusing to replay it. Add that key to IDEMPOTENCY_ENCRYPTION_KEYS (a "
                f"rotation dropped it too early) or, if it was never yours, treat the record "
                f"as tampered{_ADVICE.format(key=key)}",
                key=key,
            )
        ns = stored_ns if namespace is None else namespace
        try:
            return cipher.decrypt(nonce, sealed, _aad(kind, ns, key or "", key_id))
        except _invalid_tag():
            raise CorruptRecordError(
                f"the stored {kind} of key {key} (key id {key_id!r}, namespace {ns!r}) does "
                "not authenticate: it was changed, copied from another record, or sealed "
                f"with another key under the same id; refusing to replay it"
                f"{_ADVICE.format(key=key)}",
                key=key,
            ) from None

    def plaintext_refused(self, kind: Kind, key: str | None) -> CorruptRecordError:
        """The error for a plaintext payload read while encryption is on."""
        return CorruptRecordError(
            f"the stored {kind} of key {key} is not encrypted, and this worker requires "
            "encrypted records: refusing to replay it. If encryption was turned on after it "
            "was written, pass ResultEncryption(..., accept_plaintext=True) (or "
            "IDEMPOTENCY_ENCRYPTION_ACCEPT_PLAINTEXT=true) until such records expired or "
            f"`langchain-idempotent rotate` sealed them{_ADVICE.format(key=key)}",
            key=key,
        )


_ADVICE = (
    "; the tool did not run. Inspect the record with `langchain-idempotent show {key}`; "
    "deleting it (`langchain-idempotent delete {key}`) lets the call run again"
)


def _check_key_id(key_id: object, *, where: str = "") -> None:
    if not isinstance(key_id, str) or not _KEY_ID.fullmatch(key_id):
        shown = repr(key_id)[:70] if isinstance(key_id, str) else type(key_id).__name__
        raise ValueError(f"{where}key id {shown} is not 1-64 characters of A-Z a-z 0-9 _ . -")


def _decode_key(encoded: str, where: str) -> bytes:
    padded = encoded + "=" * (-len(encoded) % 4)
    try:
        key = base64.urlsafe_b64decode(padded.encode("ascii"))
    except (binascii.Error, ValueError, UnicodeEncodeError):
        raise ValueError(f"{where} is not urlsafe base64") from None
    if base64.urlsafe_b64encode(key).rstrip(b"=") != padded.encode("ascii").rstrip(b"="):
        raise ValueError(f"{where} is not urlsafe base64") from None
    if len(key) != 32:
        raise ValueError(
            f"{where} decodes to {len(key)} bytes; AES-256-GCM takes exactly 32 "
            "(ResultEncryption.generate_key() makes one)"
        )
    return key


def _flag(env: Mapping[str, str], variable: str) -> bool:
    raw = env.get(variable)
    if raw is None:
        return False
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"{variable}={raw!r}: expected true or false")
