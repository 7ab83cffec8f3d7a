"""``langchain-idempotent explain`` as a newcomer meets it: a ToolNode call's key from the
node alone, a clear error (never a traceback) on bad input, the part that differs from a
stored record named; and output piped into ``head`` ends quietly, not as a store failure."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

from langchain_idempotent import get_idempotency_context, idempotent
from langchain_idempotent.cli import BROKEN_PIPE, main
from langchain_idempotent.stores.sqlite import SqliteIdempotencyStore
from tests.support import forked

ROOT = Path(__file__).resolve().parent.parent
ARGS = {"invoice_id": "INV-7", "amount": 140}


def _toolnode_key(store: SqliteIdempotencyStore, thread: str = "T-1") -> str:
    """The key a wrapped tool gets in a ToolNode named ``tools`` (the README's graph)."""
    seen: list[str] = []

    @tool
    def issue_refund(invoice_id: str, amount: float) -> str:
        """Refund `amount` dollars on invoice `invoice_id`."""
        ctx = get_idempotency_context()
        assert ctx is not None
        seen.append(ctx.key)
        return "refunded"

    builder = StateGraph(MessagesState)
    builder.add_node("tools", ToolNode(idempotent([issue_refund], store=store)))
    builder.add_edge(START, "tools")
    graph = builder.compile(checkpointer=InMemorySaver())
    call = {"name": "issue_refund", "args": ARGS, "id": "call_1"}
    graph.invoke(
        {"messages": [AIMessage("", tool_calls=[call])]}, {"configurable": {"thread_id": thread}}
    )
    assert len(seen) == 1
    return seen[0]


def _explain(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["explain", "--tool", "issue_refund", "--args", json.dumps(ARGS), *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_explain_gives_a_toolnode_calls_key_from_the_node_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = SqliteIdempotencyStore(str(tmp_path / "idem.db"))
    key = _toolnode_key(store)
    code, out, _ = _explain(capsys, "--thread", "T-1", "--node", "tools", "--key", key)
    assert code == 0 and "--key matches" in out, out
    assert "graph path 'tools' from --node" in out  # it says what it assumed
    # ...and from the checkpoint namespace alone (task id and all), the node being its last part
    ns = "tools:e43785bf-d70f-b545-e95c-2513241b5891"
    code, out, _ = _explain(capsys, "--thread", "T-1", "--checkpoint-ns", ns, "--key", key)
    assert code == 0 and "--key matches" in out, out
    assert "node 'tools': the last part of --checkpoint-ns" in out
    store.close()


def test_explain_with_the_store_names_the_part_that_differs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "idem.db"
    store = SqliteIdempotencyStore(str(path))
    key = _toolnode_key(store, thread="T-1")
    store.close()
    url = f"sqlite:///{path}"
    # Without a store, a hash cannot say which part differs; the output says how to find out.
    code, out, _ = _explain(capsys, "--thread", "T-2", "--node", "tools", "--key", key[:12])
    assert code == 1 and "add --url STORE" in out, out
    # With it: the thread, by its stored and given values, and nothing else.
    code, out, err = _explain(
        capsys, "--thread", "T-2", "--node", "tools", "--key", key[:12], "--url", url
    )
    assert code == 1, err
    assert "--key differs in:\n  thread_id: stored 'T-1', given 'T-2'\n" in out, out
    assert "graph_path" not in out.split("--key differs")[1]
    # Other arguments: through the stored fingerprint; JSON names the parts too.
    other = json.dumps({"invoice_id": "INV-8", "amount": 140})
    argv = ["--tool", "issue_refund", "--args", other, "--thread", "T-1", "--node", "tools"]
    code = main(["explain", *argv, "--key", key, "--url", url, "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and doc["matches"] is False
    assert [d["part"] for d in doc["differs"]] == ["arguments/inputs"]
    # No graph path given (a bare tool.invoke's key): the graph path and node are named.
    code, out, _ = _explain(
        capsys, "--thread", "T-1", "--checkpoint-ns", "", "--key", key, "--url", url
    )
    assert code == 1
    assert "graph_path: stored 'tools', given ''" in out and "node: stored 'tools'" in out
    # The same parts under another scope: every stored part agrees, the scope part differs.
    code, out, _ = _explain(
        capsys, "--thread", "T-1", "--node", "tools", "--scope", "call", "--tool-call-id", "c9"
    )
    assert code == 0
    code, out, _ = _explain(
        capsys,
        *("--thread", "T-1", "--node", "tools", "--scope", "call", "--tool-call-id", "c9"),
        *("--key", key, "--url", url),
    )
    assert code == 1 and "the scope part differs" in out, out


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--args", "[" * 5000 + "]" * 5000], "--args is nested too deeply to read"),
        (["--args", '{"a": ' + "[" * 2000 + "]" * 2000 + "}"], "error:"),
        (["--args", '{"amount": NaN}'], "no canonical JSON form"),
        (["--inputs", '{"args": 5}'], '"args" must be a JSON object'),
        (["--inputs", "{oops"], "--inputs is not JSON"),
        (["--scope", "call"], "--scope call needs --tool-call-id"),
        (["--scope", "turn"], "--scope turn needs --turn"),
        (["--tool", ""], "--tool must name the tool"),
    ],
    ids=["deep-json", "deep-value", "nan", "inputs-args", "inputs-json", "call", "turn", "tool"],
)
def test_explain_answers_bad_input_with_an_error_not_a_traceback(
    argv: list[str], says: str, tmp_path: Path
) -> None:
    # ``python -m langchain_idempotent explain ...``, in a process of its own (forked warm).
    command = ["-m", "langchain_idempotent", "explain", "--tool", "t", "--thread", "T-1", *argv]
    done = forked.run(command, folder=tmp_path, cwd=ROOT, timeout=60)
    code, err = done.returncode, done.stderr
    assert code == 2, err
    assert "Traceback" not in err, err
    assert says in err and err.startswith("langchain-idempotent: error: ")


def test_ls_piped_into_head_stops_quietly_not_as_a_store_failure(tmp_path: Path) -> None:
    path = tmp_path / "idem.db"
    store = SqliteIdempotencyStore(str(path))
    tools = idempotent([_echo], store=store)
    for i in range(400):  # ~200 KB of JSON: more than a pipe holds, so writing must break
        tools[0].invoke({"text": f"record {i}"}, {"configurable": {"thread_id": f"t{i}"}})
    store.close()
    reader = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "langchain_idempotent",
            "ls",
            "--json",
            "--url",
            f"sqlite:///{path}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    assert reader.stdout is not None and reader.stderr is not None
    assert reader.stdout.readline() == b"{\n"  # what `head -1` reads, then it leaves
    reader.stdout.close()
    assert reader.wait(timeout=60) == BROKEN_PIPE
    said = reader.stderr.read().decode()
    assert said == "", said  # no "cannot use the store", no traceback


@tool
def _echo(text: str) -> str:
    """Echo `text`."""
    return text
