"""A graph that makes one blocking call in the event loop: the positive control showing
that the dev server's blocking-call detector is on (its run must fail)."""

from __future__ import annotations

import time

from langgraph.graph import START, MessagesState, StateGraph


async def block(state: MessagesState) -> dict[str, list[str]]:
    time.sleep(0.01)  # a blocking call inside an async node
    return {"messages": []}


def graph():  # type: ignore[no-untyped-def]
    builder = StateGraph(MessagesState)
    builder.add_node("block", block)
    builder.add_edge(START, "block")
    return builder.compile()
