"""``explain_key`` and ``langchain-idempotent explain`` show which parts made a key, and
the key they show is the one the library stores."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from langchain_idempotent import InMemoryIdempotencyStore, idempotent
from langchain_idempotent.adapters.keys import explain_key
from langchain_idempotent.cli import main
from tests.support.agents import Ledger, refund_tool
from tests.support.graphs import ScriptedChatModel, on_each_turn, thread, tool_graph

REFUND = {"invoice_id": "INV-7", "amount": 140}


def test_explain_key_gives_the_stored_key_and_names_its_parts() -> None:
    store = InMemoryIdempotencyStore()
    wrapped = idempotent(refund_tool(Ledger()), store, namespace="shop")
    graph = tool_graph(
        ScriptedChatModel(then=on_each_turn(("issue_refund", REFUND))),
        [wrapped],
        checkpointer=InMemorySaver(),
    )
    graph.invoke({"messages": [HumanMessage("refund")]}, thread("t-1"))
    [record] = store.list(thread_id="t-1")
    # The parts a real run had: the node's checkpoint_ns carries a task id, dropped.
    config: Any = {
        "configurable": {"thread_id": "t-1", "checkpoint_ns": "tools:0b29f1"},
        "metadata": {"langgraph_node": "tools"},
    }
    explained = explain_key(wrapped, REFUND, config)
    assert explained.key == record.key
    parts = dict(explained.parts)
    assert (parts["namespace"], parts["graph_path"], parts["node"]) == ("shop", "tools", "tools")
    assert parts["arguments"] == '{"amount":140,"invoice_id":"INV-7"}'
    assert parts["version"] == "v1.k4"
    assert "graph_path   tools" in str(explained)


def cli(*argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["explain", *argv])
    return code, capsys.readouterr().out


BASE = ["--tool", "issue_refund", "--args", json.dumps(REFUND), "--thread", "t-1"]


def test_the_explain_command_drops_task_ids_and_call_counters_and_shows_the_agent(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, first = cli(
        *BASE,
        "--checkpoint-ns",
        "billing:9dd2|tools:41c5",
        "--agent",
        "billing_agent",
        "--json",
        capsys=capsys,
    )
    assert code == 0
    doc = json.loads(first)
    assert doc["parts"]["graph_path"] == "billing|tools"
    assert doc["parts"]["agent"] == "billing_agent"
    code, retry = cli(
        *BASE,
        "--checkpoint-ns",
        "billing:77aa|1|tools:0c0c",
        "--agent",
        "billing_agent",
        "--key",
        doc["key"],
        capsys=capsys,
    )
    assert code == 0 and "--key matches" in retry
    code, other = cli(
        *BASE,
        "--checkpoint-ns",
        "billing:77aa|1|tools:0c0c",
        "--agent",
        "comms_agent",
        "--key",
        doc["key"],
        capsys=capsys,
    )
    assert code == 1 and "differs" in other and "comms_agent" in other


def test_the_explain_command_gives_the_library_key(capsys: pytest.CaptureFixture[str]) -> None:
    store = InMemoryIdempotencyStore()
    wrapped = idempotent(refund_tool(Ledger()), store)
    wrapped.invoke(REFUND, {"configurable": {"thread_id": "t-1"}})
    [record] = store.list(thread_id="t-1")
    code, out = cli(*BASE, "--key", record.key, capsys=capsys)
    assert code == 0, out


def test_the_explain_command_refuses_arguments_that_are_not_a_json_object(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["explain", "--tool", "t", "--args", "[1, 2]"]) == 2
    assert "JSON object" in capsys.readouterr().err
    assert main(["explain", "--tool", "t", "--args", "{oops"]) == 2
    assert "not JSON" in capsys.readouterr().err
    assert main(["explain", "--tool", "t"]) == 2  # no thread: nothing to make a key from
    assert "thread id" in capsys.readouterr().err


def test_the_explain_example_of_the_docs_matches_its_key(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """docs/multi-agent.md's shell example, run as printed: its --key (an 8-character
    prefix) is the key those parts make; a wrong prefix differs, a too short one is refused."""
    page = (Path(__file__).resolve().parent.parent / "docs" / "multi-agent.md").read_text()
    command = re.search(r"```bash\n(langchain-idempotent explain .*?)```", page, re.S)
    assert command, "docs/multi-agent.md has no explain example"
    argv = shlex.split(command.group(1).replace("\\\n", " "))[1:]
    code, out = cli(*argv[1:], capsys=capsys)
    assert code == 0 and "--key matches" in out, out
    key = argv[argv.index("--key") + 1]
    assert len(key) == 8
    wrong = [*argv[1:-1], "0" * 8 if key != "0" * 8 else "1" * 8]
    code, out = cli(*wrong, capsys=capsys)
    assert code == 1 and "differs" in out
    assert main(["explain", *argv[1:-1], key[:7]]) == 2
    assert "at least its first 8 characters" in capsys.readouterr().err
