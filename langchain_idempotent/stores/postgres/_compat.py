"""Every private psycopg_pool attribute the PostgreSQL store reads, in one place (as
``langchain_idempotent.adapters._compat`` does for LangChain and LangGraph), with a test in
``tests/test_compat.py`` that fails by name when a release moves it.

============================================  ==============================================
touch                                         why
============================================  ==============================================
``AsyncConnectionPool._pool`` (its deque of   the store closes an ending loop's idle
idle connections)                             connections itself, since ``close()``
                                              cancelled with the loop stops before it does
                                              (:func:`idle_connections`; see ``_pools``)
============================================  ==============================================

Supported range: the psycopg-pool that ``psycopg[pool]>=3.2`` brings (the ``postgres`` extra).
"""

from __future__ import annotations

from typing import Any

__all__ = ["idle_connections"]


def idle_connections(pool: Any) -> list[Any]:
    """The idle connections of a psycopg_pool pool (its private ``_pool`` deque), or none."""
    return list(getattr(pool, "_pool", ()))
