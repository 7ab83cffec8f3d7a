"""``IdempotencyKeyInterceptor``: send a wrapped call's idempotency key to the MCP server.

A tool from ``langchain-mcp-adapters`` wrapped with :func:`~langchain_idempotent.idempotent`
is deduplicated on the client; when the server commits and the reply is lost, only a key
that reaches the server (and a server that deduplicates by it, see
:class:`~langchain_idempotent.integrations.mcp.McpIdempotency`) keeps the retry from paying twice::

    client = MultiServerMCPClient(connections)
    client.tool_interceptors = [IdempotencyKeyInterceptor(client)]   # or tool_interceptors=
    tools = idempotent(await client.get_tools(), store=store)

(An adapters' tool takes LangGraph's runtime, for the interceptors only: it is no
whole-state read and needs no ``key_state``; docs/keys.md.)

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

import copy
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from mcp import ClientSession, types

from ...core.context import IdempotencyContext, get_idempotency_context
from ._compat import MCPError, error_fields
from ._wire import CAPABILITY, HEADER, META_PREFIX, Via, check_prefix, check_via, error_for

if TYPE_CHECKING:
    from langchain_mcp_adapters.client import MultiServerMCPClient
    from langchain_mcp_adapters.interceptors import MCPToolCallRequest, MCPToolCallResult

__all__ = ["IdempotencyKeyInterceptor", "with_idempotency_key"]

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
        except MCPError as exc:
            message, data = error_fields(exc)
            mapped = error_for(data, message, ctx.key)
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
        self, live: ClientSession, request: MCPToolCallRequest, ctx: IdempotencyContext
    ) -> types.CallToolResult:
        # The adapters hold mcp < 2: this is mcp 1's session API (typed loosely, so mypy
        # passes on the mcp 2 set too, where the interceptor is not supported).
        session: Any = live
        v1: Any = types
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
            plain: types.CallToolResult = await session.call_tool(
                request.name, request.args, meta=meta
            )
            return plain
        params = v1.CallToolRequestParams(
            name=request.name,
            arguments=request.args,
            _meta=v1.RequestParams.Meta(**meta) if meta is not None else None,
            idempotencyKey=ctx.key,
        )
        result: Any = await session.send_request(
            v1.ClientRequest(v1.CallToolRequest(params=params)), v1.CallToolResult
        )
        if not result.isError:
            # What ClientSession.call_tool does after the call: check structured content
            # against the tool's output schema.
            await session._validate_tool_result(request.name, result)
        sent: types.CallToolResult = result
        return sent


# -- fastmcp Client (LangChain's own ``langchain.mcp``) ------------------------------------


def with_idempotency_key(client: Any, *, meta_prefix: str = META_PREFIX) -> Any:
    """``client`` (a ``fastmcp.Client``) as one that sends the idempotency key.

    LangChain's ``langchain.mcp`` calls ``client.call_tool(name, arguments,
    raise_on_error=False)`` with no ``_meta`` (and, for a client ``MCPAdapter`` armed for
    elicitation, ``client.session.call_tool(...)``), so the key of a wrapped call never
    reaches the server. The returned client shares ``client``'s connection and
    configuration; inside an idempotent call, both paths send the key, the fencing token
    and the attempt number under ``meta_prefix`` in the request's ``_meta`` (the names
    :class:`~langchain_idempotent.integrations.mcp.McpIdempotency` reads). Outside one it sends
    nothing extra. The server's idempotency errors become ours
    (:class:`~langchain_idempotent.errors.PayloadMismatchError`,
    :class:`~langchain_idempotent.errors.InProgressError`, ...)::

        from langchain.mcp import as_langchain_tool

        keyed = with_idempotency_key(client)
        async with client:
            tools = [await as_langchain_tool(t, keyed) for t in await client.list_tools()]
        tools = idempotent(tools, store=store)

    Supported on ``fastmcp>=3.4`` (``langchain.mcp`` itself needs ``fastmcp>=4``).
    """
    try:
        from fastmcp import Client
    except ImportError as exc:  # pragma: no cover - the mcp extra installs it
        raise ImportError(
            "with_idempotency_key needs fastmcp: pip install 'langchain-idempotent[mcp]'"
        ) from exc
    if not isinstance(client, Client):
        raise TypeError(
            "with_idempotency_key needs a fastmcp.Client (the client langchain.mcp's "
            f"as_langchain_tool calls through), got {type(client).__name__}"
        )
    prefix = check_prefix(meta_prefix)
    keyed = copy.copy(client)  # shares the session state: one connection, one lifecycle
    keyed.__class__ = _keyed_class(type(client))
    setattr(keyed, "_idempotency_meta_prefix", prefix)  # noqa: B010
    return keyed


def _key_meta(prefix: str, meta: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``meta`` with the current idempotent call's key, fence and attempt (``meta`` as it
    is outside an idempotent call)."""
    ctx = get_idempotency_context()
    if ctx is None:
        return None if meta is None else dict(meta)
    return {
        **(meta or {}),
        prefix + "key": ctx.key,
        prefix + "fence": ctx.fence,
        prefix + "attempt": ctx.attempt,
    }


async def _mapped(call: Awaitable[Any]) -> Any:
    """``await call``, the server's idempotency errors raised as ours."""
    try:
        return await call
    except MCPError as exc:
        ctx = get_idempotency_context()
        if ctx is None:
            raise
        message, data = error_fields(exc)
        mapped = error_for(data, message, ctx.key)
        if mapped is None:
            raise
        raise mapped from exc


class _KeyedSession:
    """A client session whose ``call_tool`` sends the key (everything else is the
    session's own)."""

    def __init__(self, session: Any, prefix: str) -> None:
        self._session = session
        self._prefix = prefix

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)

    async def call_tool(self, *args: Any, meta: Any = None, **kwargs: Any) -> Any:
        meta = _key_meta(self._prefix, meta)
        return await _mapped(self._session.call_tool(*args, meta=meta, **kwargs))


_KEYED: dict[type, type] = {}


def _keyed_class(base: type) -> type:
    """The subclass of the fastmcp ``Client`` class ``base`` that sends the key."""
    found = _KEYED.get(base)
    if found is not None:
        return found

    class KeyedClient(base):  # type: ignore[valid-type,misc]
        _idempotency_meta_prefix: str

        async def call_tool(self, *args: Any, meta: Any = None, **kwargs: Any) -> Any:
            meta = _key_meta(self._idempotency_meta_prefix, meta)
            return await _mapped(super().call_tool(*args, meta=meta, **kwargs))

        @property
        def session(self) -> Any:
            session = super().session
            if isinstance(session, _KeyedSession):
                return session
            return _KeyedSession(session, self._idempotency_meta_prefix)

    KeyedClient.__name__ = KeyedClient.__qualname__ = f"Keyed{base.__name__}"
    _KEYED[base] = KeyedClient
    return KeyedClient
