"""``IdempotencyKeyInterceptor``: send a wrapped call's idempotency key to the MCP server.

A tool from ``langchain-mcp-adapters`` wrapped with :func:`~langchain_idempotent.idempotent`
is deduplicated on the client; when the server commits and the reply is lost, only a key
that reaches the server (and a server that deduplicates by it, see
:class:`~langchain_idempotent.mcp.McpIdempotency`) keeps the retry from paying twice::

    client = MultiServerMCPClient(connections)
    client.tool_interceptors = [IdempotencyKeyInterceptor(client)]   # or tool_interceptors=
    tools = idempotent(await client.get_tools(), store=store, key_state=())

(``key_state=()``: an adapters' tool takes LangGraph's runtime, so it is given the whole
state, which the server's effect does not depend on; docs/keys.md.)

Inside a wrapped call the interceptor sends the key, the fencing token and the attempt
number under one ``_meta`` prefix (``dev.langchain-idempotent/key``, ``.../fence``,
``.../attempt``), and SEP-3182's ``params.idempotencyKey`` too when the server advertises
``capabilities.tools.idempotency``. The adapters' handler cannot send ``_meta`` (their
issue #410), so the interceptor makes the call itself, on a fresh session from the
client's connection (as the adapters do) or on the live session it was given. Outside a
wrapped call it sends nothing and leaves the call to the adapters.

``via="params"`` sends only SEP-3182's field and refuses a server that does not
advertise it; ``via="header"`` sends the ``Idempotency-Key`` HTTP header and is refused
where the adapters would drop it silently (stdio, a live session).

The server's answers become ours: ``idempotency_key_conflict`` raises
:class:`~langchain_idempotent.errors.PayloadMismatchError` (the engine stores it, so a
retry does not ask again), ``idempotency_key_in_progress`` raises
:class:`~langchain_idempotent.errors.InProgressError` (the key is released: retry later).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from mcp import ClientSession, types
from mcp.shared.exceptions import McpError

from ..context import IdempotencyContext, get_idempotency_context
from ._wire import CAPABILITY, HEADER, META_PREFIX, Via, check_prefix, check_via, error_for

if TYPE_CHECKING:
    from langchain_mcp_adapters.client import MultiServerMCPClient
    from langchain_mcp_adapters.interceptors import MCPToolCallRequest, MCPToolCallResult

__all__ = ["IdempotencyKeyInterceptor"]

_HTTP = ("sse", "http", "streamable_http", "streamable-http")


class IdempotencyKeyInterceptor:
    """A ``MultiServerMCPClient`` tool interceptor that sends the idempotency key.

    ``client``: the ``MultiServerMCPClient`` whose connections the calls use, or a live
    ``ClientSession`` (tools loaded with ``load_mcp_tools(session, ...)``). ``via``:
    ``"meta"`` (default; every transport), ``"params"`` (SEP-3182 only) or ``"header"``
    (HTTP with a fresh session per call only). ``meta_prefix``: the reverse-DNS prefix of
    the ``_meta`` entries (it must match the server's).
    """

    def __init__(
        self,
        client: MultiServerMCPClient | ClientSession,
        *,
        via: Via = "meta",
        meta_prefix: str = META_PREFIX,
    ) -> None:
        self.via: Via = check_via(via)
        self.meta_prefix = check_prefix(meta_prefix)
        self._session: ClientSession | None = None
        self._client: MultiServerMCPClient | None = None
        if isinstance(client, ClientSession):
            if via == "header":
                raise ValueError(
                    "via='header' on a live ClientSession: the adapters send headers only "
                    "when they open a session per call, so the key would be dropped silently; "
                    "use via='meta'"
                )
            self._session = client
        elif isinstance(getattr(client, "connections", None), dict):
            self._client = client
            if via == "header":
                for name in client.connections:
                    self._check_header_transport(name)
        else:
            raise TypeError(
                "IdempotencyKeyInterceptor needs a MultiServerMCPClient or a ClientSession, "
                f"got {type(client).__name__}"
            )

    def _check_header_transport(self, server: str) -> None:
        assert self._client is not None
        transport = self._client.connections[server].get("transport")
        if transport not in _HTTP:
            raise ValueError(
                f"via='header' cannot reach MCP server {server!r}: its transport is "
                f"{transport!r} and headers travel only over HTTP, so the key would be "
                "dropped silently; use via='meta'"
            )

    async def __call__(
        self,
        request: MCPToolCallRequest,
        handler: Callable[[MCPToolCallRequest], Awaitable[MCPToolCallResult]],
    ) -> MCPToolCallResult:
        ctx = get_idempotency_context()
        if ctx is None:
            return await handler(request)  # not an idempotent call: nothing to send
        try:
            if self.via == "header":
                if self._client is not None and request.server_name in self._client.connections:
                    self._check_header_transport(request.server_name)
                headers = {
                    **(request.headers or {}),
                    HEADER: ctx.key,
                    "Idempotency-Fence": str(ctx.fence),
                    "Idempotency-Attempt": str(ctx.attempt),
                }
                return await handler(request.override(headers=headers))
            if self._session is not None:
                return await self._send(self._session, request, ctx)
            return await self._send_fresh(request, ctx)
        except McpError as exc:
            mapped = error_for(exc.error.data, exc.error.message, ctx.key)
            if mapped is None:
                raise
            raise mapped from exc

    async def _send_fresh(
        self, request: MCPToolCallRequest, ctx: IdempotencyContext
    ) -> types.CallToolResult:
        from langchain_mcp_adapters.sessions import create_session

        assert self._client is not None
        connection = self._client.connections.get(request.server_name)
        if connection is None:
            raise ValueError(
                f"MCP server {request.server_name!r} is not one of this client's "
                f"connections ({', '.join(self._client.connections)})"
            )
        failure: BaseException | None = None
        result: types.CallToolResult | None = None
        async with create_session(connection) as session:
            await session.initialize()
            try:
                result = await self._send(session, request, ctx)
            except Exception as exc:
                # Raised outside the session: closing it can swallow an exception raised
                # inside (the adapters work around the same SDK behaviour).
                failure = exc
        if failure is not None:
            raise failure
        assert result is not None
        return result

    async def _send(
        self, session: ClientSession, request: MCPToolCallRequest, ctx: IdempotencyContext
    ) -> types.CallToolResult:
        capabilities = session.get_server_capabilities()
        tools = capabilities.tools if capabilities is not None else None
        advertised = tools is not None and CAPABILITY in (tools.model_extra or {})
        if self.via == "params" and not advertised:
            raise ValueError(
                f"MCP server {request.server_name!r} does not advertise "
                f"capabilities.tools.{CAPABILITY}, so it would ignore params.idempotencyKey; "
                "use via='meta'"
            )
        meta: dict[str, Any] | None = None
        if self.via == "meta":
            prefix = self.meta_prefix
            meta = {
                prefix + "key": ctx.key,
                prefix + "fence": ctx.fence,
                prefix + "attempt": ctx.attempt,
            }
        if not advertised:
            return await session.call_tool(request.name, request.args, meta=meta)
        params = types.CallToolRequestParams(
            name=request.name,
            arguments=request.args,
            _meta=types.RequestParams.Meta(**meta) if meta is not None else None,  # type: ignore[call-arg]
            idempotencyKey=ctx.key,  # type: ignore[call-arg]
        )
        result = await session.send_request(
            types.ClientRequest(types.CallToolRequest(params=params)), types.CallToolResult
        )
        if not result.isError:
            # What ClientSession.call_tool does after the call: check structured content
            # against the tool's output schema.
            await session._validate_tool_result(request.name, result)
        return result
