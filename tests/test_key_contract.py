"""Keys are a contract (docs/keys.md, "Keys are a contract"): fixed calls, every key part and
every scope, fixed expected keys. Any change of a key fails here; a change on purpose bumps
``KEY_VERSION``, keeps the previous recipe in ``FORMATS`` and names it in
``HONOURED_VERSION`` for one retention window, so old and new workers of a rolling deploy
run an effect once (the last tests below, two real worker processes on one store)."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path
from typing import Annotated, Any

import pytest
from langchain_core.tools import InjectedToolArg, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.prebuilt import InjectedState

from langchain_idempotent import InMemoryIdempotencyStore, get_idempotency_context, idempotent
from langchain_idempotent.adapters.keys import explain_key
from langchain_idempotent.core import keys
from langchain_idempotent.core.reads import reads_key
from tests.support import forked
from tests.support.graphs import ScriptedChatModel, on_each_turn, tool_graph

ROOT = Path(__file__).resolve().parents[1]


@tool
def refund(invoice_id: str, amount: float) -> str:
    """Refund an invoice."""
    return f"refunded {amount} on {invoice_id}"


@tool
def refund_for(
    invoice_id: str,
    customer: Annotated[str, InjectedState("customer")],
    tenant: Annotated[str, InjectedToolArg],
) -> str:
    """Refund an invoice for the customer in the state."""
    return f"refunded {invoice_id} for {customer} of {tenant}"


STORE = InMemoryIdempotencyStore()
REFUND = idempotent(refund, store=STORE)
REFUND_FOR = idempotent(refund_for, store=STORE)
ARGS = {"invoice_id": "INV-7", "amount": 140}


def _config(**configurable: Any) -> dict[str, Any]:
    return {
        "configurable": {"thread_id": "t-1", "checkpoint_ns": "tools:9dd2c1", **configurable},
        "metadata": {"langgraph_node": "tools"},
    }


def _by_order(info: Any) -> str:
    return f"order-{info.args['invoice_id']}"


#: name -> (tool, input, config, scope, namespace, the key it must make).
GOLDEN: dict[str, tuple[Any, Any, dict[str, Any], Any, str | None, str]] = {
    "thread": (
        REFUND,
        ARGS,
        _config(),
        None,
        None,
        "9b8eb416732b10f0b50cfb71399d37aada17dd42c4f5a90ce541b044c81fe0af",
    ),
    "namespace": (
        REFUND,
        ARGS,
        _config(),
        None,
        "tenant-a",
        "faa0197ad5e13402c33cde59d79cc2b087b443b7bfc82361fb548679acca0914",
    ),
    "another thread": (
        REFUND,
        ARGS,
        _config(thread_id="t-2"),
        None,
        None,
        "1f9f2e5b593a2d0934b3f4dd225f8d6de11111e4a36bf9c236f336ad09252cea",
    ),
    "nested graph path": (
        REFUND,
        ARGS,
        _config(checkpoint_ns="billing:41c5|1|tools:9dd2"),
        None,
        None,
        "e2a4ee05cb7fdef5dd571bd8c15d692b47a8522b9c56c1a45f4d5a27ca72ef4f",
    ),
    "agent and node": (
        REFUND,
        ARGS,
        {
            "configurable": {"thread_id": "t-1", "checkpoint_ns": "agent:1|tools:2"},
            "metadata": {"langgraph_node": "tools", "lc_agent_name": "billing_agent"},
        },
        None,
        None,
        "a8e739964e568a3ead8b42882527b5da6c830f07eb627efa19a924823ccf6921",
    ),
    "turn": (
        REFUND,
        ARGS,
        _config(idempotency_turn="turn-1"),
        "turn",
        None,
        "a2a198288ca9d461c517b525b76bbdc52fe4f7b33625c1ab82d1a21610b1fbef",
    ),
    "call": (
        REFUND,
        {"type": "tool_call", "name": "refund", "id": "call_1", "args": ARGS},
        _config(),
        "call",
        None,
        "3ac5ef358c6b26022b3c3a5c22255acbf9dc18691b2284fa888ea1b154f9a8d3",
    ),
    "key function": (
        REFUND,
        ARGS,
        _config(),
        _by_order,
        None,
        "11b8ae07278f063f8a037961e6b88394ce9fa6fe443fa5672ab1bf212ca7feb5",
    ),
    "injected inputs": (
        REFUND_FOR,
        {"invoice_id": "INV-7", "customer": "alice", "tenant": "acme"},
        _config(),
        None,
        None,
        "db8bf92185c67c7a6308063260ed8ab6daaee43f6c5a23f153496163f96c615a",
    ),
}


@pytest.mark.parametrize("name", list(GOLDEN))
def test_a_fixed_call_makes_the_key_it_made_when_the_format_was_fixed(name: str) -> None:
    tool_, tool_input, config, scope, namespace, expected = GOLDEN[name]
    made = explain_key(tool_, tool_input, config, scope=scope, namespace=namespace)  # type: ignore[arg-type]
    assert made.key == expected, f"{name}: the key changed; see docs/keys.md before you bump it"


def test_the_key_format_is_version_4_and_honours_no_earlier_one_in_the_first_release() -> None:
    assert (keys.KEY_VERSION, keys.HONOURED_VERSION, keys.VERSION) == (4, None, "v1.k4")
    assert set(keys.FORMATS) == {4}


def test_arguments_that_are_the_same_call_make_one_key() -> None:
    one = explain_key(REFUND, {"invoice_id": "INV-7", "amount": 140}, _config()).key
    assert one == explain_key(REFUND, {"amount": 140.0, "invoice_id": "INV-7"}, _config()).key
    assert one == GOLDEN["thread"][-1]


def test_a_call_whose_reads_differ_makes_the_key_it_made_when_the_format_was_fixed() -> None:
    made = reads_key(GOLDEN["thread"][-1], {"configurable.user_id": "a" * 16})
    assert made == "66711bc0f3237ebd4c20eed01b5ae33c17ca5892d05fd2b9b2f7fcd9a8b1ee01"


def test_a_tool_node_step_hands_its_tool_the_golden_key() -> None:
    seen: list[str] = []

    @tool
    def refund(invoice_id: str, amount: float) -> str:
        """Refund an invoice."""
        ctx = get_idempotency_context()
        assert ctx is not None
        seen.append(ctx.key)
        return "ok"

    model = ScriptedChatModel(then=on_each_turn(("refund", ARGS)))
    graph = tool_graph(
        model, [idempotent(refund, store=InMemoryIdempotencyStore())], checkpointer=InMemorySaver()
    )
    graph.invoke({"messages": [("user", "refund INV-7")]}, {"configurable": {"thread_id": "t-1"}})
    # a ToolNode's checkpoint_ns is "tools:<task id>": the same parts as GOLDEN["thread"]
    assert seen == ["9b8eb416732b10f0b50cfb71399d37aada17dd42c4f5a90ce541b044c81fe0af"]


# -- a rolling deploy: a worker of each format on one store --------------------------------

WORKER = textwrap.dedent(
    """
    import json, os, sys, time
    from langchain_core.tools import tool
    from langchain_idempotent import SqliteIdempotencyStore, idempotency_scope, idempotent
    from langchain_idempotent.core import keys

    if os.environ["FORMAT"] != "4":  # the next release: format 5, honouring 4 (or not)
        keys.FORMATS[5] = keys.FORMATS[4]  # the smallest format change: its version part
        keys.KEY_VERSION = 5
        keys.HONOURED_VERSION = 4 if os.environ["HONOUR"] == "1" else None

    @tool
    def refund(invoice_id: str, amount: float) -> str:
        \"\"\"Refund an invoice.\"\"\"
        with open(os.environ["LEDGER"], "a") as ledger:
            ledger.write(os.environ["FORMAT"] + "\\n")
        time.sleep(float(os.environ["HOLD"]))
        return "refunded by format " + os.environ["FORMAT"]

    wrapped = idempotent(refund, store=SqliteIdempotencyStore(os.environ["DB"]))
    while not os.path.exists(os.environ["GO"]):
        time.sleep(0.005)
    with idempotency_scope("order-7"):
        print(json.dumps(wrapped.invoke({"invoice_id": "INV-7", "amount": 140})))
    """
)


def _deploy(tmp_path: Path, *, honour: bool, hold: float, stagger: bool) -> tuple[int, list[str]]:
    """An old (format 4) and a new (format 5) worker refund the same call on one SQLite
    store: together (``stagger=False``) or the old one first. The refunds paid, and what
    each worker was answered."""
    (tmp_path / "worker.py").write_text(WORKER)
    ledger, go = tmp_path / "ledger", tmp_path / "go"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DB": str(tmp_path / "store.sqlite"),
        "LEDGER": str(ledger),
        "GO": str(go),
        "HOLD": str(hold),
        "HONOUR": "1" if honour else "0",
    }
    answers = []
    procs = []

    def answer(proc: forked.ForkedProcess) -> Any:
        done = proc.finish(120)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    for fmt in ("4", "5"):
        procs.append(
            forked.start(
                [str(tmp_path / "worker.py")],
                env={**env, "FORMAT": fmt},
                stdout=tmp_path / f"out-{fmt}",
                stderr=tmp_path / f"err-{fmt}",
            )
        )
        if stagger and fmt == "4":
            go.touch()
            answers.append(answer(procs[0]))
    go.touch()
    for proc in procs[len(answers) :]:
        answers.append(answer(proc))
    return len(ledger.read_text().split()), answers


@pytest.mark.parametrize("stagger", [False, True], ids=["side by side", "old first"])
def test_a_worker_of_each_format_runs_an_effect_once_while_the_old_format_is_honoured(
    tmp_path: Path, stagger: bool
) -> None:
    paid, answers = _deploy(tmp_path, honour=True, hold=0.5, stagger=stagger)
    assert paid == 1
    assert len(set(answers)) == 1  # both told the one refund


def test_without_honouring_the_old_format_a_rolling_deploy_pays_twice(tmp_path: Path) -> None:
    paid, answers = _deploy(tmp_path, honour=False, hold=0.0, stagger=True)
    assert paid == 2
    assert answers == ["refunded by format 4", "refunded by format 5"]
