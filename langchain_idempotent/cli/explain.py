"""``langchain-idempotent explain``: which parts make the key of a call.

::

    langchain-idempotent explain --tool issue_refund --args '{"invoice_id": "INV-7", "amount": 140}'
        --thread t-1 [--checkpoint-ns 'billing:9dd2…|1|tools:41c5…'] [--node tools]
        [--agent billing_agent] [--parent-call KEY] [--scope thread|turn|call]
        [--turn ID] [--tool-call-id ID] [--namespace N] [--inputs JSON] [--key KEY] [--json]

Prints the key and each part in the order it is hashed (version, namespace, scope, thread,
graph path, node, agent, calling call, tool, arguments, inputs, scope part) — the graph
path as
the key uses it (task ids and call counters removed from ``--checkpoint-ns``). With
``--key`` (the key, or its first 8 characters or more), says whether that key is the one
these parts make (exit status 1 if not), so
an operator can tell which part differs between two calls that did not share a record.
The arguments are taken as given: the tool's own schema may normalise them first (an
integer for a ``float`` field), so pass them as the model-visible schema writes them.
Needs no store.
"""

from __future__ import annotations

import argparse
import json
from typing import Any, TextIO

__all__ = ["MIN_KEY_PREFIX", "add_parser", "run"]

#: The shortest ``--key`` prefix taken (as ``ls`` and ``git`` abbreviate: 8 hex digits).
MIN_KEY_PREFIX = 8


def add_parser(sub: Any) -> None:
    """Register ``explain`` on the CLI's sub-parsers."""
    p = sub.add_parser("explain", help="show which parts make the key of a call (no store)")
    p.add_argument("--tool", required=True, help="the tool's name")
    p.add_argument("--args", default="{}", metavar="JSON", help="the model-visible arguments")
    p.add_argument("--thread", help="the thread id (configurable.thread_id)")
    p.add_argument("--checkpoint-ns", default="", help="checkpoint_ns, task ids and all")
    p.add_argument("--node", help="metadata.langgraph_node (e.g. tools)")
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
        f"{MIN_KEY_PREFIX} characters)",
    )
    p.add_argument("--json", action="store_true", help="one JSON document")


def run(args: argparse.Namespace, *, out: TextIO, err: TextIO) -> int:
    """Explain one key; 0 done (or ``--key`` matches), 1 ``--key`` differs, 2 bad input."""
    from ..adapters._calling import calling
    from ..adapters.keys import (
        SCOPE_CONFIG_KEY,
        TURN_CONFIG_KEY,
        CallInfo,
        call_info,
        explain_key,
    )
    from ..errors import IdempotencyError

    try:
        arguments = json.loads(args.args)
    except json.JSONDecodeError as exc:
        print(f"langchain-idempotent: error: --args is not JSON: {exc}", file=err)
        return 2
    if not isinstance(arguments, dict):
        print("langchain-idempotent: error: --args must be a JSON object", file=err)
        return 2
    if args.key is not None and len(args.key) < MIN_KEY_PREFIX:
        print(
            f"langchain-idempotent: error: --key {args.key!r} is too short to check: give the "
            f"key, or at least its first {MIN_KEY_PREFIX} characters",
            file=err,
        )
        return 2
    try:
        inputs = json.loads(args.inputs)
    except json.JSONDecodeError as exc:
        print(f"langchain-idempotent: error: --inputs is not JSON: {exc}", file=err)
        return 2
    if not isinstance(inputs, dict) or set(inputs) - {"args", "state", "context"}:
        print(
            'langchain-idempotent: error: --inputs must be a JSON object with "args", '
            '"state" and "context" only',
            file=err,
        )
        return 2
    configurable: dict[str, Any] = {"checkpoint_ns": args.checkpoint_ns}
    if args.thread:
        configurable[SCOPE_CONFIG_KEY] = args.thread
    if args.turn:
        configurable[TURN_CONFIG_KEY] = args.turn
    metadata = {
        k: v for k, v in (("langgraph_node", args.node), ("lc_agent_name", args.agent)) if v
    }
    schema = {"type": "object", "properties": {name: {} for name in arguments}}
    try:
        # The calling call is what a memoized tool running in another graph would set.
        with calling(args.parent_call, "") if args.parent_call else _nothing():
            info: CallInfo = call_info(
                tool=args.tool,
                schema=schema,
                tool_input=arguments,
                tool_call_id=args.tool_call_id,
                config={"configurable": configurable, "metadata": metadata},
                namespace=args.namespace,
                inputs=inputs,
            )
        explained = explain_key(info, scope=args.scope)
    except IdempotencyError as exc:
        print(f"langchain-idempotent: error: {exc}", file=err)
        return 2
    matches = None if args.key is None else explained.key.startswith(args.key)
    if args.json:
        doc: dict[str, Any] = {
            "key": explained.key,
            "scope": explained.scope,
            "parts": dict(explained.parts),
        }
        if matches is not None:
            doc["matches"] = matches
        print(json.dumps(doc, indent=2), file=out)
    else:
        print(explained, file=out)
        if matches is not None:
            print(f"--key {'matches' if matches else 'differs: other parts made it'}", file=out)
    return 1 if matches is False else 0


def _nothing() -> Any:
    import contextlib

    return contextlib.nullcontext()
