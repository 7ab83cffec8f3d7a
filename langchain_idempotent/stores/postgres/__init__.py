"""``PostgresIdempotencyStore``: many hosts, one PostgreSQL — and exactly-once for its writes.

The store and its spec are in :mod:`._store`. The other modules are its parts, each
readable on its own: :mod:`._sql` (the schema, the PL/pgSQL functions and every statement:
the wire contract), :mod:`._ops` (each operation described once: its statements,
parameters and decoding, for the sync and the async runner), :mod:`._listen`
(``LISTEN``/``NOTIFY`` wake-ups), :mod:`._pools` (pools and error translation),
:mod:`._transaction` (transactional mode) and :mod:`._describe` (what the server says
about itself, for ``doctor``).
"""

from ._store import PostgresIdempotencyStore
from ._transaction import AsyncPostgresTransaction, PostgresTransaction

__all__ = ["AsyncPostgresTransaction", "PostgresIdempotencyStore", "PostgresTransaction"]
