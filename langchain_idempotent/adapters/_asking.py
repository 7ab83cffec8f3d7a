"""Asking a human inside one LangGraph task: one question at a time, each answer bound to
the call it was asked about.

LangGraph matches resume values to the ``interrupt()`` calls *of one task* by position:
the n-th ``interrupt()`` the task makes in a run gets the n-th answer the task has
(``langgraph.types.interrupt`` and ``pregel._algo._scratchpad``; the interrupt id is a hash
of the task's namespace and how many answers it already has; the task's scratchpad and its
interrupt counter are LangGraph internals, read through :mod:`._compat`). A hand-built ``ToolNode``
runs the parallel calls of one ``AIMessage`` in one task, on executor threads (or in one
``asyncio.gather``), so the order in which those calls reach ``interrupt()`` changes from
run to run, and a plain ``interrupt()`` per call can hand an answer to the wrong call.

So the gated calls of one task go through this module, which never lets position decide
who an answer belongs to:

* At most one question is open per task and run. The calls take turns (a lock per
  task); each turn calls ``interrupt()`` once, which either returns the answer in the
  next position or raises the caller's own question.
* Before a question is raised, *which call it asks about* is recorded write-once under
  ``(thread, task namespace, position)`` in the call's store, so a resume in any process
  finds it (the store is the one memory of it). An answer is handed to the call recorded for its
  position, whichever thread drew it; the others wait for their turn.
* A call that arrives after the task's question was raised re-raises that same question
  (same interrupt id and value), so whichever exception LangGraph surfaces asks the
  recorded call.
* The turns are a sub-flow (:func:`turns`) of approval's flow, yielding the same steps:
  store operations (:class:`Op`) and the task's lock and condition (:class:`Hold`,
  :class:`Free`, :class:`Wait`, :class:`Wake`). One driver per face (:func:`drive`,
  :func:`adrive`) carries them out: a thread's ``threading.Condition``, or an
  ``asyncio.Condition`` for the calls of one task on one event loop.
* Before a turn's ``interrupt()``, the call looks up whom the position's question asked
  about, and draws the answer with *that* call's ``response_schema``, so LangGraph checks
  the answer against the call it belongs to before it saves it. (Should the owner not
  have reached its turn in this process yet, the answer is drawn unchecked and the owner
  checks it when handed over.)

Parallel gated calls in one ``ToolNode`` step are therefore asked one after another: each
resume answers one call and the node re-runs to ask the next. ``create_agent`` (and any
graph that routes calls with ``Send``) runs each call as its own task, so each call has
its own open question and they are answered one by one by interrupt id, as before.

Assumes that only these gated calls call ``interrupt()`` in the task (a tool that also
interrupts itself would shift the positions).
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import random
import threading
from collections import OrderedDict
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from langchain_core.runnables import RunnableConfig
from langgraph.errors import GraphInterrupt

from ..core._drive import adrive as core_adrive
from ..core._drive import drive as core_drive
from ..core._reconciling import _run_awaitable
from ..core.record import ClaimOutcome, Record
from ..core.store import ClaimRequest, CompleteRequest
from ..errors import IdempotencyError
from ._compat import interrupt_counter, task_scratchpad

if TYPE_CHECKING:
    from ..core.store import BaseIdempotencyStore

__all__ = [
    "Free",
    "Hold",
    "Hook",
    "NotInGraphError",
    "Op",
    "Steps",
    "StoreOp",
    "Wait",
    "Wake",
    "adrive",
    "drive",
    "question_key",
    "task_of",
    "turns",
    "write_once",
]

#: Tasks remembered in this process (a task needs its entry only while its run lasts).
_MAX_TASKS = 4096


class NotInGraphError(IdempotencyError, RuntimeError):
    """Approval asked outside a LangGraph graph run (``tool.invoke`` on its own)."""


def question_key(thread_id: str, task_ns: str, position: int) -> str:
    """The record that says which call the task's question at ``position`` asked about."""
    digest = hashlib.sha256(f"{len(thread_id)}:{thread_id}|{task_ns}".encode()).hexdigest()
    return f"approval-question:{digest[:40]}:{position}"


