"""Errors raised by langchain-idempotent.

Every error carries the idempotency ``key`` it is about (``None`` only where no key
could be derived) and says what to do next::

    IdempotencyError
    ├── InProgressError          another caller holds the lease and the wait timed out
    ├── PayloadMismatchError     the key was reused with different arguments
    ├── LeaseLostError           the lease expired or was taken over while the tool ran
    ├── StoreUnavailableError    the store could not be reached (fail closed)
    ├── MissingScopeError        no thread id / scope to derive a key from
    │   └── GraphMissingScopeError   the same inside a graph, re-raised past ToolNode's error
    │                                handling (``_compat``; also a ``GraphBubbleUp``)
    ├── OutcomeUnknownError      an expired lease left no result; an operator must resolve it
    ├── InvalidArgumentsError    the arguments cannot be canonicalised (NaN, not JSON-able, ...)
    ├── UnstorableResultError    the tool ran but its result would not replay as itself
    │   └── ResultTooLargeError  the result exceeds ``max_result_bytes``
    ├── CorruptRecordError       a stored record cannot be decoded (never executed)
    ├── SideEffectMisuseError    ``side_effect()`` outside a call, nested, in a read tool, or in
    │                            a tool without ``boundary=True``
    ├── NotInGraphError          approval asked outside a LangGraph graph run (``_asking``)
    └── RemoteRunError           a remote agent's run ended without success (``remote``)

The last three are for code that uses those features, and live outside the package face:
``from langchain_idempotent.errors import SideEffectMisuseError``,
``langchain_idempotent.adapters.approval.NotInGraphError`` and
``langchain_idempotent.integrations.remote.RemoteRunError``.

Expected "no" answers of the store protocol (busy, mismatch, replay) are return values
inside the engine; these exceptions reach the caller only when the engine gives up.
"""

from __future__ import annotations

__all__ = [
    "CorruptRecordError",
    "IdempotencyError",
    "InProgressError",
    "InvalidArgumentsError",
    "LeaseLostError",
    "MissingScopeError",
    "OutcomeUnknownError",
    "PayloadMismatchError",
    "ResultTooLargeError",
    "SideEffectMisuseError",
    "StoreUnavailableError",
    "UnstorableResultError",
]


class IdempotencyError(Exception):
    """Base class of every error this library raises. ``key`` names the record."""

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key

    def __reduce__(self) -> tuple[object, ...]:  # keep the key across processes
        return (_rebuild, (type(self), str(self), self.key))


def _rebuild(cls: type[IdempotencyError], message: str, key: str | None) -> IdempotencyError:
    err = cls.__new__(cls)
    IdempotencyError.__init__(err, message, key=key)
    return err


class InProgressError(IdempotencyError):
    """Another caller holds a live lease on this key and did not finish within the wait."""


class PayloadMismatchError(IdempotencyError, ValueError):
    """The same key was used before with different arguments (HTTP 422 in the IETF draft)."""


class LeaseLostError(IdempotencyError):
    """This caller's lease expired or was taken over before it could finish."""


class StoreUnavailableError(IdempotencyError):
    """The idempotency store could not be reached; the tool was not run (fail closed)."""


class MissingScopeError(IdempotencyError):
    """No thread id or explicit scope was found to derive an idempotency key from."""


class OutcomeUnknownError(IdempotencyError):
    """A previous run's lease expired without a result: its side effect may have happened.

    Raised under ``on_expired="raise"``. Resolve the record with
    ``langchain-idempotent resolve KEY`` (store the real result, or free the key to re-run).
    """


class InvalidArgumentsError(IdempotencyError, ValueError):
    """The tool arguments cannot be put in canonical form (NaN, infinity, not JSON-able)."""


class UnstorableResultError(IdempotencyError, ValueError):
    """The tool ran, but its result cannot be stored so that it replays as itself.

    The result is refused at write time (a type outside ``allowed_types``, an object the
    serializer cannot encode, or more than ``max_result_bytes``) and this error is stored
    in its place, so the effect is not repeated: the first caller and every retry with the
    same key get this error, with the same message, until the record expires (``ttl``) or
    is deleted with ``langchain-idempotent delete KEY``. Changing ``allowed_types`` or
    ``max_result_bytes`` alone does not clear it.
    """


class ResultTooLargeError(UnstorableResultError):
    """The serialized result is larger than ``max_result_bytes``; it was not stored."""


class CorruptRecordError(IdempotencyError):
    """A stored record could not be decoded; it was refused, never executed."""


class SideEffectMisuseError(IdempotencyError, RuntimeError):
    """``side_effect()`` was used where it cannot mark anything: outside an idempotent
    call, nested in another block of the same run, in an ``effect="read"`` tool, or in a
    tool that does not declare ``boundary=True``. A programming error; nothing ran."""
