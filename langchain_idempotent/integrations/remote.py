"""Remote agents as effects: one run on another Agent Server per idempotency key.

An agent on another LangGraph Agent Server is a side effect like a refund: a caller that
retries after a dropped connection must not start a second run of it. :func:`aidempotent_remote`
(async) and :func:`idempotent_remote` (sync) run assistant ``assistant_id`` through a
``langgraph_sdk`` client **once per key**:

1. the remote thread id is derived from the key (:func:`remote_thread_id`, a uuid5), so
   every retry of one call addresses the same thread;
2. the runs on that thread are listed: a finished run carrying the key is answered from
   (its thread's final values; no new run), a pending or running one is joined;
3. otherwise the run is created with ``if_not_exists="create"`` (the thread comes into
   being with the run) and ``multitask_strategy="reject"``; the key and a fingerprint of
   the input ride in the run's metadata. A ``409 Conflict`` means a duplicate created it
   first: that run is joined instead.

The key is, by default, the one of the enclosing :func:`~langchain_idempotent.idempotent`
tool call (:func:`~langchain_idempotent.get_idempotency_context`), so a wrapped tool whose
body calls a remote agent gets both guarantees: its result is memoized locally, and a retry
that never saw the remote answer (the connection dropped) joins the run it started. Outside
such a call, pass ``key=`` (stable across retries: e.g. thread id, node and ticket).

Not promised: a run that ended in ``error``, ``timeout`` or ``interrupted`` is not started
again (:class:`RemoteRunError` names its thread and run; resume or delete that thread to go
on); the remote server's retention decides how long a finished run can be answered from;
a remote agent's own tools are protected only by the remote side (wrap them there too).

Decisions (which run, what to do) are pure functions shared by both drivers
(:func:`plan_from_runs`), so the sync and async paths cannot drift.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ..core.canonical import canonical_json
from ..core.context import get_idempotency_context
from ..errors import IdempotencyError, MissingScopeError, PayloadMismatchError

if TYPE_CHECKING:
    from langgraph_sdk.client import LangGraphClient, SyncLangGraphClient
    from langgraph_sdk.schema import Run

__all__ = [
    "FINGERPRINT_METADATA",
    "KEY_METADATA",
    "RemoteRun",
    "RemoteRunError",
    "aidempotent_remote",
    "idempotent_remote",
    "plan_from_runs",
    "remote_thread_id",
]

#: Run metadata fields that carry the key and the input's fingerprint.
KEY_METADATA = "idempotency_key"
FINGERPRINT_METADATA = "idempotency_fingerprint"

#: The uuid5 namespace of remote thread ids (fixed: changing it changes every thread id).
THREAD_NAMESPACE = uuid.UUID("5b0f6d2e-2f4a-5c1e-9a57-6c2d1f1e7a10")

_ACTIVE = ("pending", "running")
#: How many runs of a remote thread are read to find the key's run (one, in practice).
_LIST_LIMIT = 100

Outcome = Literal["created", "joined", "finished"]


class RemoteRunError(IdempotencyError):
    """The remote run for this key ended without success (``error``, ``timeout`` or
    ``interrupted``); it is not started again. ``thread_id``, ``run_id`` and ``status``
    name it."""

    def __init__(
        self, message: str, *, key: str | None, thread_id: str, run_id: str, status: str
    ) -> None:
        super().__init__(message, key=key)
        self.thread_id, self.run_id, self.status = thread_id, run_id, status


@dataclass(frozen=True, slots=True)
class RemoteRun:
    """What :func:`aidempotent_remote` did for one key.

    ``values`` is the remote thread's final state (what ``runs.join`` / ``runs.wait``
    return). ``outcome``: ``"created"`` (this call started the run), ``"joined"`` (a run
    for the key was pending or running: this call waited for it) or ``"finished"`` (the
    run had already succeeded: answered from it, nothing ran).
    """

    key: str
    thread_id: str
    run_id: str
    outcome: Outcome
    values: Any


@dataclass(frozen=True, slots=True)
class _Plan:
    action: Literal["create", "join", "answer"]
    run_id: str | None = None


def remote_thread_id(key: str, assistant_id: str) -> str:
    """The remote thread of ``key`` for ``assistant_id``: a uuid5, the same on every retry
    (and on every caller that derives the same key), different per assistant."""
    if not key:
        raise ValueError("an idempotency key must be a non-empty string")
    return str(uuid.uuid5(THREAD_NAMESPACE, f"{assistant_id}\x00{key}"))


def fingerprint(assistant_id: str, input: Any) -> str:
    """sha256 of the assistant and the canonical (RFC 8785) input."""
    digest = hashlib.sha256(assistant_id.encode() + b"\x00" + canonical_json(input))
    return digest.hexdigest()


def plan_from_runs(runs: Sequence[Run], key: str, fp: str, thread_id: str) -> _Plan:
    """What to do, given the runs already on the key's thread (newest first).

    The newest run carrying ``key`` decides: succeeded → answer from it; pending or
    running → join it; failed → :class:`RemoteRunError`; none → create. A run carrying
    ``key`` with another fingerprint → :class:`PayloadMismatchError` (the key was reused
    for another input).
    """
    for run in runs:
        metadata = run.get("metadata") or {}
        if metadata.get(KEY_METADATA) != key:
            continue
        if metadata.get(FINGERPRINT_METADATA) not in (None, fp):
            raise PayloadMismatchError(
                f"remote run {run['run_id']} on thread {thread_id} was started for this key "
                "with another input; use another key for another input",
                key=key,
            )
        status = run["status"]
        if status == "success":
            return _Plan("answer", run["run_id"])
        if status in _ACTIVE:
            return _Plan("join", run["run_id"])
        raise _failed(run, key, thread_id)
    return _Plan("create")


def _active_run(runs: Sequence[Run], key: str, thread_id: str) -> str:
    """After a 409: the run that holds the thread (it must carry ``key``)."""
    for run in runs:
        if run["status"] in _ACTIVE:
            if (run.get("metadata") or {}).get(KEY_METADATA) != key:
                raise IdempotencyError(
                    f"remote thread {thread_id} is busy with run {run['run_id']}, which does "
                    "not carry this key: something else writes to the key's thread",
                    key=key,
                )
            return run["run_id"]
    raise IdempotencyError(
        f"remote thread {thread_id} refused a run (409) but has no pending or running run",
        key=key,
    )


def _key(key: str | None) -> str:
    if key is not None:
        if not key:
            raise ValueError("key= must be a non-empty string")
        return key
    ctx = get_idempotency_context()
    if ctx is None:
        raise MissingScopeError(
            "idempotent_remote needs a key: call it inside a tool wrapped with idempotent() "
            "(its key is used), or pass key=... (stable across retries of this call)"
        )
    return ctx.key


def _create_arguments(
    input: Any,
    config: Mapping[str, Any] | None,
    context: Mapping[str, Any] | None,
    metadata: Mapping[str, Any] | None,
    key: str,
    fp: str,
) -> dict[str, Any]:
    """``runs.create``'s keyword arguments: the thread comes with the run, a busy thread
    refuses it (409), and the key and fingerprint ride in the metadata."""
    arguments: dict[str, Any] = {
        "input": input,
        "metadata": {**dict(metadata or {}), KEY_METADATA: key, FINGERPRINT_METADATA: fp},
        "if_not_exists": "create",
        "multitask_strategy": "reject",
    }
    if config is not None:
        arguments["config"] = dict(config)
    if context is not None:
        arguments["context"] = dict(context)
    return arguments


def _check_finished(run: Run, key: str, thread_id: str) -> None:
    """After ``runs.join``: the run must have succeeded."""
    if run["status"] != "success":
        raise _failed(run, key, thread_id)


def _failed(run: Run, key: str, thread_id: str) -> RemoteRunError:
    return RemoteRunError(
        f"remote run {run['run_id']} on thread {thread_id} for this key ended with status "
        f"{run['status']!r}; it is not started again (resume or delete thread {thread_id})",
        key=key,
        thread_id=thread_id,
        run_id=run["run_id"],
        status=run["status"],
    )


def _is_conflict(exc: BaseException) -> bool:
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None) == 409


def _is_not_found(exc: BaseException) -> bool:
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None) == 404


async def aidempotent_remote(
    client: LangGraphClient,
    assistant_id: str,
    input: Any,
    *,
    key: str | None = None,
    config: Mapping[str, Any] | None = None,
    context: Mapping[str, Any] | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> RemoteRun:
    """Run ``assistant_id`` with ``input`` on ``client``'s server once per ``key``.

    ``key`` defaults to the enclosing idempotent tool call's key. ``config``, ``context``
    and ``metadata`` are passed to ``runs.create`` (the key and fingerprint are added to
    ``metadata``). Returns a :class:`RemoteRun`; raises :class:`RemoteRunError` when the
    key's run failed, :class:`PayloadMismatchError` when the key was used for another
    input, and the client's own errors (a dropped connection: retry — the retry joins).
    """
    key = _key(key)
    thread_id = remote_thread_id(key, assistant_id)
    fp = fingerprint(assistant_id, input)
    plan = plan_from_runs(await _alist(client, thread_id), key, fp, thread_id)
    outcome: Outcome = "finished" if plan.action == "answer" else "joined"
    run_id = plan.run_id
    if plan.action == "create":
        try:
            run = await client.runs.create(
                thread_id,
                assistant_id,
                **_create_arguments(input, config, context, metadata, key, fp),
            )
            run_id, outcome = run["run_id"], "created"
        except Exception as exc:
            if not _is_conflict(exc):
                raise
            run_id = _active_run(await _alist(client, thread_id), key, thread_id)
    assert run_id is not None
    values = await client.runs.join(thread_id, run_id)
    _check_finished(await client.runs.get(thread_id, run_id), key, thread_id)
    return RemoteRun(key, thread_id, run_id, outcome, values)


def idempotent_remote(
    client: SyncLangGraphClient,
    assistant_id: str,
    input: Any,
    *,
    key: str | None = None,
    config: Mapping[str, Any] | None = None,
    context: Mapping[str, Any] | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> RemoteRun:
    """The sync twin of :func:`aidempotent_remote` (a ``get_sync_client`` client)."""
    key = _key(key)
    thread_id = remote_thread_id(key, assistant_id)
    fp = fingerprint(assistant_id, input)
    plan = plan_from_runs(_list(client, thread_id), key, fp, thread_id)
    outcome: Outcome = "finished" if plan.action == "answer" else "joined"
    run_id = plan.run_id
    if plan.action == "create":
        try:
            run = client.runs.create(
                thread_id,
                assistant_id,
                **_create_arguments(input, config, context, metadata, key, fp),
            )
            run_id, outcome = run["run_id"], "created"
        except Exception as exc:
            if not _is_conflict(exc):
                raise
            run_id = _active_run(_list(client, thread_id), key, thread_id)
    assert run_id is not None
    values = client.runs.join(thread_id, run_id)
    _check_finished(client.runs.get(thread_id, run_id), key, thread_id)
    return RemoteRun(key, thread_id, run_id, outcome, values)


async def _alist(client: LangGraphClient, thread_id: str) -> list[Run]:
    try:
        return await client.runs.list(thread_id, limit=_LIST_LIMIT)
    except Exception as exc:
        if _is_not_found(exc):
            return []  # no thread yet: no run
        raise


def _list(client: SyncLangGraphClient, thread_id: str) -> list[Run]:
    try:
        return client.runs.list(thread_id, limit=_LIST_LIMIT)
    except Exception as exc:
        if _is_not_found(exc):
            return []
        raise
