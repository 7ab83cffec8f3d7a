"""The reference approach we replace, rebuilt exactly as DESIGN.md describes it.

key = ``"idempotency:" + sha256(f"{workflow_run_id}:{step_name}:{json.dumps(payload,
sort_keys=True)}")``; ``GET key`` — a stored result is returned; else ``SET lock:key LOCKED
EX 45 NX`` — if that fails, ``RuntimeError("Lock contention …")`` at once; run the action;
then in one MULTI/EXEC ``SET key <json result> EX 86400`` and ``DEL lock:key``; on an
exception a plain ``DEL lock:key`` and re-raise. Results are plain JSON.

Its faults are kept on purpose (they are what the benchmarks count): the window between
the GET and the SET NX lets a second worker run after the first has finished, and the
unconditional DEL removes another worker's lock.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

import redis

__all__ = ["ReferenceIdempotency", "reference_key"]

LOCK_SECONDS = 45
RESULT_SECONDS = 86400


def reference_key(workflow_run_id: str, step_name: str, payload: Any) -> str:
    raw = f"{workflow_run_id}:{step_name}:{json.dumps(payload, sort_keys=True)}"
    return "idempotency:" + hashlib.sha256(raw.encode()).hexdigest()


class ReferenceIdempotency:
    """GET, SET NX lock, run, MULTI/EXEC SET result + DEL lock."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def run(self, key: str, action: Callable[[], Any]) -> Any:
        stored = self.client.get(key)
        if stored is not None:
            return json.loads(stored)
        lock = "lock:" + key
        if not self.client.set(lock, "LOCKED", ex=LOCK_SECONDS, nx=True):
            raise RuntimeError(f"Lock contention on {key}: another worker is running this step")
        try:
            result = action()
        except BaseException:
            self.client.delete(lock)
            raise
        pipe = self.client.pipeline(transaction=True)
        pipe.set(key, json.dumps(result), ex=RESULT_SECONDS)
        pipe.delete(lock)
        pipe.execute()
        return result
