"""What a tool read while it ran, and the key of a call whose reads differ.

A tool is handed *reading views* of what it may read beyond its arguments (the graph
state, the run's config and its ``configurable``: :mod:`..adapters._reads`). Each value it
reads is noted as a path (``state.customer_id``, ``configurable.user_id``,
``config.recursion_limit``) and the digest of its RFC 8785 form (:class:`Reads`). The
read set is stored with the answer (:func:`answered`); a later call with the same key
compares the current values of those paths:

* equal: the stored answer is this call's (a retry, a resumed thread, a second worker);
* different: this call is another effect, under :func:`reads_key` ``(key, current read
  digests)``: a key made deterministically from the stored key and the values this call
  would have read, so every retry of it derives the same one, and two calls that differ
  in a value the tool read never share an answer.

A value with no canonical form (a client object) is refused at the read, naming its path
and ``key_exclude=``: before the tool can act on it. Paths in ``key_exclude`` (a path, or
its first part for all of it: ``"state.client"``, ``"configurable"``) are not noted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from contextvars import ContextVar
from typing import Any

from ..errors import IdempotencyError, InvalidArgumentsError
from .canonical import canonical_json
from .keys import digest

__all__ = [
    "ABSENT",
    "READS_FIELD",
    "InjectedInputError",
    "ReadingDict",
    "Reads",
    "ReadsDivergedError",
    "answered",
    "current_reads",
    "opened",
    "reads_key",
    "recording",
    "value_digest",
]

#: The digest of a path that has no value (a missing key): reading "is it there?" is a read.
ABSENT = "-"
#: The field of a stored answer that holds its read set (``{READS_FIELD: {...}, "value": ...}``).
READS_FIELD = "__idempotency_reads__"
#: How many times a call may find a stored answer whose reads differ from its own before
#: it gives up (each time under a key made from the reads: see :func:`reads_key`).
MAX_DIVERGENCES = 8


class InjectedInputError(InvalidArgumentsError):
    """An input the model does not send (an injected value, a state field the tool read,
    the run's context) has no canonical form: the application's to fix, never the model's."""


class ReadsDivergedError(IdempotencyError):
    """A call kept finding stored answers whose reads differ from its own."""


def value_digest(value: Any) -> str:
    """The digest of ``value``'s RFC 8785 form (raises :class:`InvalidArgumentsError`)."""
    return digest(canonical_json(value))[:32]


class Reads:
    """The reads of one run of a tool: path → digest of the value read (the first read of
    a path counts), minus the excluded paths."""

    __slots__ = ("exclude", "seen", "tool")

    def __init__(self, tool: str, exclude: Iterable[str] = ()) -> None:
        self.tool = tool
        self.exclude = frozenset(exclude)
        self.seen: dict[str, str] = {}

    def excluded(self, path: str) -> bool:
        root = path.split(".", 1)[0]
        return path in self.exclude or root in self.exclude

    def note(self, path: str, value: Any, present: bool = True) -> None:
        """Note that the tool read ``value`` at ``path`` (``present=False``: no value)."""
        if path in self.seen or self.excluded(path):
            return
        if not present:
            self.seen[path] = ABSENT
            return
        try:
            self.seen[path] = value_digest(value)
        except InvalidArgumentsError as exc:
            raise InjectedInputError(
                f"tool {self.tool!r} read {path} ({type(value).__name__}), which has no "
                f"canonical JSON form ({exc}), so it cannot be part of the idempotency key: "
                "a memoized answer could be replayed to a call that read another value. Keep "
                f"data (ids, not handles) there, or pass key_exclude=[{path!r}] if the "
                "effect does not depend on it"
            ) from exc


_recording: ContextVar[Reads | None] = ContextVar("langchain_idempotent_reads", default=None)


class recording:
    """While a memoized call's tool runs: the views it is handed note into ``reads``. (A
    plain class: entered on every call, where a generator-based context manager costs
    more.)"""

    __slots__ = ("_reads", "_token")

    def __init__(self, reads: Reads) -> None:
        self._reads = reads

    def __enter__(self) -> Reads:
        self._token = _recording.set(self._reads)
        return self._reads

    def __exit__(self, *exc: object) -> None:
        _recording.reset(self._token)


def current_reads() -> Reads | None:
    """The read set of the memoized call whose tool runs now, if any."""
    return _recording.get()


class ReadingDict(dict[Any, Any]):
    """A ``dict`` that notes the keys read from it as ``<prefix>.<key>`` (the value read as
    a whole). Writes go through to the mapping it was made from; ``copy()`` (what
    LangChain's ``ensure_config`` does to ``configurable``) keeps noting into the same
    read set. ``skip`` keys are handed out without a note (the framework's own knobs;
    a nested view); ``alias`` notes a key as another (an object by its id).
    ``whole=False``: iterating over the items notes nothing (the top of a config, which
    LangChain copies item by item on every ``ensure_config``)."""

    __slots__ = ("_alias", "_origin", "_prefix", "_reads", "_skip", "_whole")

    def __init__(
        self,
        origin: Mapping[Any, Any],
        reads: Reads,
        prefix: str,
        *,
        skip: Any = frozenset(),
        alias: Mapping[str, str] | None = None,
        values: Mapping[Any, Any] | None = None,
        whole: bool = True,
    ) -> None:
        dict.__init__(self, origin if values is None else values)
        self._origin = origin
        self._reads = reads
        self._prefix = prefix
        self._skip = skip
        self._alias = alias or {}
        self._whole = whole

    def _note(self, key: Any) -> None:
        if not isinstance(key, str) or _skipped(self._skip, key):
            return
        key = self._alias.get(key, key)
        present = dict.__contains__(self, key)
        value = dict.__getitem__(self, key) if present else None
        self._reads.note(f"{self._prefix}.{key}", value, present)

    def __getitem__(self, key: Any) -> Any:
        self._note(key)
        return dict.__getitem__(self, key)

    def get(self, key: Any, default: Any = None) -> Any:
        self._note(key)
        return dict.get(self, key, default)

    def __contains__(self, key: object) -> bool:
        self._note(key)
        return dict.__contains__(self, key)

    def items(self) -> Any:
        self._note_all()
        return dict.items(self)

    def values(self) -> Any:
        self._note_all()
        return dict.values(self)

    def _note_all(self) -> None:
        if not self._whole:
            return
        for key in dict.keys(self):
            self._note(key)

    def __setitem__(self, key: Any, value: Any) -> None:
        dict.__setitem__(self, key, value)
        if isinstance(self._origin, dict) and self._origin is not self:
            self._origin[key] = value

    def __delitem__(self, key: Any) -> None:
        dict.__delitem__(self, key)
        if isinstance(self._origin, dict) and key in self._origin:
            del self._origin[key]

    def copy(self) -> ReadingDict:
        return ReadingDict(
            dict(self),
            self._reads,
            self._prefix,
            skip=self._skip,
            alias=self._alias,
            whole=self._whole,
        )

    def __copy__(self) -> ReadingDict:
        return self.copy()

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[Any, Any]:
        import copy

        self._note_all()  # a deep copy reads everything
        return copy.deepcopy(dict(self), memo)

    def __reduce__(self) -> Any:
        self._note_all()
        return (dict, (dict(self),))


def _skipped(skip: Any, key: str) -> bool:
    return bool(skip(key)) if callable(skip) else key in skip


def answered(value: Any, reads: Reads | None) -> Any:
    """The answer as it is stored: with its read set when the tool read anything."""
    if reads is None or not reads.seen:
        return value
    return {READS_FIELD: dict(reads.seen), "value": value}


def opened(stored: Any) -> tuple[Any, Mapping[str, str]]:
    """A stored answer and its read set (none for an answer stored without reads)."""
    if isinstance(stored, dict) and READS_FIELD in stored and len(stored) == 2:
        reads = stored[READS_FIELD]
        if isinstance(reads, dict) and "value" in stored:
            return stored["value"], reads
    return stored, {}


def reads_key(key: str, current: Mapping[str, str]) -> str:
    """The key of a call whose reads differ from the answer stored under ``key``: made
    from ``key`` and the digests of what this call reads at the stored answer's paths."""
    pairs = sorted(current.items())
    return digest("reads", key, canonical_json(pairs))
