"""Shared pieces for the LangGraph tests: a scripted chat model, an effect ledger, a
hand-built tool-calling graph and a callback handler that records custom events.

Nothing here talks to a network or an LLM: :class:`ScriptedChatModel` (LangChain's
``GenericFakeChatModel`` with a script) answers from a list of messages or functions of
the conversation, and ``bind_tools`` returns the model itself, so ``ToolNode``,
``create_agent`` and ``create_react_agent`` run exactly as they would with a real provider.
"""

from __future__ import annotations

import itertools
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from langchain_core.callbacks import BaseCallbackHandler, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolCall, ToolMessage
from langchain_core.outputs import ChatResult
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langchain_core.tools import BaseTool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Checkpointer, RetryPolicy
from pydantic import ConfigDict, PrivateAttr

Step = AIMessage | Callable[[Sequence[BaseMessage]], AIMessage]


def call(name: str, args: dict[str, Any], id: str | None = None) -> ToolCall:
    """A tool call as a model emits it (a fresh id unless one is given)."""
    return ToolCall(
        name=name, args=args, id=id or f"call_{uuid.uuid4().hex[:12]}", type="tool_call"
    )


def calls(*tool_calls: ToolCall) -> AIMessage:
    """An assistant message that asks for ``tool_calls`` (several = parallel calls)."""
    return AIMessage(content="", tool_calls=list(tool_calls))


def final(text: str = "done") -> AIMessage:
    return AIMessage(content=text)


class ScriptedChatModel(GenericFakeChatModel):
    """A chat model that plays ``script`` one step per call, then ``then`` for ever.

    LangChain's ``GenericFakeChatModel`` plays the replies (its ``messages`` iterator is
    built here from the script); this adds what the tests need on top. A step is an
    ``AIMessage`` or a function of the conversation returning one (for a model that
    decides from what it sees). ``then`` defaults to answering ``"done"``. Every reply is a
    fresh copy, so the graph state never shares a message object. ``bind_tools`` returns
    the model itself. ``calls`` counts the model calls, so a test can tell that an LLM step
    really re-ran. Streaming is off: a reply with tool calls comes back whole.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    script: list[Any] = []
    then: Any = None
    messages: Iterator[AIMessage | str] = iter(())
    disable_streaming: bool = True
    _position: int = PrivateAttr(default=0)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)
    _conversation: Sequence[BaseMessage] = PrivateAttr(default=())

    def model_post_init(self, context: Any) -> None:
        super().model_post_init(context)
        self.messages = self._replies()

    def _replies(self) -> Iterator[AIMessage]:
        for step in itertools.chain(self.script, itertools.repeat(None)):
            if step is None:
                step = self.then if self.then is not None else final()
            message = step(self._conversation) if callable(step) else step
            yield message.model_copy(deep=True)

    @property
    def calls(self) -> int:
        return self._position

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedChatModel:
        return self

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        with self._lock:  # graphs call the model from several threads at once
            self._conversation = messages
            self._position += 1
            return super()._generate(messages, stop, run_manager, **kwargs)


def on_each_turn(*tool_calls: tuple[str, dict[str, Any]]) -> Step:
    """A model step that answers tool results with a final answer and anything else (a
    human message, or another agent's answer) with ``tool_calls``, fresh ids each time."""

    def respond(messages: Sequence[BaseMessage]) -> AIMessage:
        if not messages or messages[-1].type != "tool":
            return calls(*(call(name, args) for name, args in tool_calls))
        return final()

    return respond


class Effects:
    """A thread-safe record of the side effects tools performed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.log: list[tuple[str, dict[str, Any]]] = []

    def record(self, name: str, **args: Any) -> int:
        """Record one effect of ``name``; returns how many ``name`` effects there are now."""
        with self._lock:
            self.log.append((name, args))
            return sum(1 for n, _ in self.log if n == name)

    def count(self, name: str | None = None) -> int:
        with self._lock:
            return sum(1 for n, _ in self.log if name is None or n == name)


def tool_graph(
    model: BaseChatModel,
    tools: Sequence[BaseTool],
    *,
    checkpointer: Checkpointer = None,
    handle_tool_errors: Any = None,
    retry_policy: RetryPolicy | None = None,
    state_schema: type[Any] = MessagesState,
    name: str | None = None,
) -> Any:
    """The classic hand-built agent: ``agent`` ⇄ ``tools`` (a ``ToolNode``) on messages.

    ``handle_tool_errors`` is ToolNode's own default unless given.
    """
    bound = model.bind_tools(tools)

    def agent(state: MessagesState, config: RunnableConfig) -> dict[str, Any]:
        return {"messages": [bound.invoke(state["messages"], config)]}

    async def aagent(state: MessagesState, config: RunnableConfig) -> dict[str, Any]:
        return {"messages": [await bound.ainvoke(state["messages"], config)]}

    builder = StateGraph(state_schema)
    builder.add_node("agent", RunnableLambda(agent, afunc=aagent))
    builder.add_node(
        "tools",
        ToolNode(list(tools))
        if handle_tool_errors is None
        else ToolNode(list(tools), handle_tool_errors=handle_tool_errors),
        retry_policy=retry_policy,
    )
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition, ["tools", END])
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=checkpointer, name=name)


def tool_results(messages: Sequence[BaseMessage]) -> list[tuple[str, Any]]:
    """``(tool_call_id, content)`` of every tool message, in order."""
    return [(m.tool_call_id, m.content) for m in messages if isinstance(m, ToolMessage)]


def assert_every_call_answered(messages: Sequence[BaseMessage]) -> None:
    """Each tool call the model emitted has exactly one tool message with its id (what a
    provider requires of the next request), and no message id appears twice."""
    asked = [str(tc["id"]) for m in messages if isinstance(m, AIMessage) for tc in m.tool_calls]
    answered = [m.tool_call_id for m in messages if isinstance(m, ToolMessage)]
    assert sorted(asked) == sorted(answered), (asked, answered)
    ids = [m.id for m in messages]
    assert len(ids) == len(set(ids)), ids


def thread(thread_id: str, **configurable: Any) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id, **configurable}}


class EventRecorder(BaseCallbackHandler):
    """Records ``idempotency.*`` custom events and the metadata of tool runs."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.tool_metadata: list[dict[str, Any]] = []

    def on_custom_event(self, name: str, data: Any, *, run_id: uuid.UUID, **kwargs: Any) -> None:
        self.events.append((name, dict(data)))

    def on_tool_start(
        self,
        serialized: dict[str, Any],
        input_str: str,
        *,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self.tool_metadata.append(dict(metadata or {}))

    def names(self) -> list[str]:
        return [name for name, _ in self.events]
