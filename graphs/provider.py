"""A payment provider on loopback: refunds, notifications and a durable SQLite ledger.

It behaves like Stripe where the demo needs it to:

- ``POST /refunds`` (``invoice_id``, ``amount_cents``, ``currency``, ``reason``) credits the
  customer and answers ``200`` with the refund. Refunds are not capped at the invoice
  amount (think account credit or payouts), so a duplicate is real money.
- ``POST /notifications`` (``customer_id``, ``ticket_id``, ``message``) sends a message.
- ``GET /invoices/<id>``, ``GET /ledger`` (every refund and notification), ``GET /stats``.
- ``GET /refunds?idempotency_key=K`` (and ``GET /notifications?idempotency_key=K``): the
  response stored for the POST that carried ``Idempotency-Key: K``, or ``404`` if none was
  committed. A caller whose POST's outcome is unknown (its worker died after sending it)
  asks this instead of sending it again: the demo's ``reconcile=`` hooks do.

**Idempotency-Key.** A POST carrying ``Idempotency-Key`` is executed at most once per key:
the response is stored in the same transaction as the effect, and a later request with the
same key and the same parameters gets the stored response back (status, body, and the
header ``Idempotent-Replayed: true``); the same key with other parameters or on another
endpoint is refused with ``422``. If the request also carries ``Idempotency-Fence`` (an
integer), the ledger remembers the highest fence seen per key and refuses a lower one with
``409``: a stale owner whose lease was taken over cannot act (or replay) any more.

**Faults** (seeded, see :class:`ProviderFaults`), decided per POST from the seed, the
endpoint, the invoice or ticket, and how many POSTs for it came before — so the n-th
refund request for an invoice meets the same fault in every run with that seed:

- ``502`` before anything is done (a gateway in front of the provider failed);
- the connection dropped *after* the effect is committed: no response at all;
- added latency.

Each fault that fires is counted (:meth:`PaymentProvider.stats`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import socket
import sqlite3
import sys
import threading
import time
import urllib.parse
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any

from .faults import chance

__all__ = ["Invoice", "Ledger", "PaymentProvider", "ProviderFaults"]

JsonObject = dict[str, Any]
_Execute = Callable[[sqlite3.Connection, str | None], "_Answer"]


@dataclass(frozen=True, slots=True)
class Invoice:
    invoice_id: str
    customer_id: str
    amount_cents: int
    currency: str = "usd"


@dataclass(frozen=True, slots=True)
class ProviderFaults:
    """Per-POST fault probabilities; ``error_502 + drop_after_commit <= 1``."""

    seed: int = 0
    error_502: float = 0.0
    drop_after_commit: float = 0.0
    latency: float = 0.0
    latency_s: float = 0.0


@dataclass(frozen=True, slots=True)
class _Answer:
    status: int
    body: JsonObject
    replayed: bool = False


_SCHEMA = """
PRAGMA journal_mode=WAL;
PRAGMA synchronous=NORMAL;
CREATE TABLE IF NOT EXISTS invoices (
    invoice_id TEXT PRIMARY KEY, customer_id TEXT NOT NULL,
    amount_cents INTEGER NOT NULL, currency TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS refunds (
    refund_id TEXT PRIMARY KEY, invoice_id TEXT NOT NULL, customer_id TEXT NOT NULL,
    amount_cents INTEGER NOT NULL, currency TEXT NOT NULL, reason TEXT NOT NULL,
    idempotency_key TEXT, created_at REAL NOT NULL,
    response_lost INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS notifications (
    notification_id TEXT PRIMARY KEY, customer_id TEXT NOT NULL, ticket_id TEXT NOT NULL,
    message TEXT NOT NULL, idempotency_key TEXT, created_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS idempotency_keys (
    key TEXT PRIMARY KEY, endpoint TEXT NOT NULL, params_hash TEXT NOT NULL,
    status INTEGER NOT NULL, body TEXT NOT NULL, created_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS fences (key TEXT PRIMARY KEY, max_fence INTEGER NOT NULL);
"""


def _params_hash(params: JsonObject) -> str:
    return hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()


def _error(status: int, kind: str, message: str) -> _Answer:
    return _Answer(status, {"error": {"type": kind, "message": message}})


class Ledger:
    """The provider's durable state: one SQLite file, one writer at a time (WAL with
    synchronous=NORMAL: every commit survives a process crash; the demo never cuts power)."""

    def __init__(self, path: str | Path) -> None:
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._conn.row_factory = sqlite3.Row
        self._conn.executescript(_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def add_invoices(self, invoices: Iterable[Invoice]) -> None:
        rows = [(i.invoice_id, i.customer_id, i.amount_cents, i.currency) for i in invoices]
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            self._conn.executemany("INSERT OR REPLACE INTO invoices VALUES (?, ?, ?, ?)", rows)
            self._conn.execute("COMMIT")

    def mark_response_lost(self, refund_id: str) -> None:
        """Note that the caller never got this refund's response (for the report only)."""
        with self._lock:
            self._conn.execute(
                "UPDATE refunds SET response_lost = 1 WHERE refund_id = ?", (refund_id,)
            )

    def duplicate_refunds(self) -> int:
        """Refunds beyond the first for their invoice, so far."""
        with self._lock:
            row = self._conn.execute(
                "SELECT COUNT(*) - COUNT(DISTINCT invoice_id) FROM refunds"
            ).fetchone()
        return int(row[0])

    def invoice(self, invoice_id: str) -> JsonObject | None:
        with self._lock:
            row = self._conn.execute(
                "SELECT * FROM invoices WHERE invoice_id = ?", (invoice_id,)
            ).fetchone()
        return None if row is None else dict(row)

    def response_for(self, endpoint: str, key: str) -> JsonObject | None:
        """The body of the successful response stored for ``key`` on ``endpoint``, if any."""
        with self._lock:
            row = self._conn.execute(
                "SELECT body FROM idempotency_keys WHERE key = ? AND endpoint = ? AND status = 200",
                (key, endpoint),
            ).fetchone()
        return None if row is None else dict(json.loads(row["body"]))

    def refunds(self) -> list[JsonObject]:
        with self._lock:
            rows = self._conn.execute("SELECT * FROM refunds ORDER BY created_at").fetchall()
        return [dict(r) for r in rows]

    def notifications(self) -> list[JsonObject]:
        with self._lock:
            rows = self._conn.execute("SELECT * FROM notifications ORDER BY created_at").fetchall()
        return [dict(r) for r in rows]

    def post(
        self,
        endpoint: str,
        params: JsonObject,
        key: str | None,
        fence: int | None,
        execute: _Execute,
    ) -> _Answer:
        """Run ``execute`` at most once per ``key``; replay, 409 or 422 otherwise."""
        digest = _params_hash(params)
        with self._lock:
            conn = self._conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                answer = self._post_locked(conn, endpoint, digest, key, fence, execute)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        return answer

    @staticmethod
    def _post_locked(
        conn: sqlite3.Connection,
        endpoint: str,
        digest: str,
        key: str | None,
        fence: int | None,
        execute: _Execute,
    ) -> _Answer:
        if key is not None and fence is not None:
            row = conn.execute("SELECT max_fence FROM fences WHERE key = ?", (key,)).fetchone()
            if row is not None and fence < row["max_fence"]:
                return _error(
                    409,
                    "stale_fence",
                    f"fence {fence} is lower than {row['max_fence']} already seen for this key",
                )
            conn.execute(
                "INSERT INTO fences VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET "
                "max_fence = max(max_fence, excluded.max_fence)",
                (key, fence),
            )
        if key is not None:
            row = conn.execute(
                "SELECT endpoint, params_hash, status, body FROM idempotency_keys WHERE key = ?",
                (key,),
            ).fetchone()
            if row is not None:
                if row["endpoint"] != endpoint or row["params_hash"] != digest:
                    return _error(
                        422,
                        "idempotency_error",
                        "Keys for idempotent requests can only be used with the same "
                        "parameters they were first used with.",
                    )
                return _Answer(row["status"], json.loads(row["body"]), replayed=True)
        answer = execute(conn, key)
        if key is not None:
            conn.execute(
                "INSERT INTO idempotency_keys VALUES (?, ?, ?, ?, ?, ?)",
                (key, endpoint, digest, answer.status, json.dumps(answer.body), time.time()),
            )
        return answer


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, provider: PaymentProvider, address: tuple[str, int]) -> None:
        self.provider = provider
        self.open_sockets: set[socket.socket] = set()
        self.sockets_lock = threading.Lock()
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.sockets_lock:
            self.open_sockets.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self.sockets_lock:
            self.open_sockets.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that went away mid-reply (a worker the batch killed, a dropped
        # connection) is part of the demo: no traceback for it; anything else is printed.
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)

    def drop_all_connections(self) -> None:
        with self.sockets_lock:
            sockets = list(self.open_sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms stalls
    timeout = 30  # idle keep-alive connections are closed after this many seconds
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet: no stderr per request
        return

    def _send(self, answer: _Answer) -> None:
        data = json.dumps(answer.body).encode()
        self.send_response(answer.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if answer.replayed:
            self.send_header("Idempotent-Replayed", "true")
        self.end_headers()
        self.wfile.write(data)

    def _drop(self) -> None:
        """Close the connection without a byte of response."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def do_GET(self) -> None:
        self._send(self.server.provider.handle_get(self.path))

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
            fence_header = self.headers.get("Idempotency-Fence")
            fence = None if fence_header is None else int(fence_header)
        except ValueError:
            self._send(_error(400, "invalid_request_error", "body must be JSON, fence an int"))
            return
        if not isinstance(body, dict):
            self._send(_error(400, "invalid_request_error", "body must be a JSON object"))
            return
        key = self.headers.get("Idempotency-Key") or None
        answer = self.server.provider.handle_post(self.path, body, key, fence)
        if answer is None:
            self._drop()
        else:
            self._send(answer)


class PaymentProvider:
    """The provider as a context manager: ``with PaymentProvider(db) as p: p.url``.

    Serves on ``host`` (loopback) and a free port, in a background thread of this process.
    """

    def __init__(
        self,
        db_path: str | Path,
        *,
        invoices: Iterable[Invoice] = (),
        faults: ProviderFaults | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.faults = faults or ProviderFaults()
        if self.faults.error_502 + self.faults.drop_after_commit > 1.0:
            raise ValueError("error_502 + drop_after_commit must not exceed 1")
        self.ledger = Ledger(db_path)
        self.ledger.add_invoices(invoices)
        self._address = (host, port)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._counts: Counter[str] = Counter()
        self._seen: Counter[tuple[str, str]] = Counter()
        self._counts_lock = threading.Lock()

    # -- lifecycle -------------------------------------------------------------------

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the provider is not running")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> PaymentProvider:
        if self._server is not None:
            return self
        self._server = _Server(self, self._address)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="payment-provider",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        server.shutdown()
        server.drop_all_connections()
        server.server_close()
        thread.join(timeout=5)
        self._server = self._thread = None
        self.ledger.close()

    def __enter__(self) -> PaymentProvider:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- observations ----------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        """Counts of faults fired (``error_502``, ``drop_after_commit``, ``latency``), of
        idempotency answers (``replayed``, ``key_reused_422``, ``stale_fence_409``) and of
        look-ups by key (``lookup``)."""
        with self._counts_lock:
            return dict(self._counts)

    def _count(self, name: str) -> None:
        with self._counts_lock:
            self._counts[name] += 1

    # -- request handling (called from the server's threads) ---------------------------

    def handle_get(self, path: str) -> _Answer:
        path, _, query = path.partition("?")
        if path in ("/refunds", "/notifications"):
            return self._find_by_key(path, urllib.parse.parse_qs(query))
        if path.startswith("/invoices/"):
            invoice = self.ledger.invoice(path.removeprefix("/invoices/"))
            if invoice is None:
                return _error(404, "invalid_request_error", "no such invoice")
            return _Answer(200, invoice)
        if path == "/ledger":
            return _Answer(
                200,
                {"refunds": self.ledger.refunds(), "notifications": self.ledger.notifications()},
            )
        if path == "/stats":
            return _Answer(200, dict(self.stats()))
        return _error(404, "invalid_request_error", f"unknown path {path}")

    def _find_by_key(self, endpoint: str, query: dict[str, list[str]]) -> _Answer:
        keys = query.get("idempotency_key", [])
        if len(keys) != 1 or not keys[0]:
            return _error(400, "invalid_request_error", "give one idempotency_key=...")
        self._count("lookup")
        found = self.ledger.response_for(endpoint, keys[0])
        if found is None:
            return _error(404, "resource_missing", "nothing was committed with this key")
        return _Answer(200, found)

    def handle_post(
        self, path: str, body: JsonObject, key: str | None, fence: int | None
    ) -> _Answer | None:
        """The answer to send, or ``None`` to drop the connection without one."""
        if path == "/refunds":
            endpoint_subject = "invoice_id"
            execute = self._refund(body)
        elif path == "/notifications":
            endpoint_subject = "ticket_id"
            execute = self._notification(body)
        else:
            return _error(404, "invalid_request_error", f"unknown path {path}")
        if isinstance(execute, _Answer):  # a validation error: nothing to fault or store
            return execute
        subject = str(body.get(endpoint_subject))
        with self._counts_lock:
            self._seen[(path, subject)] += 1
            occurrence = self._seen[(path, subject)]
        f = self.faults
        roll = chance(f.seed, "provider", path, subject, occurrence)
        if roll < f.error_502:
            self._count("error_502")
            return _error(502, "api_error", "502 Bad Gateway")
        if f.latency and chance(f.seed, "latency", path, subject, occurrence) < f.latency:
            self._count("latency")
            time.sleep(f.latency_s)
        answer = self.ledger.post(path, body, key, fence, execute)
        if answer.replayed:
            self._count("replayed")
        elif answer.status == 422:
            self._count("key_reused_422")
        elif answer.status == 409:
            self._count("stale_fence_409")
        if roll < f.error_502 + f.drop_after_commit:
            self._count("drop_after_commit")
            if path == "/refunds" and answer.status == 200 and not answer.replayed:
                self.ledger.mark_response_lost(answer.body["id"])
            return None
        return answer

    def _refund(self, body: JsonObject) -> _Execute | _Answer:
        invoice_id, amount = body.get("invoice_id"), body.get("amount_cents")
        reason = body.get("reason", "")
        if not isinstance(invoice_id, str) or not isinstance(reason, str):
            return _error(400, "invalid_request_error", "invoice_id and reason must be strings")
        if isinstance(amount, bool) or not isinstance(amount, int) or amount <= 0:
            return _error(400, "invalid_request_error", "amount_cents must be a positive int")
        invoice = self.ledger.invoice(invoice_id)
        if invoice is None:
            return _error(404, "invalid_request_error", f"no such invoice: {invoice_id}")
        currency = str(body.get("currency", invoice["currency"]))

        def execute(conn: sqlite3.Connection, key: str | None) -> _Answer:
            refund_id = "re_" + uuid.uuid4().hex[:24]
            now = time.time()
            conn.execute(
                "INSERT INTO refunds VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (refund_id, invoice_id, invoice["customer_id"], amount, currency, reason,
                 key, now, 0),
            )  # fmt: skip
            return _Answer(
                200,
                {
                    "id": refund_id,
                    "object": "refund",
                    "invoice": invoice_id,
                    "customer": invoice["customer_id"],
                    "amount": amount,
                    "currency": currency,
                    "status": "succeeded",
                    "created": now,
                },
            )

        return execute

    def _notification(self, body: JsonObject) -> _Execute | _Answer:
        customer_id, ticket_id = body.get("customer_id"), body.get("ticket_id")
        message = body.get("message")
        if not all(isinstance(v, str) and v for v in (customer_id, ticket_id, message)):
            return _error(
                400, "invalid_request_error", "customer_id, ticket_id, message are required"
            )

        def execute(conn: sqlite3.Connection, key: str | None) -> _Answer:
            notification_id = "ntf_" + uuid.uuid4().hex[:24]
            now = time.time()
            conn.execute(
                "INSERT INTO notifications VALUES (?, ?, ?, ?, ?, ?)",
                (notification_id, customer_id, ticket_id, message, key, now),
            )
            return _Answer(
                200,
                {
                    "id": notification_id,
                    "object": "notification",
                    "customer": customer_id,
                    "ticket": ticket_id,
                    "status": "sent",
                },
            )

        return execute


# -- python -m graphs.provider ---------------------------------------------------------------

#: The invoice of the README's Agent Server walkthrough (ticket T-9001: refund $140).
WALKTHROUGH_INVOICE = Invoice("INV-7001", "C-501", 14000)


def main(argv: Sequence[str] | None = None) -> None:
    """Serve the provider until interrupted: ``python -m graphs.provider --port 8700``."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m graphs.provider",
        description="The demo's payment provider on loopback, holding invoice INV-7001 "
        "(customer C-501, $140) for the Agent Server walkthrough.",
    )
    parser.add_argument("--port", type=int, default=8700, help="port on 127.0.0.1 (0: any)")
    parser.add_argument("--ledger", default="provider.db", help="its SQLite ledger file")
    args = parser.parse_args(argv)
    provider = PaymentProvider(args.ledger, invoices=[WALKTHROUGH_INVOICE], port=args.port)
    with provider:
        print(f"payment provider on {provider.url} (ledger {args.ledger}); Ctrl-C stops it")
        print(f"export REFUND_PROVIDER_URL={provider.url}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()


if __name__ == "__main__":
    main()
