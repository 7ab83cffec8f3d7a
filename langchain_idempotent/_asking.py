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
  ``(thread, task namespace, position)`` — in this process and in the call's store, so a
  resume in another process finds it. An answer is handed to the call recorded for its
  position, whichever thread drew it; the others wait for their turn.
* A call that arrives after the task's question was raised re-raises that same question
  (same interrupt id and value), so whichever exception LangGraph surfaces asks the
  recorded call.
* The turns are one generator (:func:`_turns`) with a thread driver (:func:`ask`) and an
  asyncio driver (:func:`aask`), which own the lock and the store calls.
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
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass, field
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.errors import GraphInterrupt

from ._compat import interrupt_counter, task_scratchpad
from .errors import IdempotencyError

__all__ = ["NotInGraphError", "aask", "ask", "question_key"]

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
    #: A call is looking up a position's owner, or recording its question: the others
    #: wait.
    busy: bool = False
    raised: GraphInterrupt | None = None
    cond: threading.Condition = field(default_factory=threading.Condition)
    acond: asyncio.Condition | None = None


_tasks: OrderedDict[tuple[int, str, str], _Task] = OrderedDict()
_tasks_lock = threading.Lock()
#: ``question_key`` -> the call's key, for questions asked in this process.
_asked_here: OrderedDict[str, str] = OrderedDict()


def _task(config: RunnableConfig, thread_id: str, tool: str, key: str) -> _Task:
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


def _remember(qkey: str, key: str) -> None:
    with _tasks_lock:
        _asked_here[qkey] = key
        while len(_asked_here) > _MAX_TASKS:
            _asked_here.popitem(last=False)


def _asked_locally(qkey: str) -> str | None:
    with _tasks_lock:
        return _asked_here.get(qkey)


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


@dataclass(frozen=True, slots=True)
class _Outside:
    """Run ``call(qkey)`` with the task's lock released (a store read or write); reply:
    its result. The lock is taken again and the waiting calls woken after it."""

    call: Callable[[str], Any]
    qkey: str


#: Wait on the task's condition until another call wakes this one.
_WAIT = "wait"
#: Wake the calls waiting on the task's condition.
_WAKE = "wake"
_Turn = Generator[_Outside | str, Any, Any]


def _turns(
    task: _Task,
    *,
    key: str,
    request: Any,
    schema: Any,
    record: Callable[[str], Any],
    lookup: Callable[[str], Any],
) -> _Turn:
    """The call ``key``'s turns, run holding the task's lock (one driver per face, below):
    returns the answer to its question or raises it. Each turn looks up whom the next
    position's question asked about, then draws that position's answer with the owner's
    schema: the call's own answer, one to hand to its owner, or this call's question."""
    from langgraph.types import interrupt

    task.schemas[key] = schema
    while True:
        if key in task.answers:
            return task.answers.pop(key)
        if task.raised is not None:
            raise _again(task.raised)
        if task.busy:
            yield _WAIT
            continue
        position = task.asked
        qkey = question_key(task.thread_id, task.ns, position)
        owner = _asked_locally(qkey)
        if owner is None:
            task.busy = True
            try:
                owner = yield _Outside(lookup, qkey)
            finally:
                task.busy = False
        task.asked += 1
        try:
            value = interrupt(request, response_schema=_schema_for(task, owner, key, schema))
        except GraphInterrupt as question:
            # This call asks. Record which call the question is about before anyone sees it.
            task.busy = True
            try:
                _remember(qkey, key)
                yield _Outside(record, qkey)
            finally:
                task.raised, task.busy = question, False
            raise question
        if owner is None:
            raise _unknown(task, position)
        if owner == key:
            return value
        task.answers[owner] = value
        yield _WAKE


def ask(
    config: RunnableConfig,
    *,
    key: str,
    thread_id: str,
    tool: str,
    request: Any,
    schema: Any,
    record: Callable[[str], None],
    lookup: Callable[[str], str | None],
) -> Any:
    """The answer to the call ``key``'s question ``request`` (checked against
    ``schema``), or raise it.

    ``record(question_key)`` stores write-once that the question asks about ``key``;
    ``lookup(question_key)`` reads back which call a question asked about (``None`` when
    absent).
    """
    task = _task(config, thread_id, tool, key)
    turns = _turns(task, key=key, request=request, schema=schema, record=record, lookup=lookup)
    reply: Any = None
    error: BaseException | None = None
    with task.cond:
        while True:
            try:
                step = turns.throw(error) if error is not None else turns.send(reply)
            except StopIteration as done:
                return done.value
            except BaseException:
                task.cond.notify_all()  # the question is open: the waiting calls re-raise it
                raise
            reply, error = None, None
            if step == _WAIT:
                task.cond.wait()
            elif isinstance(step, _Outside):
                task.cond.release()
                try:
                    reply = step.call(step.qkey)
                except BaseException as exc:
                    error = exc
                finally:
                    task.cond.acquire()
                    task.cond.notify_all()
            else:
                task.cond.notify_all()


async def aask(
    config: RunnableConfig,
    *,
    key: str,
    thread_id: str,
    tool: str,
    request: Any,
    schema: Any,
    record: Callable[[str], Awaitable[None]],
    lookup: Callable[[str], Awaitable[str | None]],
) -> Any:
    """The async face of :func:`ask` (the calls of one task share one event loop)."""
    task = _task(config, thread_id, tool, key)
    if task.acond is None:
        task.acond = asyncio.Condition()
    cond = task.acond
    turns = _turns(task, key=key, request=request, schema=schema, record=record, lookup=lookup)
    reply: Any = None
    error: BaseException | None = None
    async with cond:
        while True:
            try:
                step = turns.throw(error) if error is not None else turns.send(reply)
            except StopIteration as done:
                return done.value
            except BaseException:
                cond.notify_all()
                raise
            reply, error = None, None
            if step == _WAIT:
                await cond.wait()
            elif isinstance(step, _Outside):
                cond.release()
                try:
                    reply = await step.call(step.qkey)
                except BaseException as exc:
                    error = exc
                finally:
                    await cond.acquire()
                    cond.notify_all()
            else:
                cond.notify_all()
