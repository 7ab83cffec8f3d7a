"""Plain functions: the tool the model is shown, and a call made as the function is called.

LangChain has two ways to show a model a plain function, and they disagree.
``model.bind_tools([fn])`` (a hand-built graph: LangChain's react-agent and memory-agent
templates) converts it with ``convert_to_openai_tool``, which parses a Google docstring: the
summary becomes the description and each ``Args:`` entry its parameter's description.
``tool(fn)`` (what ``create_agent(tools=[fn])`` and ``ToolNode([fn])`` do) shows the whole
docstring, indentation and ``Args:`` included, and no parameter descriptions.
:func:`tool_from_function` builds the tool ``bind_tools`` describes, so wrapping a function
changes nothing the model of a hand-built graph sees; the wrapped tool is a ``BaseTool``,
so ``create_agent`` and ``ToolNode`` show the model that same schema. Where LangChain's
parser refuses the docstring (an ``Args:`` entry naming no parameter, on which
``bind_tools`` raises) the tool is ``tool(fn)``'s. The one place the schema departs from
``bind_tools``: a ``config: RunnableConfig`` parameter without ``InjectedToolArg``, which
``bind_tools`` shows the model as an argument to fill in and a tool run fills in itself.

:class:`FunctionCall` turns a call of the wrapped function (``refund("INV-7", 140)``) into
the tool input and config it is invoked with: the arguments by name, and the
``RunnableConfig`` parameter, when the caller passes it, as the run's config (LangChain
hands it back to the function, as a tool run does); ``callbacks`` become the run's
callbacks (the function gets their child manager, as a tool run passes it).
"""

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, get_type_hints

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, StructuredTool
from langchain_core.tools import tool as as_tool

__all__ = ["FunctionCall", "tool_from_function"]


def tool_from_function(fn: Callable[..., Any]) -> BaseTool:
    """``fn`` as the tool ``model.bind_tools([fn])`` describes (module docstring)."""
    coroutine = fn if inspect.iscoroutinefunction(fn) else None
    try:
        return StructuredTool.from_function(
            None if coroutine else fn, coroutine, parse_docstring=True
        )
    except (ValueError, AttributeError):
        # A docstring the parser refuses: tool(fn) takes it whole (and repeats a refusal
        # that is not about the docstring: a missing one, a callable with no name).
        return as_tool(fn)


@dataclass(frozen=True, slots=True)
class FunctionCall:
    """How a call of ``fn`` becomes a tool invocation."""

    name: str
    signature: inspect.Signature
    #: The parameter LangChain fills with the run's config (``_get_runnable_config_param``'s
    #: rule: the first annotated exactly ``RunnableConfig``), if any.
    config_param: str | None

    @classmethod
    def of(cls, fn: Callable[..., Any], name: str) -> "FunctionCall":
        try:
            hints = get_type_hints(fn)
        except Exception:  # unresolvable annotations: LangChain finds no config parameter
            hints = {}
        config_param = next((n for n, t in hints.items() if t is RunnableConfig), None)
        return cls(name, inspect.signature(fn), config_param)

    def tool_input(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[dict[str, Any], RunnableConfig | None]:
        """The tool input (arguments by name) and the config the caller passed, if any."""
        try:
            # partial: the config parameter may be left out (the run fills it in)
            bound = self.signature.bind_partial(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{self.name}(): {exc}") from None
        for name, param in self.signature.parameters.items():
            if (
                param.default is param.empty
                and param.kind not in (param.VAR_POSITIONAL, param.VAR_KEYWORD)
                and name not in bound.arguments
                and name != self.config_param
            ):
                raise TypeError(f"{self.name}(): missing a required argument: {name!r}")
        tool_input: dict[str, Any] = {}
        for name, value in bound.arguments.items():
            kind = self.signature.parameters[name].kind
            if kind is inspect.Parameter.VAR_KEYWORD:
                tool_input.update(value)
            elif kind is inspect.Parameter.VAR_POSITIONAL:
                if value:
                    raise TypeError(
                        f"{self.name}(): extra positional arguments {value!r} cannot be "
                        f"passed to a tool, which takes its arguments by name"
                    )
            else:
                tool_input[name] = value
        config = tool_input.pop(self.config_param, None) if self.config_param else None
        if "run_manager" in tool_input:
            raise TypeError(
                f"{self.name}(): run_manager is LangChain's to pass (the tool run's own); "
                "pass callbacks= instead"
            )
        if "callbacks" in tool_input:  # the tool run's handlers; the function gets its child
            config = {**(config or {}), "callbacks": tool_input.pop("callbacks")}
        return tool_input, config
