"""``Policy``: how long leases last, how long duplicates wait, what to do when unsure.

This module is the one home of every default. Every field has a production default;
durations accept seconds (``float``) or a ``timedelta`` and go through
:func:`~langchain_idempotent.core._durations.to_seconds`. Nothing here reads the environment
unless asked: :meth:`Policy.from_env` reads ``IDEMPOTENCY_<FIELD>`` once, when called.

:class:`PolicyOptions` is the same set of fields as keyword arguments, so
``idempotent(tool, store, lease=5)`` is checked by type checkers and completed by editors
(a test keeps it in step with the dataclass).
"""

from __future__ import annotations

import dataclasses
import math
import os
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal, TypedDict, Unpack

from ._callinfo import CallInfo, KeyFunction, Scope
from ._durations import to_ms, to_seconds
from ._limits import DEFAULT_MAX_RESULT_BYTES
from .encryption import ResultEncryption
from .reconcile import ReconcileOption, check_reconcile, reconciler_for
from .record import ExpiredPolicy

__all__ = [
    "EFFECT_CLASSES",
    "ApprovalPredicate",
    "ApprovalSetting",
    "Authorizer",
    "EffectClass",
    "InterruptMode",
    "Policy",
    "PolicyOptions",
    "needs_approval",
    "preset",
]

#: Field metadata for options that only code can give (types, not strings).
_CODE_ONLY = {"env": False}

#: What a tool's effect is, as a preset of the options below (docs/effects.md):
#: ``read`` no effect: the call passes straight through, no store round trip;
#: ``keyed`` the downstream deduplicates by the key it is handed: a takeover re-sends;
#: ``unsafe`` never re-run blind: a takeover asks ``reconcile=`` or raises outcome unknown;
#: ``irreversible`` a human approves each new effect, and a takeover raises unless reconciled.
EffectClass = Literal["read", "keyed", "unsafe", "irreversible"]
EFFECT_CLASSES: tuple[EffectClass, ...] = typing.get_args(EffectClass)

#: Decides per call whether a human is asked (``lambda call: call.args["amount"] > 500``).
ApprovalPredicate = Callable[[CallInfo], bool]
#: ``True`` (every new effect asks), ``False`` (never), a predicate, or one of those per
#: tool name (``{"issue_refund": True}``; a tool not named never asks).
ApprovalSetting = bool | ApprovalPredicate | Mapping[str, bool | ApprovalPredicate]
#: How approval asks (LangChain's ``HumanInTheLoopMiddleware`` spelling): ``"batched"``,
#: a ``HITLRequest`` answered with ``{"decisions": [decision]}``; ``"per_call"``, a
#: ``ToolApprovalRequest`` with a ``response_schema``, answered with one decision.
InterruptMode = Literal["batched", "per_call"]
_INTERRUPT_MODES = ("batched", "per_call")
#: Asked immediately before an approved effect runs (after any resume), with the call's
#: :class:`CallInfo` and the reviewer's decision (``None`` for a call no human was asked
#: about); sync or async. A false answer, or an exception, denies the call: it is answered
#: like a rejection, nothing runs and nothing is stored (docs/approval.md).
Authorizer = Callable[[CallInfo, Any], Any]


def needs_approval(setting: ApprovalSetting | None, info: CallInfo) -> bool:
    """Whether ``info`` asks a human under ``setting`` (``None``: not given, never)."""
    if setting is None:
        return False
    if isinstance(setting, Mapping):
        setting = setting.get(info.tool, False)
    if isinstance(setting, bool):
        return setting
    return bool(setting(info))


def _check_approval(setting: object, mode: object) -> None:
    """A clear error for an approval setting that is not a bool, a function or a mapping
    of tool names to those, and for an unknown ``interrupt_mode``."""
    values = setting.items() if isinstance(setting, Mapping) else [("approval", setting)]
    for name, value in values if setting is not None else ():
        if not isinstance(name, str) or (not isinstance(value, bool) and not callable(value)):
            raise TypeError(
                "approval must be True, False, a function of the call (CallInfo -> bool), or "
                f"a dict of tool names to those; got {setting!r}"
            )
    if mode not in _INTERRUPT_MODES:
        raise ValueError(f"interrupt_mode must be 'batched' or 'per_call', got {mode!r}")


