"""MCP through a ``fastmcp.Client`` (what LangChain's own ``langchain.mcp`` calls through),
on either supported set: mcp 1 / fastmcp 3 (the main environment) and mcp 2 / fastmcp 4
(CI's second environment, ``.ci/mcp2``).

Real refund server processes (:mod:`tests.support.mcp_refund_server`, a SQLite "bank"),
over streamable HTTP and stdio, with ``McpIdempotency`` installed as FastMCP middleware
(or, ``--sdk``, on the SDK's own server). The recipe under test::

    tools = idempotent([await as_langchain_tool(t, with_idempotency_key(client)) ...])

and its plain twin (``as_langchain_tool(t, client)``: the key never reaches the server)
shows the duplicate it prevents: a reply lost after the commit is paid twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastmcp")

from fastmcp import Client
from langchain_core.tools import BaseTool

from langchain_idempotent import (
    IdempotencyError,
    InMemoryIdempotencyStore,
    PayloadMismatchError,
    idempotency_scope,
    idempotent,
)
from langchain_idempotent.integrations.mcp import (
    CAPABILITY,
    EXTENSION,
    META_PREFIX,
    with_idempotency_key,
)
from langchain_idempotent.integrations.mcp._compat import MCP_MAJOR, MCPError
from tests.support.mcp_bank import LOST_REPLY_TIMEOUT_S, Bank, bank, retried

KEY = META_PREFIX + "key"
REFUND = {"order_id": "A-1", "amount": 140}
#: stdio spawns a server process per session (seconds each on a busy machine): slow.
TRANSPORTS = ["http", pytest.param("stdio", marks=pytest.mark.slow)]


def langchain_mcp() -> Any:
    """``langchain.mcp`` (LangChain >= 1.5 with fastmcp >= 4), or skip."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pytest.importorskip("langchain.mcp", reason="langchain.mcp needs fastmcp>=4")


async def tool_of(the_bank: Bank, *, keyed: bool) -> BaseTool:
    """The refund tool as LangChain's recipe makes it, wrapped with ``idempotent()``."""
    as_langchain_tool = langchain_mcp().as_langchain_tool
    client = the_bank.fastmcp_client()
    through = with_idempotency_key(client) if keyed else client
    async with client:
        [refund] = [await as_langchain_tool(t, through) for t in await client.list_tools()]
    return idempotent(refund, store=InMemoryIdempotencyStore())


def structured(result: Any) -> Any:
    """A result's structured content: fastmcp's result and mcp 2's say
    ``structured_content``, mcp 1's ``structuredContent``."""
    found = getattr(result, "structured_content", None)
    return found if found is not None else result.structuredContent


def text(answer: Any) -> str:
    return "".join(block["text"] for block in answer)


# -- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "thing", [object(), "http://127.0.0.1:1/mcp", None], ids=["object", "url", "none"]
)
def test_with_idempotency_key_refuses_what_is_not_a_fastmcp_client(thing: Any) -> None:
    with pytest.raises(TypeError, match=r"needs a fastmcp\.Client.*got"):
        with_idempotency_key(thing)


def test_with_idempotency_key_refuses_a_reserved_meta_prefix() -> None:
    with pytest.raises(ValueError, match="reserved by MCP"):
        with_idempotency_key(Client("http://127.0.0.1:1/mcp"), meta_prefix="mcp.example/")


# -- the server, through a fastmcp client -------------------------------------------------


@pytest.fixture(scope="module")
def banks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Bank]]:
    root = tmp_path_factory.mktemp("fastmcp-banks")
    started: dict[str, Bank] = {}
    for name, extra in [("ours", ()), ("sdk", ("--sdk",)), ("plain", None)]:
        directory = root / name
        directory.mkdir()
        argv = ["--rows", str(directory / "rows.db"), "--events", str(directory / "events.log")]
        if extra is not None:
            argv += ["--store", str(directory / "idem.db"), *extra]
        started[name] = Bank(directory, "http", argv)
    try:
        yield started
    finally:
        for one in started.values():
            one.close()


def advertised(client: Client[Any]) -> dict[str, Any] | None:
    """What the server advertises for idempotency: ``capabilities.tools.idempotency``
    (mcp 1) or the ``capabilities.extensions`` entry (mcp 2)."""
    capabilities: Any = getattr(client, "server_capabilities", None)  # fastmcp 4
    if capabilities is None:
        capabilities = client.initialize_result.capabilities  # type: ignore[union-attr]
    extensions = getattr(capabilities, "extensions", None) or {}
    if EXTENSION in extensions:
        return dict(extensions[EXTENSION])
    tools = capabilities.tools
    found = (tools.model_extra or {}).get(CAPABILITY) if tools is not None else None
    return None if found is None else dict(found)


