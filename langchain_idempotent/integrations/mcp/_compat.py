"""Every MCP SDK / FastMCP name that differs between the two supported sets, and every
private attribute the server side reads, in one place (as ``langchain_idempotent.adapters._compat``
does for LangChain and LangGraph), each with a test in ``tests/test_mcp_server.py`` or
``tests/test_mcp_fastmcp.py`` that fails by name when a release moves it.

Two sets are supported and tested (CI runs the MCP tests on each):

- **mcp 1** (``mcp>=1.24,<2``, ``fastmcp>=3.4,<4``): the low-level server keys its
  handlers by request class (``request_handlers[CallToolRequest]``, a handler of the
  request returning a ``ServerResult``); errors are ``McpError(ErrorData)``; a session
  starts with ``initialize``.
- **mcp 2** (``mcp>=2,<3``, ``fastmcp>=4,<5``): handlers are keyed by method string
  (``_request_handlers["tools/call"]``, a ``HandlerEntry`` whose handler takes
  ``(ctx, params)`` and returns the result); errors are ``MCPError(code, message,
  data)``; protocol 2026-07-28 has no ``initialize`` (a session starts with
  ``server/discover``, and a stateless request may come first); ``_meta`` is a ``dict``;
  ``CallToolRequestParams`` and ``ToolsCapability`` drop unknown fields (so SEP-3182's
  ``params.idempotencyKey`` is read from the raw params, and the capability is
  advertised under ``capabilities.extensions`` as well).

=================================  ===============================================================
touch                              why
=================================  ===============================================================
``FastMCP._mcp_server``            both FastMCPs keep their low-level ``Server`` here (the SDK's
``MCPServer._lowlevel_server``     ``MCPServer``, mcp 2's rename of its FastMCP, keeps it here)
``Server._request_handlers``       mcp 2: the ``HandlerEntry`` of ``"tools/call"`` the shim wraps
``LocalProvider._components``      fastmcp: the tools registered on the server, read at install
                                   (a protected tool that may run as a background task is refused)
``ServerSession._init_options``    mcp 1: the options a session was initialised with: a session
                                   opened before the middleware installed advertises
                                   ``tools.idempotency`` through them
=================================  ===============================================================
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping
from importlib.metadata import version
from typing import Any, Final

import mcp.shared.exceptions as _exceptions
from mcp import types

__all__ = [
    "MCP_MAJOR",
    "MCPError",
    "call_tool_handler",
    "init_options",
    "lowlevel_server",
    "make_error",
    "meta_dict",
    "set_call_tool_handler",
]

#: The installed ``mcp`` SDK's major version (1 or 2).
MCP_MAJOR: Final = int(version("mcp").split(".")[0])

#: The exception an MCP error travels as: ``McpError`` on mcp 1, ``MCPError`` on mcp 2.
_v1_name = "McpError"  # named indirectly: mypy on mcp 2 knows no McpError
MCPError: type[Exception] = getattr(_exceptions, "MCPError", None) or getattr(_exceptions, _v1_name)

#: The method string mcp 2 keys ``tools/call`` by.
CALL_TOOL: Final = "tools/call"


def make_error(code: int, message: str, data: Any = None) -> Exception:
    """An ``MCPError`` / ``McpError`` that the SDK answers as this JSON-RPC error."""
    if MCP_MAJOR >= 2:
        return MCPError(code, message, data)
    return MCPError(types.ErrorData(code=code, message=message, data=data))


def error_fields(exc: BaseException) -> tuple[str, Any]:
    """``(message, data)`` of an MCP error (either SDK)."""
    error = exc.error  # type: ignore[attr-defined]
    return str(error.message), error.data


def lowlevel_server(server: Any) -> Any:
    """The low-level ``mcp.server.lowlevel.Server`` of a FastMCP (either package) or the
    SDK's ``MCPServer``, or ``server`` itself when it is one."""
    for name in ("_mcp_server", "_lowlevel_server"):
        inner = getattr(server, name, None)
        if inner is not None:
            return inner
    return server


