"""A billing endpoint on loopback that commits a charge and then fails to answer.

``POST /charges`` (``order``, ``amount``) commits a charge, then, on the first POST only,
meets its fault:

- ``"timeout"``: the answer comes after :data:`SLOW_S` seconds, past the client's read
  timeout (the client gives up; the charge stands);
- ``"reset"``: the connection is reset (``SO_LINGER`` 0, an RST) without a byte of answer;
- ``"502"``: a gateway answers ``502 Bad Gateway`` although the charge was committed.

Every later POST is answered normally. A server that ``honours_key`` acts like Stripe: a
POST whose ``Idempotency-Key`` it has seen is answered with the stored charge
(``Idempotent-Replayed: true``) and charges nothing. ``GET /charges?order=O`` answers the
charge made for an order (``404`` if none): what a ``reconcile=`` hook asks.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Literal

__all__ = ["FAULTS", "SLOW_S", "BillingServer", "Fault"]

Fault = Literal["timeout", "reset", "502"]
FAULTS: tuple[Fault, ...] = ("timeout", "reset", "502")
#: How long the ``timeout`` fault holds the answer (the client's read timeout is shorter).
SLOW_S = 0.6


class BillingServer:
    """``with BillingServer("reset", honours_key=True) as s: httpx.post(s.url + ...)``."""

    def __init__(self, fault: Fault, *, honours_key: bool) -> None:
        if fault not in FAULTS:
            raise ValueError(f"fault must be one of {FAULTS}, got {fault!r}")
        self.fault, self.honours_key = fault, honours_key
        #: Every committed charge, in order: the money that moved.
        self.charges: list[dict[str, Any]] = []
        #: Every ``POST /charges`` that reached the server (charged or answered by key).
        self.posts = 0
        self.lookups = 0
        self._by_key: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._http = _Server(self)
        self._thread = threading.Thread(target=self._http.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        host, port = self._http.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> BillingServer:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._http.shutdown()
        self._http.server_close()
        self._thread.join(timeout=5)

    def post(self, body: dict[str, Any], key: str | None) -> tuple[dict[str, Any], bool, bool]:
        """Commit (or replay) one charge: ``(charge, replayed, faulty)``, ``faulty`` for the
        first POST (whose answer meets the fault)."""
        with self._lock:
            self.posts += 1
            first = self.posts == 1
            if self.honours_key and key is not None and key in self._by_key:
                return self._by_key[key], True, first
            charge = {
                "id": f"ch_{len(self.charges) + 1}",
                "order": str(body.get("order")),
                "amount": int(body.get("amount", 0)),
            }
            self.charges.append(charge)
            if key is not None:
                self._by_key[key] = charge
            return charge, False, first

    def find(self, order: str) -> dict[str, Any] | None:
        with self._lock:
            self.lookups += 1
            return next((c for c in self.charges if c["order"] == order), None)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, billing: BillingServer) -> None:
        self.billing = billing
        super().__init__(("127.0.0.1", 0), _Handler)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _send(self, status: int, body: dict[str, Any], replayed: bool = False) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if replayed:
            self.send_header("Idempotent-Replayed", "true")
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        path, _, query = self.path.partition("?")
        order = urllib.parse.parse_qs(query).get("order", [""])[0]
        found = self.server.billing.find(order) if path == "/charges" and order else None
        if found is None:
            self._send(404, {"error": "no charge for this order"})
        else:
            self._send(200, found)

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        billing = self.server.billing
        key = self.headers.get("Idempotency-Key")
        body, replayed, faulty = billing.post(json.loads(raw or b"{}"), key)
        if not faulty:
            self._send(200, body, replayed)
        elif billing.fault == "timeout":
            time.sleep(SLOW_S)  # the client stopped reading; the charge is committed
            with contextlib.suppress(OSError):
                self._send(200, body)
        elif billing.fault == "reset":
            self.close_connection = True
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()  # an RST, not a byte of answer
        else:
            self._send(502, {"error": "502 Bad Gateway"})

    def finish(self) -> None:
        with contextlib.suppress(OSError, ValueError):  # a reset connection has no file
            super().finish()
