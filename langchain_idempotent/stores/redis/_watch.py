"""The Redis store's wake-ups: subscribe first, then probe, then wait for the message.

One attempt of :meth:`~RedisIdempotencyStore.watch`, for each face (the store retries it
whole and translates its errors). :func:`_watching` is the watch without I/O, driven
(:mod:`...core._drive`) by :func:`watch_once` (sync) and :func:`awatch_once` (async): it
waits until Redis confirms the subscription on the record's channel ``{prefix}{<key>}:done``
(a message published before would be lost), runs the probe script once (is the record still
RUNNING at the waiter's fence, and for how long is the lease live?), and then waits for one
message, at most until the lease deadline or the caller's deadline, whichever is sooner.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Generator
from typing import Any, Literal

import redis.asyncio

from ...core._drive import adrive, drive

__all__ = ["awatch_once", "watch_once"]


def watch_once(client: Any, rkey: str, deadline: float, probe: Callable[[], Any]) -> None:
    """Watch ``rkey`` on a sync ``client`` until ``deadline`` (``time.monotonic()``);
    ``probe()`` runs the probe script and returns its ``(reply, acks)``."""
    pubsub = client.pubsub()
    try:
        pubsub.subscribe(rkey + ":done")

        def perform(step: float | Literal["probe"]) -> Any:
            return probe()[0] if step == "probe" else pubsub.get_message(timeout=step)

        drive(_watching(deadline), perform)
    finally:
        pubsub.close()


async def awatch_once(
    client: Any, rkey: str, deadline: float, probe: Callable[[], Awaitable[Any]]
) -> None:
    """:func:`watch_once` on an async ``client``."""
    if isinstance(client, redis.asyncio.RedisCluster):
        await client.initialize()  # the pub/sub node is chosen from the slot map
    pubsub = client.pubsub()
    try:
        await pubsub.subscribe(rkey + ":done")

        async def perform(step: float | Literal["probe"]) -> Any:
            return (await probe())[0] if step == "probe" else await pubsub.get_message(timeout=step)

        await adrive(_watching(deadline), perform)
    finally:
        await pubsub.aclose()


def _watching(deadline: float) -> Generator[float | Literal["probe"], Any, None]:
    """One watch after subscribing, without I/O, for both faces to drive. Yields a timeout
    in seconds: read one pub/sub message, waiting at most that long, and send it back (or
    ``None``); yields ``"probe"``: run the probe script and send back its reply. Returns
    when the waiter should look at the record again."""
    while True:  # until Redis confirms the subscription: a message sent before is lost
        left = deadline - time.monotonic()
        if left <= 0:
            return
        message = yield left
        if message is not None and message["type"] == "subscribe":
            break
    left_ms = yield "probe"
    if left_ms < 0:  # no longer RUNNING at the waiter's fence, or the lease has passed
        return
    end = min(deadline, time.monotonic() + left_ms / 1000 + 0.001)
    while (left := end - time.monotonic()) > 0:
        message = yield left
        if message is not None and message["type"] == "message":
            return
