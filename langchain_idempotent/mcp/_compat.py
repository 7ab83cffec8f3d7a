"""Every private MCP SDK / FastMCP attribute the server side reads, in one place (as
``langchain_idempotent._compat`` does for LangChain and LangGraph), each with a test in
``tests/test_mcp_server.py`` that fails by name when a release moves it.

=================================  ===============================================================
touch                              why
=================================  ===============================================================
``FastMCP._mcp_server``            both FastMCPs keep their low-level ``Server`` (whose
                                   ``request_handlers`` the ``tools/call`` shim wraps) here
``ServerSession._init_options``    the options a session was initialised with: a session opened
                                   before the middleware installed advertises
                                   ``tools.idempotency`` through them
=================================  ===============================================================

Supported ranges: ``mcp>=1.24,<2``, ``fastmcp>=3.4,<4`` (the ``mcp`` extra).
"""

from __future__ import annotations

from typing import Any

__all__ = ["init_options", "lowlevel_server"]


def lowlevel_server(server: Any) -> Any:
    """The low-level ``mcp.server.lowlevel.Server`` of a FastMCP (either package), or
    ``server`` itself when it is one."""
    return getattr(server, "_mcp_server", server)


def init_options(session: Any) -> Any:
    """The ``InitializationOptions`` a server session was opened with, or ``None``."""
    return getattr(session, "_init_options", None)
