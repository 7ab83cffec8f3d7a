"""``langchain-idempotent explain``: which parts make the key of a call.

::

    langchain-idempotent explain --tool issue_refund --args '{"invoice_id": "INV-7", "amount": 140}'
        --thread t-1 [--checkpoint-ns 'billing:9dd2…|1|tools:41c5…'] [--node tools]
        [--agent billing_agent] [--parent-call KEY] [--scope thread|turn|call]
        [--turn ID] [--tool-call-id ID] [--namespace N] [--inputs JSON] [--json]
        [--key KEY [--url URL [--prefix P] [--table T]]]

Prints the key and each part in the order it is hashed (version, namespace, scope, thread,
graph path, node, agent, calling call, tool, arguments, inputs, scope part) — the graph
path as
the key uses it (task ids and call counters removed from ``--checkpoint-ns``). With
``--key`` (the key, or its first 8 characters or more), says whether that key is the one
these parts make (exit status 1 if not); with ``--url`` too, it reads that key's record and
names each part that differs from the stored one (the arguments and inputs through the
record's fingerprint), so an operator can tell why two calls did not share a record.
Without ``--checkpoint-ns``, the graph path is the ``--node`` (a node of the top-level
graph: a ``ToolNode`` named ``tools`` runs under ``tools:<task id>``); without ``--node``,
the node is the last part of the graph path; the output says what it assumed.
The arguments are taken as given: the tool's own schema may normalise them first (an
integer for a ``float`` field), so pass them as the model-visible schema writes them.
Needs no store.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from typing import TYPE_CHECKING, Any, TextIO

from ._common import PROG

if TYPE_CHECKING:
    from ..adapters.keys import CallInfo, KeyExplanation
    from ..core.store import BaseIdempotencyStore

__all__ = ["MIN_KEY_PREFIX", "add_parser", "run"]

#: The shortest ``--key`` prefix taken (as ``ls`` and ``git`` abbreviate: 8 hex digits).
MIN_KEY_PREFIX = 8


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """Register ``explain`` on the CLI's sub-parsers (``common``: the store options, used
    only by ``--key`` with ``--url``)."""
    p = sub.add_parser(
        "explain",
        parents=[common],
        help="show which parts make the key of a call (no store; with --key and --url, "
        "which parts differ from the stored record's)",
    )
    p.add_argument("--tool", required=True, help="the tool's name")
    p.add_argument("--args", default="{}", metavar="JSON", help="the model-visible arguments")
    p.add_argument("--thread", help="the thread id (configurable.thread_id)")
    p.add_argument(
        "--checkpoint-ns",
        help="checkpoint_ns, task ids and all (default: the --node, as for a node of the "
        "top-level graph such as a ToolNode named 'tools')",
    )
    p.add_argument(
        "--node",
        help="metadata.langgraph_node (e.g. tools; default: the last part of --checkpoint-ns)",
    )
    p.add_argument("--agent", help="metadata.lc_agent_name of the agent making the call")
    p.add_argument("--parent-call", help="the key of the memoized call it ran inside")
    p.add_argument("--scope", choices=["thread", "turn", "call"], default="thread")
    p.add_argument("--turn", help="the user turn under --scope turn (idempotency_turn)")
    p.add_argument("--tool-call-id", help="the tool call id under --scope call")
    p.add_argument("--namespace", default="default", help="the policy's namespace")
    p.add_argument(
        "--inputs",
        default="{}",
        metavar="JSON",
        help='the inputs the model does not send, as the key has them: {"args": {...}, '
        '"state": {...}, "context": ...} (docs/keys.md)',
    )
    p.add_argument(
        "--key",
        help=f"check that these parts make this key (or a key starting with these, at least "
        f"{MIN_KEY_PREFIX} characters); with --url, name the parts that differ from the "
        "stored record's",
    )
    p.add_argument("--json", action="store_true", help="one JSON document")


def run(
    args: argparse.Namespace,
    *,
    out: TextIO,
    err: TextIO,
    store: BaseIdempotencyStore | None = None,
) -> int:
    """Explain one key; 0 done (or ``--key`` matches), 1 ``--key`` differs, 2 bad input.
    ``store``: where ``--key``'s record is, to name the parts that differ."""
    try:
        info, explained, assumed = _explain(args)
    except _BadInput as exc:
        print(f"{PROG}: error: {exc}", file=err)
        return 2
    matches = None if args.key is None else explained.key.startswith(args.key)
    differs = _differences(args, info, store) if matches is False else None
    if args.json:
        doc: dict[str, Any] = {
            "key": explained.key,
            "scope": explained.scope,
            "parts": dict(explained.parts),
        }
        if assumed:
            doc["assumed"] = assumed
        if matches is not None:
            doc["matches"] = matches
        if differs is not None:
            doc["differs"] = differs
        print(json.dumps(doc, indent=2), file=out)
    else:
        print(explained, file=out)
        for note in assumed:
            print(f"({note})", file=out)
        if matches:
            print("--key matches", file=out)
        elif matches is False:
            print(_differs_text(differs), file=out)
    return 1 if matches is False else 0


class _BadInput(Exception):
    """An argument ``explain`` cannot make a key from (exit status 2)."""


