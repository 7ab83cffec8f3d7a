"""MCP tools on both sides of the wire.

- :class:`IdempotencyKeyInterceptor` (client): a ``langchain-mcp-adapters`` tool
  interceptor that sends a wrapped call's idempotency key to the MCP server.
- :func:`with_idempotency_key` (client): a ``fastmcp.Client`` that sends the key, for
  LangChain's own ``langchain.mcp`` (``as_langchain_tool(tool, with_idempotency_key(c))``).
- :class:`McpIdempotency` (server): runs an MCP server's ``tools/call`` once per key,
  replays the stored result, SEP-3182's errors and capability.

Needs the ``mcp`` extra: ``pip install 'langchain-idempotent[mcp]'``.
"""

from ._wire import CAPABILITY, EXTENSION, HEADER, MAX_KEY_LENGTH, META_PREFIX
from .client import IdempotencyKeyInterceptor, with_idempotency_key
from .server import McpIdempotency

__all__ = [
    "CAPABILITY",
    "EXTENSION",
    "HEADER",
    "MAX_KEY_LENGTH",
    "META_PREFIX",
    "IdempotencyKeyInterceptor",
    "McpIdempotency",
    "with_idempotency_key",
]