@pytest.mark.parametrize("kind", ["ours", "sdk"])
async def test_the_server_advertises_idempotency_to_a_fastmcp_client(
    banks: dict[str, Bank], kind: str
) -> None:
    async with banks[kind].fastmcp_client() as client:
        assert advertised(client) == {
            "onBusy": "wait",
            "metaPrefix": META_PREFIX,
            "tools": ["refund"],
        }
    async with banks["plain"].fastmcp_client() as client:
        assert advertised(client) is None


@pytest.mark.parametrize("kind", ["ours", "sdk"])
async def test_a_key_in_meta_replays_the_whole_result_to_a_fastmcp_client(
    banks: dict[str, Bank], kind: str
) -> None:
    the_bank = banks[kind]
    before = the_bank.rows.count()
    args = {"order_id": f"{kind}-meta", "amount": 140}
    async with the_bank.fastmcp_client() as client:
        first = await client.call_tool("refund", args, meta={KEY: f"{kind}-k1"})
        same = {**args, "amount": 140.0}  # 140 and 140.0 are one call
        again = await client.call_tool("refund", same, meta={KEY: f"{kind}-k1"})
        other = await client.call_tool("refund", args, meta={KEY: f"{kind}-k2"})
    assert the_bank.rows.count() == before + 2  # k1 once, k2 once
    assert again.structured_content == first.structured_content
    assert other.structured_content != first.structured_content


async def test_a_key_reused_with_other_arguments_is_a_conflict_for_a_fastmcp_client(
    banks: dict[str, Bank],
) -> None:
    the_bank = banks["ours"]
    async with the_bank.fastmcp_client() as client:
        await client.call_tool("refund", {"order_id": "c-1", "amount": 1}, meta={KEY: "k-c"})
        before = the_bank.rows.count()
        with pytest.raises(MCPError) as refused:
            await client.call_tool("refund", {"order_id": "c-1", "amount": 2}, meta={KEY: "k-c"})
    assert refused.value.error.data["type"] == "idempotency_key_conflict"  # type: ignore[attr-defined]
    assert the_bank.rows.count() == before


def wrapped(run: Any, name: str) -> BaseTool:
    """``run`` (an async function of ``order_id``, ``amount``) as an ``idempotent()`` tool:
    inside it, the idempotent call's context is set, as inside a wrapped MCP tool."""
    from langchain_core.tools import StructuredTool

    async def call(order_id: str, amount: float) -> str:
        return str(await run(order_id, amount))

    return idempotent(
        StructuredTool.from_function(coroutine=call, name=name, description=name),
        store=InMemoryIdempotencyStore(),
    )


async def test_the_keyed_client_sends_the_key_on_both_of_its_call_paths(
    banks: dict[str, Bank],
) -> None:
    # client.call_tool (langchain.mcp's plain path) and client.session.call_tool (the path
    # of a client MCPAdapter armed for elicitation) both carry the wrapped call's key.
    the_bank = banks["ours"]
    keyed = with_idempotency_key(the_bank.fastmcp_client())
    seen: list[Any] = []

    async def both(order_id: str, amount: float) -> str:
        args = {"order_id": order_id, "amount": amount}
        async with keyed:
            seen.append(structured(await keyed.call_tool("refund", args)))
            seen.append(structured(await keyed.session.call_tool("refund", args)))
        return "ok"

    before = the_bank.rows.count()
    with idempotency_scope("paths"):
        await wrapped(both, "both_paths").ainvoke({"order_id": "paths-1", "amount": 5})
    assert the_bank.rows.count() == before + 1
    assert seen[0] == seen[1]
    # Outside an idempotent call nothing is sent: each call runs.
    async with keyed:
        await keyed.call_tool("refund", {"order_id": "paths-1", "amount": 5})
        await keyed.session.call_tool("refund", {"order_id": "paths-1", "amount": 5})
    assert the_bank.rows.count() == before + 3


async def test_a_conflict_through_the_keyed_client_raises_payload_mismatch(
    banks: dict[str, Bank],
) -> None:
    the_bank = banks["ours"]
    keyed = with_idempotency_key(the_bank.fastmcp_client())

    async def twice(order_id: str, amount: float) -> str:
        async with keyed:
            await keyed.call_tool("refund", {"order_id": order_id, "amount": amount})
            await keyed.call_tool("refund", {"order_id": order_id, "amount": amount + 1})
        return "unreachable"

    before = the_bank.rows.count()
    with idempotency_scope("conflict"), pytest.raises(PayloadMismatchError, match="answered"):
        await wrapped(twice, "twice").ainvoke({"order_id": "pm-1", "amount": 1})
    assert the_bank.rows.count() == before + 1


