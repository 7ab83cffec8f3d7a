"""The one driver of every flow: a generator that yields steps and is sent their replies.

Each protocol of the library is written once, as a generator with no I/O of its own, and
carried out by a sync or an async ``perform`` (the pattern of httpx's ``auth_flow``): the
engine's call (:mod:`.engine`), approval's turns (:mod:`..adapters._asking`), the Redis
store's claims, watch and pipelines, and PostgreSQL's statements. :func:`drive` and
:func:`adrive` are the two loops they all share, so a sync and an async path cannot drift::

    def flow() -> Generator[Step, Any, Answer]:   # decides; no I/O
        reply = yield step                        # what perform(step) returned
        ...
        return answer

    drive(flow(), perform)                        # perform(step) -> reply
    await adrive(flow(), aperform)                # await aperform(step) -> reply

A step whose ``perform`` raises one of the ``caught`` types has its error thrown into the
flow at the ``yield`` (which may handle it); any other error propagates to the caller and
the flow is left unfinished.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from typing import Any, TypeVar

__all__ = ["adrive", "drive"]

S = TypeVar("S")
T = TypeVar("T")

_Caught = type[BaseException] | tuple[type[BaseException], ...]


def drive(flow: Generator[S, Any, T], perform: Callable[[S], Any], caught: _Caught = ()) -> T:
    """Carry out ``flow``'s steps with ``perform``; returns what the flow returns."""
    reply: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = flow.send(reply) if error is None else flow.throw(error)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        try:
            reply, error = perform(step), None
        except caught as exc:
            reply, error = None, exc


async def adrive(
    flow: Generator[S, Any, T], perform: Callable[[S], Awaitable[Any]], caught: _Caught = ()
) -> T:
    """:func:`drive` with an async ``perform``."""
    reply: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = flow.send(reply) if error is None else flow.throw(error)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        try:
            reply, error = await perform(step), None
        except caught as exc:
            reply, error = None, exc
