"""Bad input to the MCP pieces is refused at once, with an error that names the problem."""

from __future__ import annotations

import pytest

pytest.importorskip("langchain_mcp_adapters")

from langchain_mcp_adapters.client import MultiServerMCPClient

from langchain_idempotent import InMemoryIdempotencyStore
from langchain_idempotent.errors import InProgressError, PayloadMismatchError
from langchain_idempotent.integrations.mcp import (
    MAX_KEY_LENGTH,
    IdempotencyKeyInterceptor,
    McpIdempotency,
)
from langchain_idempotent.integrations.mcp._wire import check_key, check_prefix, error_for

STDIO = {"transport": "stdio", "command": "python", "args": ["server.py"]}
HTTP = {"transport": "streamable_http", "url": "http://127.0.0.1:9/mcp"}


def test_an_unknown_via_is_refused() -> None:
    client = MultiServerMCPClient({"bank": HTTP})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="via must be one of 'meta', 'params', 'header'"):
        IdempotencyKeyInterceptor(client, via="query")  # type: ignore[arg-type]


def test_header_is_refused_where_a_transport_would_drop_it() -> None:
    client = MultiServerMCPClient({"web": HTTP, "bank": STDIO})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match=r"cannot reach MCP server 'bank'.*'stdio'.*via='meta'"):
        IdempotencyKeyInterceptor(client, via="header")
    IdempotencyKeyInterceptor(MultiServerMCPClient({"web": HTTP}), via="header")  # type: ignore[dict-item]


async def test_header_is_refused_on_a_live_session() -> None:
    import anyio
    from mcp import ClientSession

    send, receive = anyio.create_memory_object_stream[object](1)
    session = ClientSession(receive, send)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"live ClientSession.*dropped silently"):
        IdempotencyKeyInterceptor(session, via="header")
    IdempotencyKeyInterceptor(session)  # meta works on a live session
    send.close()
    receive.close()


def test_the_interceptor_needs_a_client_or_a_session() -> None:
    with pytest.raises(TypeError, match="MultiServerMCPClient or a ClientSession, got dict"):
        IdempotencyKeyInterceptor({"bank": HTTP})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "prefix",
    ["io.modelcontextprotocol/", "dev.mcp.tools/", "mcp.example/", "com.Example.MCP.x/"],
)
def test_a_reserved_meta_prefix_is_refused(prefix: str) -> None:
    with pytest.raises(ValueError, match="reserved by MCP"):
        check_prefix(prefix)
    with pytest.raises(ValueError, match="reserved by MCP"):
        McpIdempotency(InMemoryIdempotencyStore(), meta_prefix=prefix)


@pytest.mark.parametrize("prefix", ["no-slash", "1bad.label/", "a..b/", "/", 7])
def test_a_malformed_meta_prefix_is_refused(prefix: object) -> None:
    with pytest.raises(ValueError, match="_meta prefix"):
        check_prefix(prefix)


def test_an_unreserved_prefix_is_accepted() -> None:
    assert check_prefix("com.example.tools/") == "com.example.tools/"


@pytest.mark.parametrize(
    ("key", "problem"),
    [
        (42, "must be a string, got int"),
        ("", "must not be empty"),
        ("k" * (MAX_KEY_LENGTH + 1), f"256 characters long; at most {MAX_KEY_LENGTH}"),
        ("a\nb", "printable"),
    ],
)
def test_a_bad_key_is_refused_with_its_fault(key: object, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        check_key(key)


def test_server_options_are_checked() -> None:
    store = InMemoryIdempotencyStore()
    with pytest.raises(ValueError, match="on_busy must be 'wait' or 'reject'"):
        McpIdempotency(store, on_busy="queue")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="list of tool names, got the string 'refund'"):
        McpIdempotency(store, tools="refund")
    with pytest.raises(ValueError, match="wait_timeout has no use with on_busy='reject'"):
        McpIdempotency(store, on_busy="reject", wait_timeout=5)
    with pytest.raises(TypeError, match="unknown idempotency option"):
        McpIdempotency(store, leese=5)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="installs on an MCP server"):
        McpIdempotency(store).install(object())


def test_one_mcp_idempotency_per_server() -> None:
    from mcp.server.fastmcp import FastMCP

    server = FastMCP("refunds")
    first = McpIdempotency(InMemoryIdempotencyStore())
    first.install(server)
    first.install(server)  # the same one again: nothing changes
    with pytest.raises(ValueError, match="already has an McpIdempotency"):
        McpIdempotency(InMemoryIdempotencyStore()).install(server)


def test_the_servers_error_types_map_to_ours() -> None:
    conflict = error_for({"type": "idempotency_key_conflict"}, "used", "k")
    assert isinstance(conflict, PayloadMismatchError)
    assert conflict.key == "k"
    assert isinstance(
        error_for({"type": "idempotency_key_in_progress"}, "busy", "k"), InProgressError
    )
    assert error_for({"type": "something_else"}, "x", "k") is None
    assert error_for(None, "x", "k") is None
