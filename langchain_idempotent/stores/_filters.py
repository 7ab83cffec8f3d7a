"""The operator's record filters (``namespace``, ``thread_id``) as SQL, for the stores
that keep both as columns (SQLite, PostgreSQL)."""

from __future__ import annotations

__all__ = ["meta_filter"]


def meta_filter(
    namespace: str | None, thread_id: str | None, placeholder: str
) -> tuple[str, list[str]]:
    """``" AND namespace = ? AND thread_id = ?"`` for the filters given (``None``: not
    filtered), with the driver's ``placeholder`` (``?``, ``%s``), and their parameters in
    the same order."""
    where, params = "", []
    for column, value in (("namespace", namespace), ("thread_id", thread_id)):
        if value is not None:
            where += f" AND {column} = {placeholder}"
            params.append(value)
    return where, params