@dataclass(eq=False)
class _Task:
    """One task's questions in this process, for one run of the task."""

    counter: Any  # the task's interrupt counter, held so its id() is not reused
    thread_id: str
    ns: str
    #: ``interrupt()`` calls so far in this run: LangGraph's own position counter.
    asked: int = 0
    #: Answers drawn by one call for another, by the other call's key.
    answers: dict[str, Any] = field(default_factory=dict)
    #: Each waiting call's ``response_schema``, by its key (an answer is drawn with its
    #: owner's).
    schemas: dict[str, Any] = field(default_factory=dict)
    #: A call is looking up a position's owner, or recording its question, with the lock
    #: released: the others wait.
    busy: bool = False
    raised: GraphInterrupt | None = None
    cond: threading.Condition = field(default_factory=threading.Condition)
    acond: asyncio.Condition | None = None


#: The tasks running in this process, by their interrupt counter: LangGraph's per-run
#: objects (the scratchpad, the counter) take neither attributes nor weak references, so
#: the calls of one task find their shared turns here, keyed by the counter's id (the
#: entry holds the counter, so the id is not reused while it is remembered).
_tasks: OrderedDict[tuple[int, str, str], _Task] = OrderedDict()
_tasks_lock = threading.Lock()


def task_of(config: RunnableConfig, thread_id: str, tool: str, key: str) -> _Task:
    """The running task whose turns the call ``key`` of ``tool`` takes."""
    scratchpad = task_scratchpad(config)
    if scratchpad is None:
        raise NotInGraphError(
            f"tool {tool!r} needs human approval (approval=...), which asks through "
            "LangGraph's interrupt() and is answered with Command(resume=...): run it in a "
            "LangGraph graph compiled with a checkpointer (a ToolNode or create_agent), not "
            "with tool.invoke() on its own; or build this tool without approval",
            key=key,
        )
    ns = str((config.get("configurable") or {}).get("checkpoint_ns", ""))
    # The counter is replaced when LangGraph retries the task (and counts from 0 again).
    counter = interrupt_counter(scratchpad)
    ident = (id(counter), thread_id, ns)
    with _tasks_lock:
        task = _tasks.get(ident)
        if task is None or task.counter is not counter:
            task = _tasks[ident] = _Task(counter, thread_id, ns)
            while len(_tasks) > _MAX_TASKS:
                _tasks.popitem(last=False)
        return task


# -- the steps a flow yields, and their two drivers -----------------------------------------


class StoreOp(Enum):
    """A store operation, as its sync and its async method."""

    GET = (attrgetter("get"), attrgetter("aget"))
    DELETE = (attrgetter("delete"), attrgetter("adelete"))
    CLAIM = (attrgetter("claim"), attrgetter("aclaim"))
    COMPLETE = (attrgetter("complete"), attrgetter("acomplete"))
    NOW = (attrgetter("now_ms"), attrgetter("anow_ms"))


@dataclass(frozen=True, slots=True)
class Op:
    """Run ``store.<op>(arg)``; reply: its result. ``arg`` is what the operation takes: a
    key (get, delete), a :class:`ClaimRequest` or a :class:`CompleteRequest`; ``None``
    for the store's clock (``NOW``)."""

    op: StoreOp
    arg: str | ClaimRequest | CompleteRequest | None


@dataclass(frozen=True, slots=True)
class Hook:
    """Call the user's ``fn(*args)`` (sync or async); reply: what it returned (its
    exception is raised inside the flow). The sync driver runs an async hook to completion
    on a private loop, the async driver runs a sync one in a worker thread."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class _OnTask:
    """A step on the task's lock and condition."""

    task: _Task


class Hold(_OnTask):
    """Take the task's lock: the flow runs holding it until :class:`Free` (or its end)."""

    __slots__ = ()