@dataclass(frozen=True, kw_only=True)
class Policy:
    #: How long a claim is held without renewal; renewed every ``lease * renew_fraction``
    #: while the tool runs, so it only bounds how long a *crashed* owner blocks the key
    #: (a dead worker's call is taken over within it). A live owner that cannot renew for
    #: longer than ``lease * (1 - renew_fraction)`` (a process paused, a blocked event loop
    #: in an async tool, a GIL-holding stall) may be taken over: raise it for such tools.
    lease: float | timedelta = 2.0
    #: How long records (results and leases) are kept; at least ``lease``. A
    #: human-in-the-loop thread that resumes later than this can run the tool again.
    ttl: float | timedelta = timedelta(hours=24)
    #: How long a duplicate call waits for the owner's result before ``InProgressError``
    #: (``0``: do not wait). ``None``: wait as long as the owner keeps renewing its lease
    #: (a tool that runs for minutes); if the owner dies, the wait ends when its lease
    #: expires and the waiter takes over (or raises, per ``on_expired``).
    wait_timeout: float | timedelta | None = 60.0
    #: An expired lease with no result: ``"takeover"`` re-runs with the same key passed
    #: downstream; ``"raise"`` raises ``OutcomeUnknownError`` and leaves the record.
    #: ``None`` (not given): the effect class's preset, else ``"takeover"``
    #: (:meth:`for_tool` gives the value a call uses).
    on_expired: ExpiredPolicy | None = None
    #: Run the tool unprotected when the store is unreachable (default: fail closed).
    fail_open: bool = False
    #: Exceptions that are final: stored as a failed record and re-raised on replay.
    #: Any other exception releases the key so a retry runs again, unless it leaves the
    #: effect unknown (see ``not_sent``): then the key is kept uncertain.
    terminal_exceptions: tuple[type[BaseException], ...] = field(default=(), metadata=_CODE_ONLY)
    #: Types (pydantic models, dataclasses) the tool returns that must replay as themselves.
    allowed_types: tuple[type | tuple[str, str], ...] = field(default=(), metadata=_CODE_ONLY)
    #: The largest serialized result that is stored (``ResultTooLargeError`` above it).
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES
    #: Renew the lease after this fraction of it has passed (every 0.5 s by default).
    renew_fraction: float = 1 / 4
    #: Separates applications and tenants sharing one store.
    namespace: str = "default"
    #: What one effect is: ``"thread"``, ``"turn"``, ``"call"`` or a key function.
    scope: Scope | KeyFunction = "thread"
    #: Run the tool inside a database transaction of the store (PostgreSQL only) and write
    #: the completion in it: the tool's writes on ``get_idempotency_context().connection``
    #: and the record commit together, only while this run still owns the lease.
    transactional: bool = field(default=False, metadata=_CODE_ONLY)
    #: Ask a human before a new effect (see :mod:`.approval`): ``True``, a predicate of the
    #: call, or a dict of tool names to those. Completed effects replay without asking.
    #: ``None`` (not given): the effect class's preset, else ``False``.
    approval: ApprovalSetting | None = field(default=None, metadata=_CODE_ONLY)
    #: The format approval asks in: ``"batched"`` (LangChain's ``HITLRequest``, one call per
    #: request) or ``"per_call"`` (a ``ToolApprovalRequest`` whose ``response_schema``
    #: LangGraph checks before it saves the answer).
    interrupt_mode: InterruptMode = field(default="batched", metadata=_CODE_ONLY)
    #: How long a reviewer's approval stays good for its effect: a stored decision older
    #: than this (on the store's clock) when the effect is about to run is asked again.
    #: ``None``: it does not expire (until the record's ``ttl``).
    approval_ttl: float | timedelta | None = field(default=None, metadata=_CODE_ONLY)
    #: Checked immediately before each new effect, after any resume (:data:`Authorizer`):
    #: it can deny a call a human approved (a mandate revoked while the run was paused).
    authorize: Authorizer | None = field(default=None, metadata=_CODE_ONLY)
    #: Asked on every takeover of a call whose outcome is unknown (sync or async, one
    #: function or a dict per tool name): the result if the effect happened, else ``None``
    #: (:mod:`langchain_idempotent.core.reconcile`).
    reconcile: ReconcileOption | None = field(default=None, metadata=_CODE_ONLY)
    #: The tool marks its external call with ``get_idempotency_context().side_effect()``:
    #: each claim of a clean attempt records that it has not reached it yet, so a takeover
    #: of an attempt that never entered the block is a clean retry (no ``reconcile``, never
    #: outcome unknown; a takeover's own unknown outcome stays unknown). One store write
    #: more per run, when the block is entered. Code-only: it states what the tool's code
    #: does.
    boundary: bool = field(default=False, metadata=_CODE_ONLY)
    #: Exceptions that prove nothing left the process (``(httpx.ConnectError,
    #: ConnectionRefusedError)``): they release the key, a free retry. Any other exception
    #: raised after the ``side_effect()`` block was entered (in an ``unsafe`` or
    #: ``irreversible`` tool without ``boundary``: anywhere) leaves the outcome unknown:
    #: the key is abandoned and the next claim reconciles (docs/effects.md).
    not_sent: tuple[type[Exception], ...] = field(default=(), metadata=_CODE_ONLY)
    #: The tool's effect class (:data:`EffectClass`), or a dict of tool names to classes:
    #: a preset of ``on_expired`` and ``approval``, for those left ``None`` (options given
    #: win). Resolved per tool by :meth:`for_tool`.
    effect: EffectClass | Mapping[str, EffectClass] | None = field(
        default=None, metadata=_CODE_ONLY
    )
    #: Identical calls in one ``AIMessage`` (same tool, same arguments): ``"share"`` one
    #: effect (default), ``"run"`` each once (a key per position), ``"reject"`` all but
    #: the first (an error ``ToolMessage``).
    identical_calls: Literal["share", "run", "reject"] = field(default="share", metadata=_CODE_ONLY)
    #: Time travel (a branch LangGraph started with ``update_state`` or by resuming from an
    #: earlier checkpoint): ``"replay"`` its calls' stored results (default), or ``"run"``
    #: them as new effects (one key per branch; one checkpointer read per call).
    on_fork: Literal["replay", "run"] = field(default="replay", metadata=_CODE_ONLY)
    #: The graph-state fields that enter the key (docs/keys.md): needed by a tool that is
    #: given the whole state (``InjectedState`` without a field, a ``ToolRuntime``), which
    #: is refused without it; ``()`` says the state it reads never changes the effect.
    key_state: tuple[str, ...] | None = field(default=None, metadata=_CODE_ONLY)
    #: Injected parameters (and ``"context"``, the run's static context) that stay out of
    #: the key: handles, or inputs the effect does not depend on.
    key_exclude: tuple[str, ...] = field(default=(), metadata=_CODE_ONLY)
    #: Seal every stored result and failure with AES-256-GCM, bound to its record
    #: (docs/encryption.md). :meth:`from_env` reads it from ``IDEMPOTENCY_ENCRYPTION_KEYS``.
    encryption: ResultEncryption | None = field(default=None, metadata=_CODE_ONLY)

    lease_s: float = field(init=False, repr=False)
    ttl_s: float = field(init=False, repr=False)
    #: ``wait_timeout`` in seconds; ``math.inf`` for ``wait_timeout=None``.
    wait_timeout_s: float = field(init=False, repr=False)
    #: ``approval_ttl`` in milliseconds (``None``: no expiry).
    approval_ttl_ms: int | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        lease_s = to_seconds(self.lease, "lease")
        ttl_s = to_seconds(self.ttl, "ttl")
        object.__setattr__(self, "lease_s", lease_s)
        object.__setattr__(self, "ttl_s", ttl_s)
        object.__setattr__(
            self,
            "wait_timeout_s",
            math.inf
            if self.wait_timeout is None
            else to_seconds(self.wait_timeout, "wait_timeout", allow_zero=True, allow_inf=True),
        )
        object.__setattr__(
            self,
            "approval_ttl_ms",
            None
            if self.approval_ttl is None
            else to_ms(to_seconds(self.approval_ttl, "approval_ttl")),
        )
        if self.authorize is not None and not callable(self.authorize):
            raise TypeError(
                "authorize must be a function of the call and the decision "
                f"(CallInfo, Decision | None) -> bool, sync or async; got {self.authorize!r}"
            )
        if ttl_s < lease_s:
            raise ValueError(
                f"ttl ({ttl_s:g}s) must be at least the lease ({lease_s:g}s): a record must "
                f"outlive the lease that protects it. Pass a longer ttl= (e.g. ttl={lease_s:g}) "
                f"or a shorter lease= (e.g. lease={ttl_s:g})"
            )
        if self.on_expired not in ("takeover", "raise", None):
            raise ValueError(f"on_expired must be 'takeover' or 'raise', got {self.on_expired!r}")
        if not 0 < self.renew_fraction < 1:
            raise ValueError("renew_fraction must be between 0 and 1")
        if isinstance(self.max_result_bytes, bool) or self.max_result_bytes <= 0:
            raise ValueError("max_result_bytes must be positive")
        if not isinstance(self.namespace, str) or not self.namespace:
            raise ValueError("namespace must be a non-empty string")
        if not callable(self.scope) and self.scope not in ("thread", "turn", "call"):
            raise ValueError(
                f"scope must be 'thread', 'turn', 'call' or a function, got {self.scope!r}"
            )
        if not isinstance(self.transactional, bool):
            raise ValueError(f"transactional must be True or False, got {self.transactional!r}")
        if not isinstance(self.boundary, bool):
            raise ValueError(f"boundary must be True or False, got {self.boundary!r}")
        _check_effect(self.effect)
        if self.on_fork not in ("replay", "run"):
            raise ValueError(f"on_fork must be 'replay' or 'run', got {self.on_fork!r}")
        if self.encryption is not None and not isinstance(self.encryption, ResultEncryption):
            raise TypeError(
                f"encryption must be a ResultEncryption, got {type(self.encryption).__name__}"
            )
        if self.identical_calls not in ("share", "run", "reject"):
            raise ValueError(
                f"identical_calls must be 'share', 'run' or 'reject', got {self.identical_calls!r}"
            )
        if self.effect == "read" and self.boundary:
            raise ValueError(
                "effect='read' has no side effect to mark: drop boundary=True, or declare "
                "another effect class"
            )
        _check_approval(self.approval, self.interrupt_mode)
        for name in ("key_state", "key_exclude"):
            names = getattr(self, name)
            if names is None and name == "key_state":
                continue
            if isinstance(names, str) or not all(isinstance(n, str) and n for n in names):
                raise ValueError(f"{name} must be a list of names, got {names!r}")
            object.__setattr__(self, name, tuple(names))
        check_reconcile(self.reconcile)
        object.__setattr__(self, "terminal_exceptions", tuple(self.terminal_exceptions))
        object.__setattr__(self, "allowed_types", tuple(self.allowed_types))
        object.__setattr__(self, "not_sent", _exception_classes(self.not_sent, "not_sent"))

    @property
    def lease_ms(self) -> int:
        return to_ms(self.lease_s)

    @property
    def ttl_ms(self) -> int:
        return to_ms(self.ttl_s)

    def with_options(self, **options: Unpack[PolicyOptions]) -> Policy:
        """This policy with some fields replaced; an unknown name is a ``TypeError`` that
        lists the known ones."""
        unknown = sorted(set(options) - set(option_names()))
        if unknown:
            raise TypeError(
                f"unknown idempotency option(s) {', '.join(unknown)}; "
                f"known options: {', '.join(option_names())}"
            )
        return dataclasses.replace(self, **options) if options else self

    @property
    def effect_class(self) -> EffectClass | None:
        """The effect class of a policy resolved by :meth:`for_tool` (``None``: none)."""
        return self.effect if isinstance(self.effect, str) else None

    def for_tool(self, tool: str | None, *, hinted: EffectClass | None = None) -> Policy:
        """This policy for one tool (``None``: a call of no named tool): its effect class
        (the one class, or its entry in the dict; else ``hinted``, the class the tool's
        own annotations suggest: an explicit ``effect=`` always wins), and the class's
        preset (:func:`preset`) for each of ``on_expired`` and ``approval`` left ``None``.
        The result holds the values a call uses; it is its own ``for_tool``."""
        effect = self.effect
        chosen = self.effect_of(tool) or hinted
        reconciled = reconciler_for(self.reconcile, tool) is not None
        unset = {
            name: value
            for name, value in preset(chosen, reconciled=reconciled).items()
            if getattr(self, name) is None
        }
        if chosen == effect and not unset:
            return self
        return dataclasses.replace(self, effect=chosen, **unset)

    def effect_of(self, tool: str | None) -> EffectClass | None:
        """The effect class ``effect=`` gives ``tool`` explicitly (``None``: none)."""
        effect = self.effect
        return effect.get(tool or "") if isinstance(effect, Mapping) else effect

    @classmethod
    def from_env(
        cls, prefix: str = "IDEMPOTENCY_", *, environ: Mapping[str, str] | None = None
    ) -> Policy:
        """A policy from ``<prefix><FIELD>`` variables (``IDEMPOTENCY_LEASE=12``,
        ``IDEMPOTENCY_ON_EXPIRED=raise``, ...), read once, now; unset fields keep their
        defaults. ``terminal_exceptions``, ``allowed_types`` and ``reconcile`` are code-only;
        ``IDEMPOTENCY_ENCRYPTION_KEYS`` gives ``encryption``
        (:meth:`~.encryption.ResultEncryption.from_env`).

        Values are parsed with pydantic for the field's type (durations: seconds or an ISO
        8601 duration); a bad value is a ``ValueError`` naming the variable.
        """
        from pydantic import TypeAdapter, ValidationError

        env = os.environ if environ is None else environ
        hints = typing.get_type_hints(cls)
        values: dict[str, Any] = {}
        for name in env_fields():
            variable = f"{prefix}{name.upper()}"
            raw = env.get(variable)
            if raw is None:
                continue
            try:
                values[name] = TypeAdapter(hints[name]).validate_python(raw)
            except ValidationError as exc:
                problem = exc.errors()[0]["msg"]
                raise ValueError(f"{variable}={raw!r}: {problem}") from None
        if f"{prefix}ENCRYPTION_KEYS" in env:  # keys: parsed by their own class, never echoed
            values["encryption"] = ResultEncryption.from_env(
                f"{prefix}ENCRYPTION_KEYS", environ=env
            )
        try:
            return cls(**values)
        except ValueError as exc:
            names = ", ".join(f"{prefix}{n.upper()}" for n in values)
            raise ValueError(f"{exc} (from the environment: {names})") from None


