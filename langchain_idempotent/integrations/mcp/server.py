"""``McpIdempotency``: an MCP server that runs each ``tools/call`` once per idempotency key.

Three lines for a server author, on `FastMCP <https://gofastmcp.com>`_ (as middleware)::

    mcp = FastMCP("refunds")
    mcp.add_middleware(McpIdempotency(SqliteIdempotencyStore("idem.db"), tools=["refund"]))

and on the ``mcp`` SDK's own ``FastMCP`` (no middleware there), or a low-level
``mcp.server.lowlevel.Server``, by installing it on the server::

    mcp = FastMCP("refunds")
    McpIdempotency(SqliteIdempotencyStore("idem.db"), tools=["refund"]).install(mcp)

How it works. It wraps the low-level server's ``CallToolRequest`` handler (the one place
that sees the whole request, ``params.idempotencyKey`` included, on every transport, and
the only place an error can still leave as a JSON-RPC error with ``error.data``: inside
it the SDK turns every exception into an ``isError`` text result). As FastMCP middleware
it installs that wrapper when the first session initializes. For a call to a protected
tool that carries a key (``_meta["<prefix>key"]``, SEP-3182's ``params.idempotencyKey``
or, over HTTP, the ``Idempotency-Key`` header), the project's
:class:`~langchain_idempotent.core.engine.Engine` runs the handler once per record key

    mcp|<namespace>|<authenticated client id or "anonymous">|<key>

with the fingerprint of the tool name and its RFC 8785 canonical arguments (``140`` and
``140.0`` are one call), and stores the whole ``CallToolResult`` (content, structured
content, ``isError``) to replay it. Leases, takeovers, ``reconcile=`` and
``transactional=`` are the engine's, unchanged. A call without a key runs as usual
(``require_key=True`` refuses it). The server advertises ``capabilities.tools.idempotency``.

Answers, as JSON-RPC errors with ``error.data.type`` (see :mod:`._wire`): another payload
under a used key is ``idempotency_key_conflict``; a key whose first call is still
running is waited for (``on_busy="wait"``, up to ``wait_timeout``) or answered at once
with ``idempotency_key_in_progress`` (``on_busy="reject"``, SEP-3182's behaviour); an
unreachable store is ``idempotency_store_unavailable`` and the tool does not run.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any, Final, Literal, Unpack

from mcp import types

from ...core.canonical import canonical_json
from ...core.engine import Engine, Unmemoized
from ...core.events import EventHook
from ...core.policy import Policy, PolicyOptions
from ...core.reconcile import ReconcileCall, ReconcileOption, Reconciler, check_reconcile
from ...core.store import BaseIdempotencyStore
from ...errors import (
    InProgressError,
    OutcomeUnknownError,
    PayloadMismatchError,
    StoreUnavailableError,
)
from ._compat import (
    MCP_MAJOR,
    background_task_tools,
    call_tool_handler,
    call_wrapped,
    handlers_of,
    init_options,
    lowlevel_server,
    make_error,
    meta_dict,
    set_call_tool_handler,
)
from ._wire import (
    CAPABILITY,
    EXTENSION,
    HEADER,
    META_PREFIX,
    check_key,
    check_prefix,
    error_data,
)

__all__ = ["McpIdempotency"]

OnBusy = Literal["wait", "reject"]

#: JSON-RPC code of "a call with this key is still running" (a server-defined code).
IN_PROGRESS_CODE: Final = -32003
_INSTALLED: Final = "_langchain_idempotent_mcp"


class McpIdempotency:
    """Deduplicate an MCP server's ``tools/call`` requests by idempotency key.

    ``store``: where records live (a store every server process shares, e.g.
    ``SqliteIdempotencyStore`` on one host, Redis or PostgreSQL across hosts).
    ``tools``: the tool names to protect (default: all). ``namespace``: separates
    servers or tenants sharing a store; records are also scoped by the authenticated
    client (``client_id=`` overrides how it is found). ``on_busy``: ``"wait"`` for the
    running call's result or ``"reject"`` with ``idempotency_key_in_progress``.
    ``require_key``: refuse protected calls that carry no key. ``meta_prefix``: the
    ``_meta`` prefix the key is read under. ``store_errors``: also store (and replay)
    ``isError`` results; with ``False`` such a result frees the key so a retry runs.
    ``reconcile`` / ``transactional`` and the other options are the engine's
    (:class:`~langchain_idempotent.core.policy.Policy`).
    """

    def __init__(
        self,
        store: BaseIdempotencyStore,
        *,
        tools: Collection[str] | None = None,
        on_busy: OnBusy = "wait",
        require_key: bool = False,
        meta_prefix: str = META_PREFIX,
        store_errors: bool = True,
        client_id: Callable[[], str | None] | None = None,
        on_event: EventHook | None = None,
        **options: Unpack[PolicyOptions],
    ) -> None:
        if on_busy not in ("wait", "reject"):
            raise ValueError(f"on_busy must be 'wait' or 'reject', got {on_busy!r}")
        if isinstance(tools, str):
            raise TypeError(f"tools must be a list of tool names, got the string {tools!r}")
        if "wait_timeout" in options and on_busy == "reject":
            raise ValueError("wait_timeout has no use with on_busy='reject' (it never waits)")
        if on_busy == "reject":
            options["wait_timeout"] = 0
        options.setdefault("namespace", "mcp")
        if "reconcile" in options:
            options["reconcile"] = _results_of(options["reconcile"])
        policy = Policy().with_options(**options)
        self.engine = Engine(store, policy, on_event=on_event)
        self.tools: frozenset[str] | None = None if tools is None else frozenset(tools)
        self.on_busy: OnBusy = on_busy
        self.require_key = require_key
        self.meta_prefix = check_prefix(meta_prefix)
        self.store_errors = store_errors
        self._client_id = client_id or _authenticated_client

    # -- installing ----------------------------------------------------------------------

    def install(self, server: Any) -> Any:
        """Protect ``server`` (a ``fastmcp.FastMCP``, the SDK's ``FastMCP`` / ``MCPServer`` or a
        low-level ``Server``) and return it. A protected fastmcp tool that may run as a
        background task (``task=True``) is refused: its elicitation rounds and result travel
        in ``tasks/*`` requests, which this middleware does not follow. Installing the same
        instance twice does nothing; a second ``McpIdempotency`` on one server is refused (one
        would run inside the other)."""
        lowlevel = lowlevel_server(server)
        if handlers_of(lowlevel) is None:
            raise TypeError(
                "McpIdempotency installs on an MCP server (fastmcp.FastMCP, the SDK's "
                "FastMCP / MCPServer or mcp.server.lowlevel.Server), got "
                f"{type(server).__name__}"
            )
        installed = getattr(lowlevel, _INSTALLED, None)
        if installed is self:
            return server
        if installed is not None:
            raise ValueError(
                "this server already has an McpIdempotency; use one per server (give it "
                "every tool to protect in tools=[...])"
            )
        if call_tool_handler(lowlevel) is None:
            raise ValueError("this server has no tools/call handler yet; register tools first")
        tasks = [
            name
            for name in background_task_tools(server)
            if self.tools is None or name in self.tools
        ]
        if tasks:
            raise ValueError(
                f"McpIdempotency cannot follow tool(s) {tasks}: they may run as background "
                "tasks (task=True), whose input requests (elicitation) and result travel in "
                "tasks/* requests this middleware does not see, so a resumed or re-sent call "
                "could run twice; register them with task=False, or leave them out of tools=[...]"
            )
        set_call_tool_handler(lowlevel, self._shim)
        original = lowlevel.get_capabilities

        def get_capabilities(*args: Any, **kwargs: Any) -> types.ServerCapabilities:
            return self.advertise(original(*args, **kwargs))

        lowlevel.get_capabilities = get_capabilities
        setattr(lowlevel, _INSTALLED, self)
        return server

    def __call__(self, *args: Any) -> Any:
        """``McpIdempotency(...)(server)`` installs and returns the server; called by FastMCP
        as middleware (``context, call_next``) it installs on the first message it sees
        (``initialize``, or on protocol 2026-07-28 ``server/discover`` or any request)."""
        if len(args) == 1:
            return self.install(args[0])
        context, call_next = args
        return self._on_message(context, call_next)

    async def _on_message(self, context: Any, call_next: Callable[[Any], Awaitable[Any]]) -> Any:
        fastmcp_context: Any = getattr(context, "fastmcp_context", None)
        server = getattr(fastmcp_context, "fastmcp", None)
        if server is None:
            return await call_next(context)
        lowlevel = lowlevel_server(server)
        if getattr(lowlevel, _INSTALLED, None) is self:
            return await call_next(context)
        self.install(server)
        if context.method == "tools/call":
            # A stateless request (2026-07-28) reached the server before any other: the
            # SDK had already picked the unwrapped handler, so run the wrapped one here.
            return await self._first_call(lowlevel, fastmcp_context, context.message)
        if context.method == "initialize":
            # This session's options were made before the install: advertise here too.
            options = init_options(fastmcp_context.session)
            if options is not None:
                options.capabilities = self.advertise(options.capabilities)
        return await call_next(context)

    async def _first_call(self, lowlevel: Any, fastmcp_context: Any, params: Any) -> Any:
        from fastmcp.tools import ToolResult

        result = await call_wrapped(lowlevel, fastmcp_context.request_context, params)
        if not isinstance(result, types.CallToolResult):
            return result
        dumped = result.model_dump(mode="json", by_alias=True, exclude_none=True)
        return ToolResult(
            content=result.content,
            structured_content=dumped.get("structuredContent"),
            meta=dumped.get("_meta"),
            is_error=bool(dumped.get("isError")),
        )

    def advertise(self, capabilities: types.ServerCapabilities) -> types.ServerCapabilities:
        """``capabilities`` with ``tools.idempotency`` set (SEP-3182's capability)."""
        if capabilities.tools is None:
            return capabilities
        detail: dict[str, Any] = {"onBusy": self.on_busy, "metaPrefix": self.meta_prefix}
        if self.tools is not None:
            detail["tools"] = sorted(self.tools)
        tools = capabilities.tools.model_copy(update={CAPABILITY: detail})
        update: dict[str, Any] = {"tools": tools}
        if MCP_MAJOR >= 2:
            # mcp 2's ToolsCapability drops fields it does not know: say it as an
            # extension (SEP-2133) too, which the SDK carries.
            extensions = dict(getattr(capabilities, "extensions", None) or {})
            update["extensions"] = {**extensions, EXTENSION: detail}
        return capabilities.model_copy(update=update)

    # -- one call ------------------------------------------------------------------------

    async def _shim(
        self,
        params: types.CallToolRequestParams,
        raw: Mapping[str, Any],
        http_request: Any,
        inner: Callable[[], Awaitable[Any]],
    ) -> Any:
        if self.tools is not None and params.name not in self.tools:
            return await inner()
        key = self._key_of(params, raw, http_request)
        if key is None:
            if self.require_key:
                raise make_error(
                    types.INVALID_PARAMS,
                    f"tool {params.name!r} requires an idempotency key "
                    f"(params.idempotencyKey or _meta[{self.meta_prefix + 'key'!r}])",
                    error_data("idempotency_key_required"),
                )
            return await inner()
        return await self._run(key, params, inner)

    async def _run(
        self, key: str, params: types.CallToolRequestParams, inner: Callable[[], Awaitable[Any]]
    ) -> Any:
        arguments = params.arguments or {}
        client = self._client_id() or "anonymous"
        record_key = f"mcp|{self.engine.policy.namespace}|{client}|{key}"
        fingerprint = hashlib.sha256(
            canonical_json({"tool": params.name, "arguments": arguments})
        ).hexdigest()

        async def action() -> Any:
            result = await inner()
            if not isinstance(result, types.CallToolResult):
                return Unmemoized(result)  # a task handle (SEP-1686): not a result
            dumped = result.model_dump(mode="json", by_alias=True, exclude_none=True)
            if dumped.get("isError") and not self.store_errors:
                return Unmemoized(dumped, error="mcp.CallToolResult[isError]")
            return dumped

        try:
            value = await self.engine.arun(
                record_key,
                fingerprint=fingerprint,
                action=action,
                tool=params.name,
                args=arguments,
                meta={"mcp_tool": params.name, "mcp_client": client},
            )
        except PayloadMismatchError as exc:
            raise _error(types.INVALID_PARAMS, "idempotency_key_conflict", exc, key) from exc
        except InProgressError as exc:
            raise _error(IN_PROGRESS_CODE, "idempotency_key_in_progress", exc, key) from exc
        except StoreUnavailableError as exc:
            message = f"the idempotency store is unavailable, so the tool was not run: {exc}"
            raise make_error(
                types.INTERNAL_ERROR,
                message,
                error_data("idempotency_store_unavailable", idempotencyKey=key),
            ) from exc
        except OutcomeUnknownError as exc:
            raise _error(types.INTERNAL_ERROR, "idempotency_outcome_unknown", exc, key) from exc
        if isinstance(value, dict):
            return types.CallToolResult.model_validate(value)
        return value

    def _key_of(
        self, params: types.CallToolRequestParams, raw: Mapping[str, Any], http_request: Any
    ) -> str | None:
        """The key this request carries, checked; ``None`` without one. Bad keys are an
        ``idempotency_key_invalid`` error."""
        found: list[tuple[str, object]] = []
        if "idempotencyKey" in raw:
            found.append(("params.idempotencyKey", raw["idempotencyKey"]))
        meta = meta_dict(params.meta)
        if self.meta_prefix + "key" in meta:
            found.append((f"_meta[{self.meta_prefix + 'key'!r}]", meta[self.meta_prefix + "key"]))
        headers: Mapping[str, str] | None = getattr(http_request, "headers", None)
        header = None if headers is None else headers.get(HEADER)
        if header is not None:
            found.append((f"the {HEADER} header", header))
        if not found:
            return None
        keys: dict[str, str] = {}
        for where, value in found:
            try:
                keys[where] = check_key(value)
            except ValueError as exc:
                raise make_error(
                    types.INVALID_PARAMS, f"{where}: {exc}", error_data("idempotency_key_invalid")
                ) from None
        if len(set(keys.values())) > 1:
            raise make_error(
                types.INVALID_PARAMS,
                f"the request carries different idempotency keys in {', '.join(keys)}",
                error_data("idempotency_key_invalid"),
            )
        return next(iter(keys.values()))


def _results_of(option: ReconcileOption | None) -> ReconcileOption | None:
    """``reconcile=`` with each hook's answer turned into a stored MCP result: a
    ``CallToolResult`` as it is, a ``dict`` as structured content (and its JSON text),
    anything else as text; ``None`` (the effect did not happen) stays ``None``."""
    check_reconcile(option)
    if option is None:
        return None
    if isinstance(option, Mapping):
        return {name: _result_hook(hook) for name, hook in option.items()}
    return _result_hook(option)


def _result_hook(hook: Reconciler) -> Reconciler:
    async def reconcile(call: ReconcileCall) -> Any:
        found = hook(call)
        if inspect.isawaitable(found):
            found = await found
        if found is None:
            return None
        if not isinstance(found, types.CallToolResult):
            if isinstance(found, dict):
                text = json.dumps(found, indent=2)
                content = [{"type": "text", "text": text}]
                found = types.CallToolResult.model_validate(
                    {"content": content, "structuredContent": found}
                )
            else:
                found = types.CallToolResult(
                    content=[types.TextContent(type="text", text=str(found))]
                )
        return found.model_dump(mode="json", by_alias=True, exclude_none=True)

    return reconcile


def _error(code: int, kind: Any, exc: Exception, key: str) -> Exception:
    return make_error(code, str(exc), error_data(kind, idempotencyKey=key))


def _authenticated_client() -> str | None:
    """The OAuth client id of the request, where the server authenticates clients."""
    from mcp.server.auth.middleware.auth_context import get_access_token

    token = get_access_token()
    return token.client_id if token is not None else None