class Free(_OnTask):
    """Wake the calls waiting on the task's condition and release its lock."""

    __slots__ = ()


class Wait(_OnTask):
    """Wait on the task's condition (its lock held) until another call wakes this one."""

    __slots__ = ()


class Wake(_OnTask):
    """Wake the calls waiting on the task's condition."""

    __slots__ = ()


Step = Op | Hook | Hold | Free | Wait | Wake
Steps = Generator[Step, Any, Any]


def drive(steps: Steps, store: BaseIdempotencyStore) -> Any:
    """Carry out ``steps`` on ``store`` and the tasks' thread conditions (:mod:`.._drive`);
    returns what the flow returns. A step's error is raised inside the flow; a lock the flow
    still holds when it ends (a raised question) is released, waking the calls that wait
    on it."""
    held: list[threading.Condition] = []

    def perform(step: Step) -> Any:
        if isinstance(step, Op):
            method = step.op.value[0](store)
            return method() if step.arg is None else method(step.arg)
        if isinstance(step, Hook):
            reply = step.fn(*step.args)
            return _run_awaitable(reply) if inspect.isawaitable(reply) else reply
        cond = step.task.cond
        if isinstance(step, Hold):
            cond.acquire()
            held.append(cond)
        elif isinstance(step, Wait):
            cond.wait()
        else:
            _woken(step, cond, held)
        return None

    try:
        return core_drive(steps, perform, BaseException)
    finally:
        _let_go(held)


async def adrive(steps: Steps, store: BaseIdempotencyStore) -> Any:
    """The async face of :func:`drive`: the store's ``a``-methods and the task's
    ``asyncio.Condition``."""
    held: list[asyncio.Condition] = []

    async def perform(step: Step) -> Any:
        if isinstance(step, Op):
            method = step.op.value[1](store)
            return await (method() if step.arg is None else method(step.arg))
        if isinstance(step, Hook):
            return await _ahook(step)
        cond = step.task.acond
        if cond is None:
            cond = step.task.acond = asyncio.Condition()
        if isinstance(step, Hold):
            await cond.acquire()
            held.append(cond)
        elif isinstance(step, Wait):
            await cond.wait()
        else:
            _woken(step, cond, held)
        return None

    try:
        return await core_adrive(steps, perform, BaseException)
    finally:
        _let_go(held)


def _woken(step: Free | Wake, cond: Any, held: list[Any]) -> None:
    """Wake the calls waiting on ``cond`` (a thread's or an asyncio condition: both wake
    and release without blocking); for :class:`Free`, release it too."""
    if isinstance(step, Free):
        held.remove(cond)
        cond.notify_all()
        cond.release()
    else:
        cond.notify_all()


def _let_go(held: list[Any]) -> None:
    """Release the locks a flow still holds when it ends, waking those that wait on them."""
    for cond in held:
        cond.notify_all()
        cond.release()


async def _ahook(step: Hook) -> Any:
    if inspect.iscoroutinefunction(step.fn):
        return await step.fn(*step.args)
    reply = await asyncio.to_thread(step.fn, *step.args)  # it may block on I/O
    return (await reply) if inspect.isawaitable(reply) else reply


# -- the turns -----------------------------------------------------------------------------


def _unknown(task: _Task, position: int) -> RuntimeError:
    return RuntimeError(
        f"an answer arrived for approval question #{position} of task {task.ns!r}, but "
        "there is no record of which call it asked about (the record expired, or the gated "
        "tools of one ToolNode use different stores); nothing ran"
    )


def _again(question: GraphInterrupt) -> GraphInterrupt:
    """The task's open question, raised once more (same interrupt id and value)."""
    return GraphInterrupt(question.args[0] if question.args else ())


def _schema_for(task: _Task, owner: str | None, key: str, schema: Any) -> Any:
    """The schema an answer at a position owned by ``owner`` is drawn with (``None``: not
    checked while drawing; the owner checks it)."""
    return schema if owner in (None, key) else task.schemas.get(owner or "")


