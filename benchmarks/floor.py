"""The protocol floor: a minimal claim / complete pair of Lua scripts, nothing else.

Not a store (no fences, takeover, fingerprints or serialization): it shows what one round
trip for a replay and two for a first run cost through ``redis.Redis`` (pool checkout,
retry wrapper, event hooks on every command) and on a connection held from the pool
(``send_command`` / ``read_response``), so the gap between our store and the wire is
visible in the same run.
"""

from __future__ import annotations

from typing import Any

import redis

__all__ = ["LuaFloor"]

# KEYS[1] record; ARGV[1] owner, ARGV[2] lease ms.
# Returns {1, result} when completed (replay), {0} when the lease was taken, {2} when busy.
CLAIM = """
local v = redis.call('HMGET', KEYS[1], 's', 'r')
if v[1] == 'c' then return {1, v[2]} end
if v[1] then return {2} end
redis.call('HSET', KEYS[1], 's', 'r', 'o', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {0}
"""

# KEYS[1] record; ARGV[1] owner, ARGV[2] result, ARGV[3] ttl ms.
# Returns 1 when stored, 0 when a result was already there (write-once).
COMPLETE = """
if redis.call('HGET', KEYS[1], 's') == 'c' then return 0 end
redis.call('HSET', KEYS[1], 's', 'c', 'r', ARGV[2], 'o', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""


class LuaFloor:
    """``run(key, action)`` over the two scripts, through the client or a held connection."""

    def __init__(self, client: redis.Redis, *, held: bool) -> None:
        self.client = client
        self.claim_sha = client.script_load(CLAIM)
        self.complete_sha = client.script_load(COMPLETE)
        self.conn: Any = client.connection_pool.get_connection() if held else None

    def close(self) -> None:
        if self.conn is not None:
            self.client.connection_pool.release(self.conn)
            self.conn = None

    def _eval(self, sha: str, key: str, *args: Any) -> Any:
        if self.conn is None:
            return self.client.evalsha(sha, 1, key, *args)
        self.conn.send_command("EVALSHA", sha, 1, key, *args)
        return self.conn.read_response()

    def run(self, key: str, action: Any) -> Any:
        answer = self._eval(self.claim_sha, key, "me", 30000)
        if answer[0] == 1:
            return answer[1]
        if answer[0] == 2:
            raise RuntimeError("busy")
        result = action()
        self._eval(self.complete_sha, key, "me", b"ok", 86400000)
        return result
