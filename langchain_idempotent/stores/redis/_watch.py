"""The Redis store's wake-ups: subscribe first, then probe, then wait for the message.

One attempt of :meth:`~RedisIdempotencyStore.watch`, for each face (the store retries it
whole and translates its errors). :func:`_watching` is the watch without I/O, driven by
:func:`watch_once` (sync) and :func:`awatch_once` (async): it waits until Redis confirms
the subscription on the record's channel ``{prefix}{<key>}:done`` (a message published
before would be lost), runs the probe script once (is the record still RUNNING at the
waiter's fence, and for how long is the lease live?), and then waits for one message, at
most until the lease deadline or the caller's deadline, whichever is sooner.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable, Generator
from typing import Any, Literal

import redis.asyncio

__all__ = ["awatch_once", "watch_once"]


def watch_once(client: Any, rkey: str, deadline: float, probe: Callable[[], Any]) -> None:
    """Watch ``rkey`` on a sync ``client`` until ``deadline`` (``time.monotonic()``);
    ``probe()`` runs the probe script and returns its ``(reply, acks)``."""
    pubsub = client.pubsub()
    try:
        pubsub.subscribe(rkey + ":done")
        steps, reply = _watching(deadline), None
        with contextlib.suppress(StopIteration):
            while True:
                step = steps.send(reply)
                reply = probe()[0] if step == "probe" else pubsub.get_message(timeout=step)
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
        steps, reply = _watching(deadline), None
        with contextlib.suppress(StopIteration):
            while True:
                step = steps.send(reply)
                if step == "probe":
                    reply = (await probe())[0]
                else:
                    reply = await pubsub.get_message(timeout=step)
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