def turns(
    task: _Task,
    *,
    key: str,
    request: Any,
    schema: Any,
    meta: Mapping[str, str],
    lease_ms: int,
    ttl_ms: int,
) -> Steps:
    """The answer to the call ``key``'s question ``request`` (checked against ``schema``),
    or raise it, taking turns with the task's other calls. The question's record (which
    call it asks about) is written with ``meta``, ``lease_ms`` and ``ttl_ms``."""
    yield Hold(task)
    answer = yield from _turns(task, key, request, schema, (meta, lease_ms, ttl_ms))
    yield Free(task)
    return answer


def _turns(
    task: _Task, key: str, request: Any, schema: Any, record: tuple[Mapping[str, str], int, int]
) -> Steps:
    """:func:`turns`, holding the task's lock. Each turn looks up whom the next position's
    question asked about, then draws that position's answer with the owner's schema: the
    call's own answer, one to hand to its owner, or this call's question."""
    from langgraph.types import interrupt

    task.schemas[key] = schema
    while True:
        if key in task.answers:
            return task.answers.pop(key)
        if task.raised is not None:
            raise _again(task.raised)
        if task.busy:
            yield Wait(task)
            continue
        position = task.asked
        qkey = question_key(task.thread_id, task.ns, position)
        owner = yield from _outside(task, _asked_about(qkey))
        task.asked += 1
        try:
            value = interrupt(request, response_schema=_schema_for(task, owner, key, schema))
        except GraphInterrupt as question:
            # This call asks. Record which call the question is about before anyone sees it.
            try:
                yield from _outside(task, _record_question(qkey, key, *record))
            finally:
                task.raised = question
            raise question
        if owner is None:
            raise _unknown(task, position)
        if owner == key:
            return value
        task.answers[owner] = value
        yield Wake(task)


def _outside(task: _Task, steps: Steps) -> Steps:
    """``steps`` (store operations) with the task's lock released; the task's other calls
    wait until it is taken again."""
    task.busy = True
    yield Free(task)
    try:
        return (yield from steps)
    finally:
        try:
            yield Hold(task)
        finally:
            task.busy = False


def _asked_about(qkey: str) -> Steps:
    """The call key the question ``qkey`` asked about, or ``None``."""
    record: Record | None = yield Op(StoreOp.GET, qkey)
    if record is None or not record.done or record.payload is None:
        return None
    asked = json.loads(record.payload).get("key")
    return asked if isinstance(asked, str) else None


def _record_question(
    qkey: str, key: str, meta: Mapping[str, str], lease_ms: int, ttl_ms: int
) -> Steps:
    """Record that the question ``qkey`` asks about the call ``key``. The latest question
    at a position is the one the human sees, so an older record there goes."""
    if (yield from _asked_about(qkey)) not in (None, key):
        yield Op(StoreOp.DELETE, qkey)
    payload = json.dumps({"key": key}).encode()
    question = {**meta, "kind": "approval_question", "approval_for": key}
    yield from write_once(qkey, payload, question, lease_ms, ttl_ms)


def write_once(
    key: str, payload: bytes, meta: Mapping[str, str], lease_ms: int, ttl_ms: int
) -> Steps:
    """Store ``payload`` under ``key`` through the ordinary claim / complete protocol,
    unless a payload is there. Returns the stored one (``None`` when another writer holds
    the key for an instant: its payload is the same answer)."""
    owner = f"{random.getrandbits(96):024x}"
    claim = yield Op(
        StoreOp.CLAIM, ClaimRequest(key, owner, "approval", lease_ms, ttl_ms, meta=meta)
    )
    if claim.outcome is ClaimOutcome.REPLAY and claim.payload is not None:
        return claim.payload
    if not claim.outcome.runs:
        return None
    done = yield Op(
        StoreOp.COMPLETE,
        CompleteRequest(key, owner, claim.fence, "approval", payload, False, ttl_ms, meta),
    )
    return done.payload