# -- the recipe: a reply lost after the commit -------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize(("keyed", "rows"), [(False, 2), (True, 1)], ids=["plain", "keyed"])
async def test_a_reply_lost_after_the_commit_is_paid_once_through_langchain_mcp(
    tmp_path: Path, transport: str, keyed: bool, rows: int
) -> None:
    # The server (McpIdempotency on) records the result, then is SIGKILLed before it
    # replies; the retry reaches the restarted server. Only with the key in _meta does
    # the server know it is the same call.
    args = ("--die-after", "record", "--die-marker", str(tmp_path / "died"))
    with bank(
        tmp_path, transport, ours=True, args=args, read_timeout=LOST_REPLY_TIMEOUT_S
    ) as the_bank:
        tool = await tool_of(the_bank, keyed=keyed)
        with idempotency_scope("ticket-1"):
            with pytest.raises(Exception) as lost:
                await tool.ainvoke(REFUND)
            answer = await retried(lambda: tool.ainvoke(REFUND))
        assert (tmp_path / "died").exists(), lost.value
        assert the_bank.rows.count() == rows
        assert '"order_id":"A-1"' in text(answer)


@pytest.mark.parametrize(("keyed", "rows"), [(False, 2), (True, 1)], ids=["plain", "keyed"])
async def test_create_agent_with_tool_retry_through_langchain_mcp_refunds_once(
    tmp_path: Path, keyed: bool, rows: int
) -> None:
    pytest.importorskip("langchain.agents")
    from langchain.agents import create_agent
    from langchain.agents.middleware import ToolRetryMiddleware
    from langgraph.checkpoint.memory import InMemorySaver

    from tests.support.graphs import ScriptedChatModel, call, calls, thread

    args = ("--die-after", "record", "--die-marker", str(tmp_path / "died"))
    with bank(
        tmp_path, "http", ours=True, args=args, read_timeout=LOST_REPLY_TIMEOUT_S
    ) as the_bank:
        tool = await tool_of(the_bank, keyed=keyed)
        agent = create_agent(
            ScriptedChatModel(script=[calls(call("refund", REFUND))]),
            tools=[tool],
            middleware=[
                ToolRetryMiddleware(
                    max_retries=60,
                    initial_delay=0.25,
                    backoff_factor=1.0,
                    jitter=False,
                    retry_on=lambda exc: not isinstance(exc, IdempotencyError),
                )
            ],
            checkpointer=InMemorySaver(),
        )
        out = await agent.ainvoke({"messages": [("user", "refund A-1")]}, thread(f"a-{keyed}"))
        assert (tmp_path / "died").exists()
        assert the_bank.rows.count() == rows
        answered = [m for m in out["messages"] if m.type == "tool"]
        assert len(answered) == 1
        assert answered[0].status == "success"


def test_the_sets_are_what_ci_runs() -> None:
    # One of the two supported sets is installed, never a mix (fastmcp 4 needs mcp 2).
    import fastmcp

    assert (MCP_MAJOR, int(fastmcp.__version__.split(".")[0])) in {(1, 3), (2, 4)}


# -- elicitation: a resume is the same call ----------------------------------------------


def mcp2() -> None:
    if MCP_MAJOR < 2:
        pytest.skip("input-required results (SEP-2322) are protocol 2026-07-28: mcp 2")


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize(("keyed", "rows"), [(False, 2), (True, 1)], ids=["plain", "keyed"])
async def test_an_elicitation_resume_lost_after_the_commit_is_paid_once(
    tmp_path: Path, transport: str, keyed: bool, rows: int
) -> None:
    # confirmed_refund asks for the amount (an InputRequiredResult); the client re-sends
    # the tools/call with the answer, the server commits, records and is SIGKILLed
    # before it replies; the client re-sends the answered call. The asking round is not
    # stored (the key is free again), the answered one is the call: one refund.
    mcp2()
    from mcp.types import ElicitResult, InputRequiredResult

    args = ("--elicit", "--die-after", "record", "--die-marker", str(tmp_path / "died"))
    with bank(tmp_path, transport, ours=True, args=args) as the_bank:
        client = the_bank.fastmcp_client()
        through = with_idempotency_key(client) if keyed else client
        asked: list[Any] = []

        async def resumed(order_id: str, amount: float) -> str:
            async with through:
                first = await through.session.call_tool(
                    "confirmed_refund", {"order_id": order_id}, allow_input_required=True
                )
            assert isinstance(first, InputRequiredResult)
            asked.append(first)
            answer = {"amount": ElicitResult(action="accept", content={"amount": amount})}

            async def answered() -> Any:
                async with through:
                    return await through.session.call_tool(
                        "confirmed_refund",
                        {"order_id": order_id},
                        input_responses=answer,
                        request_state=first.request_state,
                        allow_input_required=True,
                    )

            with pytest.raises(Exception):  # noqa: B017 - the reply is lost
                await answered()
            return str(structured(await retried(answered)))

        with idempotency_scope("ticket-e"):
            done = await wrapped(resumed, "resumed").ainvoke({"order_id": "E-1", "amount": 140})
        assert (tmp_path / "died").exists()
        assert the_bank.rows.count() == rows
        assert "'order_id': 'E-1'" in done
        assert len(asked) == 1


