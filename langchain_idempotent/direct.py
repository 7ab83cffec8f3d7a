"""Calling a tool's own ``_run`` / ``_arun`` the way ``BaseTool.run`` / ``arun`` would.

:class:`~langchain_idempotent.tool.IdempotentTool` is itself a ``BaseTool``: LangChain's
``run`` already opened the tool run (callbacks, tracing), parsed and validated the
arguments with the inner tool's own ``_to_args_and_kwargs``, and will format the output
(``ToolMessage``, ``content_and_artifact``) and handle errors the way the inner tool is
configured to. Going through the inner tool's ``invoke`` would do all of that a second
time and show the model's one call as two nested tool runs. So the wrapper hands the
parsed arguments straight to the inner tool's ``_run`` (``_arun``), adding its
``run_manager`` and ``RunnableConfig`` parameters exactly when ``BaseTool.run`` would;
what those are is read once per wrapped tool, not on every call.

Tools whose class overrides ``invoke``, ``ainvoke``, ``run`` or ``arun`` (beyond
LangChain's own ``StructuredTool`` and ``Tool``) are called through ``invoke`` as before
(:meth:`DirectCall.of` returns ``None``): their override may do work that ``_run`` does
not.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForToolRun, CallbackManagerForToolRun
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, StructuredTool, Tool

__all__ = ["DirectCall"]

_ENTRY_POINTS = ("invoke", "ainvoke", "run", "arun")
#: The entry points of LangChain's own tool classes. ``StructuredTool`` and ``Tool``
#: override ``ainvoke`` only to run a sync-only tool's ``invoke`` in an executor, which
#: their ``_arun`` does for ``_run`` as well.
_KNOWN = {
    name: {getattr(kind, name) for kind in (BaseTool, StructuredTool, Tool)}
    for name in _ENTRY_POINTS
}


@dataclass(frozen=True, slots=True)
class _Params:
    """Which of ``run_manager`` and a ``RunnableConfig`` parameter a method takes."""

    run_manager: bool
    config: str | None

    @classmethod
    def of(cls, method: Callable[..., Any]) -> _Params:
        from langchain_core.tools.base import _get_runnable_config_param
        from langchain_core.utils._signature import _signature_parameters

        return cls(
            run_manager=bool(_signature_parameters(method).get("run_manager")),
            config=_get_runnable_config_param(method),
        )

    def kwargs(
        self, tool_kwargs: Mapping[str, Any], run_manager: Any, config: Any
    ) -> dict[str, Any]:
        out = dict(tool_kwargs)
        if self.run_manager:
            out["run_manager"] = run_manager
        if self.config is not None:
            out[self.config] = config
        return out


@dataclass(frozen=True, slots=True)
class DirectCall:
    """How to call one tool's ``_run`` and ``_arun`` with already parsed arguments."""

    tool: BaseTool
    sync: _Params
    async_: _Params

    @classmethod
    def of(cls, tool: BaseTool) -> DirectCall | None:
        kind = type(tool)
        if any(getattr(kind, name) not in _KNOWN[name] for name in _ENTRY_POINTS):
            return None
        try:
            sync = _Params.of(tool._run)
            # As BaseTool.arun: a tool without its own _arun runs _run in an executor.
            uses_run = kind._arun is BaseTool._arun
            async_ = _Params.of(tool._run if uses_run else tool._arun)
        except (ImportError, AttributeError, TypeError, ValueError, NameError):
            return None  # a LangChain whose internals moved: go through invoke
        return cls(tool, sync, async_)

    def run(
        self,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        *,
        config: RunnableConfig,
        run_manager: CallbackManagerForToolRun | None,
    ) -> Any:
        return self.tool._run(*args, **self.sync.kwargs(kwargs, run_manager, config))

    async def arun(
        self,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        *,
        config: RunnableConfig,
        run_manager: AsyncCallbackManagerForToolRun | None,
    ) -> Any:
        return await self.tool._arun(*args, **self.async_.kwargs(kwargs, run_manager, config))