class PolicyOptions(TypedDict, total=False):
    """The fields of :class:`Policy` as keyword arguments (``idempotent(..., lease=5)``)."""

    lease: float | timedelta
    ttl: float | timedelta
    wait_timeout: float | timedelta | None
    on_expired: ExpiredPolicy | None
    fail_open: bool
    terminal_exceptions: tuple[type[BaseException], ...]
    allowed_types: tuple[type | tuple[str, str], ...]
    max_result_bytes: int
    renew_fraction: float
    namespace: str
    scope: Scope | KeyFunction
    transactional: bool
    approval: ApprovalSetting | None
    interrupt_mode: InterruptMode
    approval_ttl: float | timedelta | None
    authorize: Authorizer | None
    reconcile: ReconcileOption | None
    boundary: bool
    not_sent: tuple[type[Exception], ...]
    effect: EffectClass | Mapping[str, EffectClass] | None
    identical_calls: Literal["share", "run", "reject"]
    on_fork: Literal["replay", "run"]
    key_state: tuple[str, ...] | None
    key_exclude: tuple[str, ...]
    encryption: ResultEncryption | None


def preset(effect: EffectClass | None, *, reconciled: bool) -> dict[str, Any]:
    """What an effect class sets ``on_expired`` and ``approval`` to when they are not given
    (``None``: no class). ``reconciled``: the tool has a ``reconcile=`` hook, so an
    ``"unsafe"`` takeover can ask it instead of raising. A pure table (docs/effects.md)."""
    if effect == "irreversible":
        return {"on_expired": "raise", "approval": True}
    if effect == "unsafe" and not reconciled:
        return {"on_expired": "raise", "approval": False}
    return {"on_expired": "takeover", "approval": False}