def test_a_protected_tool_that_may_run_as_a_background_task_is_refused_at_install() -> None:
    # Its elicitation rounds and result travel in tasks/* requests, which the middleware
    # does not see: refused at install rather than left to run twice on a resume.
    import fastmcp

    if int(fastmcp.__version__.split(".")[0]) < 4:
        pytest.importorskip("docket", reason="fastmcp 3's background tasks need fastmcp[tasks]")
    from fastmcp import FastMCP

    from langchain_idempotent.integrations.mcp import McpIdempotency

    server: Any = FastMCP("tasks")

    @server.tool(task=True)
    async def long_refund(order_id: str) -> str:
        """A refund that may run as a background task."""
        return order_id

    @server.tool
    async def refund(order_id: str) -> str:
        """A plain refund."""
        return order_id

    with pytest.raises(ValueError, match=r"cannot follow tool\(s\) \['long_refund'\].*task=False"):
        McpIdempotency(InMemoryIdempotencyStore()).install(server)
    with pytest.raises(ValueError, match="long_refund"):
        McpIdempotency(InMemoryIdempotencyStore(), tools=["long_refund"]).install(server)
    # Protecting only the tools it can follow installs.
    assert McpIdempotency(InMemoryIdempotencyStore(), tools=["refund"]).install(server) is server


@pytest.mark.parametrize(("keyed", "rows"), [(False, 2), (True, 1)], ids=["plain", "keyed"])
async def test_langchain_mcp_interrupt_elicitation_resumed_after_a_lost_reply_refunds_once(
    tmp_path: Path, keyed: bool, rows: int
) -> None:
    # LangChain's own loop: MCPAdapter arms the client, confirmed_refund's question becomes
    # a LangGraph interrupt(), the run resumes with the answer and the tool re-sends the
    # tools/call with it. The server commits, records and is killed before it replies;
    # ToolRetryMiddleware re-runs the tool, which asks (the restarted server asks again),
    # and the answered call is re-sent. Keyed, the server replays it.
    mcp2()
    lc_mcp = langchain_mcp()
    from langchain.agents import create_agent
    from langchain.agents.middleware import ToolRetryMiddleware
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.errors import GraphBubbleUp
    from langgraph.types import Command

    from tests.support.graphs import ScriptedChatModel, call, calls, final, thread

    args = ("--elicit", "--die-after", "record", "--die-marker", str(tmp_path / "died"))
    with bank(tmp_path, "http", ours=True, args=args) as the_bank:
        client = the_bank.fastmcp_client()
        adapter = lc_mcp.MCPAdapter(with_idempotency_key(client) if keyed else client)
        async with adapter:
            [tool] = [t for t in await adapter.list_tools() if t.name == "confirmed_refund"]
        agent = create_agent(
            ScriptedChatModel(
                script=[calls(call("confirmed_refund", {"order_id": "E-2"})), final()]
            ),
            tools=[idempotent(tool, store=InMemoryIdempotencyStore())],
            middleware=[
                ToolRetryMiddleware(
                    max_retries=60,
                    initial_delay=0.25,
                    backoff_factor=1.0,
                    jitter=False,
                    retry_on=lambda e: not isinstance(e, IdempotencyError | GraphBubbleUp),
                )
            ],
            checkpointer=InMemorySaver(),
        )
        config = thread(f"elicit-{keyed}")
        answer = {"responses": {"amount": {"action": "accept", "content": {"amount": 140}}}}
        out = await agent.ainvoke({"messages": [("user", "refund E-2")]}, config)
        questions = 0
        while "__interrupt__" in out:  # each round's question, answered the same
            questions += 1
            assert questions <= 3, out["__interrupt__"]
            [pending] = out["__interrupt__"]
            assert pending.value["type"] == "mcp_elicitation"
            out = await agent.ainvoke(Command(resume=answer), config)
        assert (tmp_path / "died").exists()
        assert the_bank.rows.count() == rows
        answered = [m for m in out["messages"] if m.type == "tool"]
        assert len(answered) == 1 and answered[0].status == "success"
