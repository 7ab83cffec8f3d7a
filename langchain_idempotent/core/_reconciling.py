"""Asking a reconcile hook (:mod:`.reconcile`) from either engine driver.

A hook may be sync or async, and either driver may have to ask it: the sync driver runs
an async hook to completion on a private event loop (it has none of its own), the async
driver runs a sync hook in a worker thread (it may block on I/O). Either way the driver
hands the engine's flow a :class:`HookAnswer`: what the hook returned or the ``Exception``
it raised, and how long it took (for the ``reconcile`` event).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from .reconcile import ReconcileCall, Reconciler

__all__ = ["HookAnswer", "aconsult", "consult"]


@dataclass(frozen=True, slots=True)
class HookAnswer:
    """What a reconcile hook answered: ``value`` (``None``: not found) or ``exc``."""

    value: Any = None
    exc: Exception | None = None
    duration_ms: float = 0.0


def consult(hook: Reconciler, call: ReconcileCall) -> HookAnswer:
    """Call the hook; an async hook runs to completion on a private event loop."""
    started = time.perf_counter()
    try:
        value = hook(call)
        if inspect.isawaitable(value):
            value = _run_awaitable(value)
    except Exception as exc:
        return _answered(started, exc=exc)
    return _answered(started, value=value)


async def aconsult(hook: Reconciler, call: ReconcileCall) -> HookAnswer:
    """Await an async hook; a sync one runs in a worker thread."""
    started = time.perf_counter()
    try:
        if inspect.iscoroutinefunction(hook):
            value = await hook(call)
        else:
            value = await asyncio.to_thread(hook, call)
            if inspect.isawaitable(value):
                value = await value
    except Exception as exc:
        return _answered(started, exc=exc)
    return _answered(started, value=value)


def _answered(started: float, value: Any = None, exc: Exception | None = None) -> HookAnswer:
    return HookAnswer(value, exc, (time.perf_counter() - started) * 1000)


def _run_awaitable(awaitable: Awaitable[Any]) -> Any:
    async def wait() -> Any:
        return await awaitable

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(wait())
    # A sync tool called on a thread that runs a loop: finish the hook on another thread.
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, wait()).result()