def _check_effect(effect: object) -> None:
    """Refuse anything but ``None``, an effect class, or a dict of tool names to classes."""
    if effect is None:
        return
    items = effect.items() if isinstance(effect, Mapping) else [(None, effect)]
    for tool, chosen in items:
        if tool is not None and (not isinstance(tool, str) or not tool):
            raise ValueError(f"effect= as a dict needs tool names as keys, got {tool!r}")
        if chosen not in EFFECT_CLASSES:
            where = f" for tool {tool!r}" if tool is not None else ""
            raise ValueError(
                f"unknown effect class {chosen!r}{where}; valid: {', '.join(EFFECT_CLASSES)}"
            )


def _exception_classes(value: object, option: str) -> tuple[type[Exception], ...]:
    """``value`` as a tuple of exception classes (one class is accepted too); anything
    else is a ``TypeError`` naming the option and the offending item."""
    items = (value,) if isinstance(value, type) else value
    if not isinstance(items, (tuple, list, set, frozenset)):
        raise TypeError(
            f"{option}= takes exception classes, e.g. {option}=(httpx.ConnectError, "
            f"ConnectionRefusedError); got {value!r}"
        )
    for item in items:
        if not (isinstance(item, type) and issubclass(item, Exception)):
            raise TypeError(
                f"{option}= takes exception classes (subclasses of Exception), got {item!r} "
                f"in {value!r}"
            )
    return tuple(items)


def option_names() -> tuple[str, ...]:
    """The names :class:`Policy` takes as options, in field order."""
    return tuple(f.name for f in dataclasses.fields(Policy) if f.init)


def env_fields() -> tuple[str, ...]:
    """The fields :meth:`Policy.from_env` reads (every option a string can give)."""
    return tuple(
        f.name for f in dataclasses.fields(Policy) if f.init and f.metadata.get("env", True)
    )
