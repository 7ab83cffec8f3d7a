"""The opening of a call, written once for the six ways in.

:class:`~.tool.IdempotentTool` (``invoke``, ``ainvoke``, ``run``, ``arun``) and
:class:`~.middleware.IdempotencyMiddleware` (``wrap_tool_call``, ``awrap_tool_call``) open
every call the same way (:func:`opening`): the :class:`Opening` at once when no step is
needed, else approval's flow, which :func:`open_call` / :func:`aopen_call` carry out on the
engine's store (:func:`._asking.drive` / :func:`._asking.adrive`):

1. a read-only tool (``effect="read"``) runs as it is: no key, no store, and
   ``side_effect()`` refused inside it (:func:`~..core.context.passthrough`);
2. a handoff under ``handoff="rerun"`` runs as it is: the current state's answer;
3. otherwise the call's key is derived (``None``: the arguments do not fit the
   model-visible schema, and the tool reports them as it always does);
4. approval and ``authorize`` decide (:func:`.approval.flow`): a rejection is the answer, a
   reviewer's edit brings its own arguments and key.

What follows is each way's own: BaseTool's tool run for the wrapper (the key in its
metadata), the handler for the middleware; both then hand the call to
:meth:`._call.PendingCall.run` / ``arun``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..core.context import passthrough
from ._asking import adrive, drive
from ._handoff import Handoff
from .approval import flow

if TYPE_CHECKING:
    from langchain_core.messages import ToolMessage
    from langchain_core.runnables import RunnableConfig

    from ..core.engine import Engine
    from ..core.policy import Policy
    from ..core.store import BaseIdempotencyStore
    from ._asking import Steps
    from ._call import PendingCall

__all__ = ["Opening", "aopen_call", "open_call", "opening"]


@dataclass(slots=True)
class Opening:
    """How a call goes on: as it is (``as_is``), rejected, or under its key. (Not frozen:
    every call makes one, and nothing changes it once made.)"""

    #: The call under its key (``None``: it runs without one).
    pending: PendingCall | None
    #: What the tool is called with (a reviewer may have edited the arguments).
    tool_input: Any = None
    #: The answer to a call a human rejected or ``authorize`` denied.
    rejection: ToolMessage | None = None
    #: The reviewer's arguments, when they edited the call.
    edited: Mapping[str, Any] | None = None
    #: Run the tool as it is: read-only, or a handoff that reruns.
    as_is: bool = False
    #: For ``as_is``: the tool is read-only (it runs in :func:`passthrough`).
    read: bool = False

    def untouched(self, tool: str) -> contextlib.AbstractContextManager[Any]:
        """What a call that runs as it is runs inside: :func:`passthrough` for a read-only
        tool, nothing for a handoff."""
        return passthrough(tool) if self.read else contextlib.nullcontext()


#: The opening of a read-only tool's call and of a rerun handoff's: shared, no state.
_READ = Opening(None, as_is=True, read=True)
_AS_IS = Opening(None, as_is=True)


def opening(
    engine: Engine,
    handoff: Callable[[], Handoff | None],
    derive: Callable[[], PendingCall | None],
    config: RunnableConfig,
    tool_input: Any = None,
) -> Opening | Steps:
    """The opening of one call of a tool run under ``engine`` (its policy); ``handoff()``
    says what replay means for the tool if it is a handoff, ``derive()`` makes the call's
    key (each asked only when needed); ``tool_input``: what the call was given. Returns the
    :class:`Opening` when it needs no step (no approval, no ``authorize``: most calls),
    else approval's steps, whose flow returns it (:func:`open_call` / :func:`aopen_call`
    carry them out)."""
    policy = engine.policy
    if policy.effect_class == "read":
        return _READ
    if handoff() == "rerun":
        return _AS_IS
    pending = derive()
    if pending is None:
        return Opening(None, tool_input)
    if policy.approval is False and policy.authorize is None:
        return Opening(pending, pending.tool_input)
    return _approved(pending, policy, config)


def _approved(pending: PendingCall, policy: Policy, config: RunnableConfig) -> Steps:
    verdict = yield from flow(pending, policy, config)
    return Opening(verdict.pending, verdict.tool_input, verdict.rejection, verdict.edited)


def open_call(opened: Opening | Steps, store: BaseIdempotencyStore) -> Opening:
    """The :class:`Opening` of :func:`opening`, its steps (if any) carried out on ``store``
    (:func:`._asking.drive`)."""
    if isinstance(opened, Opening):
        return opened
    return drive(opened, store)  # type: ignore[no-any-return]


async def aopen_call(opened: Opening | Steps, store: BaseIdempotencyStore) -> Opening:
    """:func:`open_call` for async callers (:func:`._asking.adrive`)."""
    if isinstance(opened, Opening):
        return opened
    return await adrive(opened, store)  # type: ignore[no-any-return]