def _explain(args: argparse.Namespace) -> tuple[CallInfo, KeyExplanation, list[str]]:
    """The call's info, its key's parts, and what was assumed for the options not given."""
    from ..adapters.keys import (
        SCOPE_CONFIG_KEY,
        TURN_CONFIG_KEY,
        call_info,
        calling,
        explain_key,
        graph_path,
    )
    from ..errors import IdempotencyError

    if not args.tool:
        raise _BadInput("--tool must name the tool")
    arguments = _json_object(args.args, "--args")
    inputs = _json_object(args.inputs, "--inputs")
    if set(inputs) - {"args", "state", "context"}:
        raise _BadInput('--inputs must be a JSON object with "args", "state" and "context" only')
    for part in ("args", "state"):
        if part in inputs and not isinstance(inputs[part], dict):
            raise _BadInput(f'--inputs: "{part}" must be a JSON object of values by name')
    if args.key is not None and len(args.key) < MIN_KEY_PREFIX:
        raise _BadInput(
            f"--key {args.key!r} is too short to check: give the key, or at least its first "
            f"{MIN_KEY_PREFIX} characters"
        )
    if not args.thread:
        raise _BadInput(
            "--thread is needed: every key holds the thread id (configurable.thread_id, or "
            "the idempotency_scope() outside a graph)"
        )
    if args.scope == "call" and not args.tool_call_id:
        raise _BadInput("--scope call needs --tool-call-id (the id the model gave the call)")
    if args.scope == "turn" and not args.turn:
        raise _BadInput("--scope turn needs --turn (the user turn's id, idempotency_turn)")
    assumed: list[str] = []
    checkpoint_ns, node = args.checkpoint_ns, args.node
    if checkpoint_ns is None and node:
        checkpoint_ns = node
        assumed.append(
            f"graph path {node!r} from --node: a node of the top-level graph; give "
            "--checkpoint-ns for one inside a subgraph"
        )
    if node is None and checkpoint_ns:
        node = graph_path(checkpoint_ns).rpartition("|")[2] or None
        if node:
            assumed.append(f"node {node!r}: the last part of --checkpoint-ns")
    configurable: dict[str, Any] = {"checkpoint_ns": checkpoint_ns or ""}
    configurable[SCOPE_CONFIG_KEY] = args.thread
    if args.turn:
        configurable[TURN_CONFIG_KEY] = args.turn
    metadata = {k: v for k, v in (("langgraph_node", node), ("lc_agent_name", args.agent)) if v}
    schema = {"type": "object", "properties": {name: {} for name in arguments}}
    try:
        # The calling call is what a memoized tool running in another graph would set.
        with calling(args.parent_call, "") if args.parent_call else contextlib.nullcontext():
            info: CallInfo = call_info(
                tool=args.tool,
                schema=schema,
                tool_input=arguments,
                tool_call_id=args.tool_call_id,
                config={"configurable": configurable, "metadata": metadata},
                namespace=args.namespace,
                inputs=inputs,
            )
        return info, explain_key(info, scope=args.scope), assumed
    except (IdempotencyError, ValueError, TypeError, RecursionError) as exc:
        raise _BadInput(str(exc) or type(exc).__name__) from exc


def _json_object(text: str, flag: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise _BadInput(f"{flag} is not JSON: {exc}") from exc
    except RecursionError as exc:
        raise _BadInput(f"{flag} is nested too deeply to read") from exc
    if not isinstance(value, dict):
        raise _BadInput(f"{flag} must be a JSON object")
    return value


#: The parts a record keeps in its meta, as ``derive_key`` writes them, by the name
#: ``explain`` prints (the arguments and inputs are compared through the fingerprint).
_STORED_PARTS = {
    "namespace": "namespace",
    "thread_id": "thread_id",
    "graph_path": "graph_path",
    "node": "node",
    "agent": "agent",
    "parent_call": "parent_call",
    "tool": "tool",
    "key_version": "version",
}


def _differences(
    args: argparse.Namespace, info: CallInfo, store: BaseIdempotencyStore | None
) -> list[dict[str, str]] | None:
    """The parts of ``--key``'s stored record that differ from these (``None``: no store
    to look in). Empty when every stored part agrees: then the scope part differs."""
    if store is None:
        return None
    from ..adapters.keys import derive_key
    from .records import existing

    rec = existing(store, args.key, args)
    mine = derive_key(info, args.scope)
    found: list[dict[str, str]] = []
    for field, part in _STORED_PARTS.items():
        if field in rec.meta and str(rec.meta[field]) != mine.meta.get(field, ""):
            found.append({"part": part, "stored": str(rec.meta[field]), "given": mine.meta[field]})
    if rec.fingerprint and rec.fingerprint != mine.fingerprint:
        found.append(
            {
                "part": "arguments/inputs",
                "stored": f"fingerprint {rec.fingerprint}",
                "given": f"fingerprint {mine.fingerprint}",
            }
        )
    return found


def _differs_text(differs: list[dict[str, str]] | None) -> str:
    if differs is None:
        return (
            "--key differs: other parts made it. A key is a hash, so which part differs cannot "
            "be read from it: add --url STORE (where the record is) to compare these parts "
            "with the stored record's"
        )
    if not differs:
        return (
            "--key differs, yet the stored record's namespace, thread, graph path, node, "
            "agent, calling call, tool and arguments are these: the scope part differs "
            "(--scope, --turn or --tool-call-id)"
        )
    lines = ["--key differs in:"]
    lines += [f"  {d['part']}: stored {d['stored']!r}, given {d['given']!r}" for d in differs]
    return "\n".join(lines)
