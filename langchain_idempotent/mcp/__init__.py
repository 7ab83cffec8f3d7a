"""MCP tools on both sides of the wire.

- :class:`IdempotencyKeyInterceptor` (client): a ``langchain-mcp-adapters`` tool
  interceptor that sends a wrapped call's idempotency key to the MCP server.
- :class:`McpIdempotency` (server): runs an MCP server's ``tools/call`` once per key,
  replays the stored result, SEP-3182's errors and capability.

Needs the ``mcp`` extra: ``pip install 'langchain-idempotent[mcp]'``.
"""

from ._wire import CAPABILITY, HEADER, MAX_KEY_LENGTH, META_PREFIX
from .client import IdempotencyKeyInterceptor
from .server import McpIdempotency

__all__ = [
    "CAPABILITY",
    "HEADER",
    "MAX_KEY_LENGTH",
    "META_PREFIX",
    "IdempotencyKeyInterceptor",
    "McpIdempotency",
]
