"""``McpIdempotency`` on a real MCP server process: what it reads, stores, replays, refuses.

Servers (streamable HTTP on loopback, one per kind for the module): FastMCP with the
middleware, the mcp SDK's own FastMCP with ``install()`` and ``require_key=True``, a
plain FastMCP, and one whose store (Redis) is down. Raw ``ClientSession`` calls craft
exactly the request each test needs; the interceptor tests go through the adapters.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langchain_mcp_adapters")
pytest.importorskip("fastmcp")

from mcp import types
from mcp.shared.exceptions import McpError

from langchain_idempotent import StoreUnavailableError, idempotency_scope
from langchain_idempotent.integrations.mcp import CAPABILITY, META_PREFIX
from tests.support.mcp_bank import Bank
from tests.support.processes import free_port

KEY = META_PREFIX + "key"


def start(root: Path, name: str, *args: str, ours: bool = True) -> Bank:
    directory = root / name
    directory.mkdir()
    argv = ["--rows", str(directory / "rows.db"), "--events", str(directory / "events.log")]
    if ours and "--store-url" not in args:
        argv += ["--store", str(directory / "idem.db")]
    return Bank(directory, "http", [*argv, *args])


@pytest.fixture(scope="module")
def banks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Bank]]:
    root = tmp_path_factory.mktemp("mcp-banks")
    started = {
        "ours": start(root, "ours"),
        "sdk": start(root, "sdk", "--sdk", "--require-key"),
        "plain": start(root, "plain", ours=False),
        "down": start(root, "down", "--store-url", f"redis://127.0.0.1:{free_port()}/0"),
    }
    try:
        yield started
    finally:
        for bank in started.values():
            bank.close()


async def call(bank: Bank, args: dict[str, Any], **params: Any) -> types.CallToolResult:
    """One ``tools/call`` of ``refund`` with exactly these extra params (``_meta``,
    ``idempotencyKey``)."""
    failure: McpError | None = None
    async with bank.client().session("bank") as session:
        request = types.CallToolRequestParams(name="refund", arguments=args, **params)
        try:
            return await session.send_request(
                types.ClientRequest(types.CallToolRequest(params=request)), types.CallToolResult
            )
        except McpError as exc:  # raised outside: the session's task group would wrap it
            failure = exc
    raise failure


def meta(**entries: Any) -> dict[str, Any]:
    return {"_meta": types.RequestParams.Meta(**entries)}


@pytest.mark.parametrize("kind", ["ours", "sdk"])
async def test_the_server_advertises_tools_idempotency(banks: dict[str, Bank], kind: str) -> None:
    async with banks[kind].client().session("bank") as session:
        tools = session.get_server_capabilities().tools  # type: ignore[union-attr]
    assert tools is not None
    assert (tools.model_extra or {})[CAPABILITY] == {
        "onBusy": "wait",
        "metaPrefix": META_PREFIX,
        "tools": ["refund"],
    }
    async with banks["plain"].client().session("bank") as session:
        plain = session.get_server_capabilities().tools  # type: ignore[union-attr]
    assert CAPABILITY not in (plain.model_extra or {})  # type: ignore[union-attr]


@pytest.mark.parametrize("kind", ["ours", "sdk"])
async def test_a_key_in_meta_or_in_params_replays_the_whole_result(
    banks: dict[str, Bank], kind: str
) -> None:
    bank = banks[kind]
    before = bank.rows.count()
    first = await call(bank, {"order_id": f"{kind}-1", "amount": 140}, **meta(**{KEY: "k-1"}))
    again = await call(bank, {"order_id": f"{kind}-1", "amount": 140.0}, idempotencyKey="k-1")
    assert bank.rows.count() == before + 1
    assert again == first  # content, structured content, isError: 140 and 140.0 are one call
    assert first.structuredContent is not None
    assert first.structuredContent["order_id"] == f"{kind}-1"


async def test_an_error_result_is_stored_and_replayed_as_an_error(banks: dict[str, Bank]) -> None:
    bank = banks["ours"]
    first = await call(bank, {"order_id": "neg", "amount": -1}, **meta(**{KEY: "k-neg"}))
    again = await call(bank, {"order_id": "neg", "amount": -1}, **meta(**{KEY: "k-neg"}))
    assert first.isError
    assert "must be positive" in first.content[0].text  # type: ignore[union-attr]
    assert again == first
    assert bank.event_kinds().count("replay") >= 1


async def test_the_same_key_with_other_arguments_is_a_conflict_error(
    banks: dict[str, Bank],
) -> None:
    bank = banks["ours"]
    await call(bank, {"order_id": "c-1", "amount": 140}, **meta(**{KEY: "k-c"}))
    before = bank.rows.count()
    with pytest.raises(McpError) as refused:
        await call(bank, {"order_id": "c-1", "amount": 150}, **meta(**{KEY: "k-c"}))
    assert refused.value.error.code == types.INVALID_PARAMS
    assert refused.value.error.data == {"type": "idempotency_key_conflict", "idempotencyKey": "k-c"}
    assert bank.rows.count() == before


@pytest.mark.parametrize(
    ("params", "problem"),
    [
        ({"idempotencyKey": "k" * 256}, "256 characters long"),
        ({"idempotencyKey": 7}, "must be a string, got int"),
        (meta(**{KEY: ""}), "must not be empty"),
        ({"idempotencyKey": "a", **meta(**{KEY: "b"})}, "different idempotency keys"),
    ],
)
async def test_a_bad_key_is_an_invalid_key_error_and_nothing_runs(
    banks: dict[str, Bank], params: dict[str, Any], problem: str
) -> None:
    bank = banks["ours"]
    before = bank.rows.count()
    with pytest.raises(McpError, match=problem) as refused:
        await call(bank, {"order_id": "bad", "amount": 1}, **params)
    assert refused.value.error.data == {"type": "idempotency_key_invalid"}
    assert bank.rows.count() == before


async def test_without_a_key_a_call_runs_as_usual_unless_a_key_is_required(
    banks: dict[str, Bank],
) -> None:
    ours = banks["ours"]
    before = ours.rows.count()
    await call(ours, {"order_id": "nokey", "amount": 1})
    await call(ours, {"order_id": "nokey", "amount": 1})
    assert ours.rows.count() == before + 2
    sdk = banks["sdk"]
    before = sdk.rows.count()
    with pytest.raises(McpError, match="requires an idempotency key") as refused:
        await call(sdk, {"order_id": "nokey", "amount": 1})
    assert refused.value.error.data == {"type": "idempotency_key_required"}
    assert sdk.rows.count() == before


async def test_a_store_outage_fails_closed_with_an_error_that_says_so(
    banks: dict[str, Bank],
) -> None:
    bank = banks["down"]
    with pytest.raises(McpError, match="idempotency store is unavailable, so the tool was not run"):
        await call(bank, {"order_id": "down", "amount": 1}, **meta(**{KEY: "k-down"}))
    tool = await bank.tool()
    with idempotency_scope("ticket-down"), pytest.raises(StoreUnavailableError, match="MCP server"):
        await tool.ainvoke({"order_id": "down", "amount": 1})
    assert bank.rows.count() == 0


async def test_outside_an_idempotent_call_the_interceptor_sends_nothing(
    banks: dict[str, Bank],
) -> None:
    bank = banks["ours"]
    events = len(bank.event_kinds())
    raw = await bank.raw_tool()
    await raw.ainvoke({"order_id": "raw", "amount": 1})
    await raw.ainvoke({"order_id": "raw", "amount": 1})
    assert bank.rows.count("raw") == 2
    assert len(bank.event_kinds()) == events  # the server's engine never saw a key


@pytest.mark.parametrize("via", ["meta", "params", "header"])
async def test_each_way_of_sending_the_key_reaches_the_server(
    banks: dict[str, Bank], via: str
) -> None:
    bank = banks["ours"]
    order = f"via-{via}"
    raw = (await bank.client(via=via).get_tools())[0]
    from langchain_idempotent import InMemoryIdempotencyStore, idempotent

    with idempotency_scope(f"ticket-{via}"):
        for _ in range(2):  # two client hosts, one key
            tool = idempotent(raw, store=InMemoryIdempotencyStore(), key_state=())
            await tool.ainvoke({"order_id": order, "amount": 140})
    assert bank.rows.count(order) == 1


async def test_params_is_refused_when_the_server_does_not_advertise_it(
    banks: dict[str, Bank],
) -> None:
    bank = banks["plain"]
    raw = (await bank.client(via="params").get_tools())[0]
    from langchain_idempotent import InMemoryIdempotencyStore, idempotent

    tool = idempotent(raw, store=InMemoryIdempotencyStore(), key_state=())
    with (
        idempotency_scope("ticket-params"),
        pytest.raises(ValueError, match=r"does not advertise capabilities\.tools\.idempotency"),
    ):
        await tool.ainvoke({"order_id": "params", "amount": 1})
    assert bank.rows.count("params") == 0


# -- the private MCP attributes langchain_idempotent/integrations/mcp/_compat.py reads -------------


@pytest.mark.parametrize("package", ["fastmcp", "mcp.server.fastmcp"])
def test_both_fastmcps_keep_their_low_level_server_where_the_shim_installs(package: str) -> None:
    import importlib

    from mcp.server.lowlevel import Server

    from langchain_idempotent.integrations.mcp._compat import lowlevel_server

    server = importlib.import_module(package).FastMCP("compat")
    lowlevel = lowlevel_server(server)
    assert isinstance(lowlevel, Server), (
        f"{package}.FastMCP moved _mcp_server: update mcp/_compat.py"
    )
    assert isinstance(lowlevel.request_handlers, dict)
    assert lowlevel_server(lowlevel) is lowlevel


def test_a_server_session_keeps_the_options_it_was_opened_with() -> None:
    import anyio
    from mcp.server.models import InitializationOptions
    from mcp.server.session import ServerSession

    from langchain_idempotent.integrations.mcp._compat import init_options

    options = InitializationOptions(
        server_name="compat", server_version="0", capabilities=types.ServerCapabilities()
    )
    send, receive = anyio.create_memory_object_stream[Any](1)
    session = ServerSession(receive, send, options)
    assert init_options(session) is options, (
        "ServerSession moved _init_options: update mcp/_compat.py"
    )
    assert init_options(object()) is None
