"""``SqliteIdempotencyStore``: one file, durable, shared by the processes of one host.

The store and its spec are in :mod:`._store`. The other modules are its parts, each
readable on its own: :mod:`._schema` (the table, its layout version, a row as a
record), :mod:`._connections` (the connection pool, WAL, ``fork()``) and
:mod:`._describe` (what the file says about itself, for ``doctor``).
"""

# The schema version, the ``synchronous`` type and the WAL switch stay importable from
# here, as when the store was one module.
from ._connections import switch_to_wal as switch_to_wal
from ._schema import SCHEMA_VERSION as SCHEMA_VERSION
from ._store import SqliteIdempotencyStore
from ._store import Synchronous as Synchronous

__all__ = ["SqliteIdempotencyStore"]