#: A normalised ``tools/call`` handler: ``(params, raw params, HTTP request) -> result``
#: where the result is the SDK's result model (``CallToolResult``, or another: a task
#: handle, an ``InputRequiredResult``).
Call = Callable[[Any, Mapping[str, Any], Any], Awaitable[Any]]
#: What the shim does with one call: given the request's parts and the inner handler.
Shim = Callable[[Any, Mapping[str, Any], Any, Callable[[], Awaitable[Any]]], Awaitable[Any]]


def handlers_of(lowlevel: Any) -> dict[Any, Any] | None:
    """The low-level server's request handler table (``None`` if it is not a server)."""
    handlers = getattr(
        lowlevel, "_request_handlers" if MCP_MAJOR >= 2 else "request_handlers", None
    )
    return handlers if isinstance(handlers, dict) else None


def call_tool_handler(lowlevel: Any) -> Any:
    """The server's ``tools/call`` handler entry, or ``None`` when it has none."""
    handlers = handlers_of(lowlevel) or {}
    return handlers.get(CALL_TOOL if MCP_MAJOR >= 2 else types.CallToolRequest)


def set_call_tool_handler(lowlevel: Any, shim: Shim) -> None:
    """Replace the server's ``tools/call`` handler by one that runs ``shim`` around it."""
    handlers = handlers_of(lowlevel)
    assert handlers is not None
    inner = call_tool_handler(lowlevel)
    if MCP_MAJOR >= 2:
        original = inner.handler

        async def handle(ctx: Any, params: Any) -> Any:
            raw = ctx.params if isinstance(ctx.params, Mapping) else {}
            return await shim(params, raw, ctx.request, lambda: original(ctx, params))

        handlers[CALL_TOOL] = dataclasses.replace(inner, handler=handle)
        return

    async def handle_v1(request: Any) -> Any:
        params = request.params
        raw = params.model_extra or {}

        async def call() -> Any:
            return (await inner(request)).root

        result = await shim(params, raw, _v1_http_request(), call)
        server_result: Any = getattr(types, "ServerResult")  # noqa: B009 - a union on mcp 2
        return server_result(result)

    handlers[types.CallToolRequest] = handle_v1


def call_wrapped(lowlevel: Any, request_context: Any, params: Any) -> Awaitable[Any]:
    """Run the server's (wrapped) ``tools/call`` handler for a request that reached the
    middleware before the shim was installed; answers the result model."""
    entry = call_tool_handler(lowlevel)
    if MCP_MAJOR >= 2:
        return entry.handler(request_context, params)  # type: ignore[no-any-return]

    async def call() -> Any:
        return (await entry(types.CallToolRequest(params=params))).root

    return call()


def meta_dict(meta: Any) -> dict[str, Any]:
    """A request's ``_meta`` as a ``dict`` (a model on mcp 1, a ``dict`` on mcp 2)."""
    if meta is None:
        return {}
    if isinstance(meta, Mapping):
        return dict(meta)
    return dict(meta.model_dump())


def _v1_http_request() -> Any:
    from mcp.server.lowlevel.server import request_ctx  # type: ignore[attr-defined,unused-ignore]

    try:
        return request_ctx.get().request
    except LookupError:
        return None


def background_task_tools(server: Any) -> list[str]:
    """The names of a fastmcp server's registered tools that may run as background tasks
    (SEP-1686: ``task=True``, a ``TaskConfig`` whose mode is not ``"forbidden"``)."""
    components = getattr(getattr(server, "_local_provider", None), "_components", None)
    if not isinstance(components, Mapping):
        return []
    names = []
    for key, component in components.items():
        mode = getattr(getattr(component, "task_config", None), "mode", "forbidden")
        if str(key).startswith("tool:") and mode != "forbidden":
            names.append(str(component.name))
    return sorted(names)


def init_options(session: Any) -> Any:
    """The ``InitializationOptions`` a server session was opened with, or ``None``."""
    return getattr(session, "_init_options", None)
