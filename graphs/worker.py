"""One worker process of the batch: pull tickets, run the agent, retry with backoff.

The worker loop is the one a team writes without idempotency in mind, and a good one: a
ticket that fails (an LLM gateway 502, a lease held elsewhere, lock contention) is retried
with exponential backoff and jitter, and every attempt *resumes the ticket's thread* from
the checkpointer — so a ticket that another worker started, or that a dead worker left
half done, continues where it stopped.

A worker reports only through the shared arrays of :mod:`graphs.shared`: it marks the ticket
it is on, counts events as they happen, and marks the ticket done. If it dies mid-ticket,
its slot still names the ticket, and the parent re-queues it for another worker.
"""

from __future__ import annotations

import importlib
import logging
import os
import random
import ssl
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import certifi
import httpx
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.graph import MessagesState

from langchain_idempotent import BaseIdempotencyStore, IdempotencyEvent, SqliteIdempotencyStore
from langchain_idempotent.stores import parse_store_url

from .fake_model import ScriptedRefundModel, escalated
from .faults import chance
from .reference import RedisKV, ReferenceIdempotency, ReferenceIdempotentTool, ReferenceKV, SqliteKV
from .refund_agent import RefundAgent, build_refund_agent, sqlite_checkpointer
from .shared import DONE, FAILED, KILLED_EXIT_CODE, MODES, PENDING, Shared, WorkerConfig
from .tickets import Ticket
from .tools import DEFAULT_TIMEOUT, make_reconcilers

if TYPE_CHECKING:
    from multiprocessing.queues import Queue

__all__ = ["answered", "build_worker_agent", "run_ticket", "worker_main"]

#: Built once, in the fork server that preloads this module, and inherited by every worker:
#: loading the CA bundle costs ~0.2 s of CPU per ``httpx.Client``, and a batch starts a
#: worker for every one that a fault kills.
_TLS = ssl.create_default_context(cafile=certifi.where())

_EVENT_COUNTERS = {
    "replay": "replayed",
    "wait": "waits",
    "takeover": "takeovers",
    "free_retry": "free_retries",
    "lease_lost": "lease_lost",
    "stale_completion": "stale_completion",
    "contention": "lock_contention",
}
#: A ``reconcile`` event's counter, by its outcome.
_RECONCILE_COUNTERS = {
    "found": "reconciled_found",
    "not_found": "reconciled_not_found",
    "error": "reconcile_errors",
}


class _KillSwitch:
    """Kills this process inside ``issue_refund`` after the provider committed (``armed``)
    or before its POST (``armed_before``)."""

    def __init__(self, shared: Shared, slot: int) -> None:
        self.armed = self.armed_before = False
        self._shared, self._slot = shared, slot

    def __call__(self) -> None:
        if self.armed:
            self._die("worker_kill")

    def before(self) -> None:
        if self.armed_before:
            self._die("worker_kill_before")

    def _die(self, counter: str) -> None:
        self._shared.count(self._slot, counter)
        os._exit(KILLED_EXIT_CODE)  # no cleanup, no result stored, lease/lock left held


def _make_model(cfg: WorkerConfig, on_fault: Callable[[str], None]) -> BaseChatModel:
    if cfg.model is None or cfg.model == "fake":
        return ScriptedRefundModel(
            seed=cfg.seed,
            error_rate=cfg.rates.llm_502,
            drift_rate=cfg.rates.arg_drift,
            on_fault=on_fault,
        )
    provider, _, name = cfg.model.partition(":")
    if provider != "openai" or not name:
        raise ValueError(f"--model must be 'fake' or 'openai:<model name>', got {cfg.model!r}")
    if not os.environ.get("OPENAI_API_KEY"):
        raise RuntimeError("--model openai:... needs OPENAI_API_KEY in the environment")
    # langchain-openai is an optional extra: imported only when asked for.
    chat_openai = importlib.import_module("langchain_openai").ChatOpenAI
    model: BaseChatModel = chat_openai(model=name, temperature=0, timeout=60.0, max_retries=0)
    return model


def _make_store(cfg: WorkerConfig) -> BaseIdempotencyStore:
    """The records' store: ``cfg.store_url`` under this run's prefix or table, or a
    SQLite file in the mode's work directory."""
    if cfg.store_url is None:
        return SqliteIdempotencyStore(Path(cfg.workdir) / "idempotency.sqlite")
    kind = parse_store_url(cfg.store_url).kind
    # Imported only when asked for: the default run needs neither redis-py nor psycopg.
    if kind == "redis":
        from langchain_idempotent import RedisIdempotencyStore

        return RedisIdempotencyStore.from_url(cfg.store_url, prefix=cfg.redis_prefix)
    if kind == "postgres":
        from langchain_idempotent import PostgresIdempotencyStore

        return PostgresIdempotencyStore.from_url(cfg.store_url, table=cfg.store_table)
    if kind == "sqlite":
        return SqliteIdempotencyStore.from_url(cfg.store_url, table=cfg.store_table)
    raise ValueError(f"the batch cannot keep its records in a {kind} store: {cfg.store_url!r}")


def _make_kv(cfg: WorkerConfig) -> ReferenceKV:
    """The reference recipe's keys: in Redis when the store is Redis, else a SQLite file."""
    if cfg.store_url is not None and parse_store_url(cfg.store_url).kind == "redis":
        return RedisKV.from_url(cfg.store_url, prefix=cfg.redis_prefix)
    return SqliteKV(Path(cfg.workdir) / "reference.sqlite")


def build_worker_agent(
    cfg: WorkerConfig, shared: Shared, slot: int
) -> tuple[RefundAgent, _KillSwitch]:
    """The agent for ``cfg.mode`` (the pipeline when ``cfg.pipeline``), wired to this
    slot's counters and kill switch."""

    def count(name: str) -> None:
        shared.count(slot, name)

    def on_event(event: IdempotencyEvent | str) -> None:
        kind = event if isinstance(event, str) else event.kind
        if kind in _EVENT_COUNTERS:
            count(_EVENT_COUNTERS[kind])
        elif kind == "reconcile" and not isinstance(event, str):
            count(_RECONCILE_COUNTERS[event.detail["outcome"]])
        elif kind == "abandon" and not isinstance(event, str) and event.detail["reason"] == "error":
            count("errors_uncertain")  # a lost response, a 502 after the POST began: unknown

    kill = _KillSwitch(shared, slot)
    http = httpx.Client(base_url=cfg.provider_url, timeout=DEFAULT_TIMEOUT, verify=_TLS)
    store: BaseIdempotencyStore | None = None
    protect: Callable[[list[BaseTool]], list[BaseTool]] | None = None
    idempotency: dict[str, Any] = {}
    if cfg.mode == "idempotent":
        store = _make_store(cfg)
        idempotency = {
            "lease": cfg.lease,
            "wait_timeout": cfg.wait_timeout,
            "ttl": cfg.retention,
            "namespace": f"refund-batch-{cfg.run_id}",
            "on_event": on_event,
            "reconcile": make_reconcilers(http),  # ask the provider before re-sending
            "boundary": cfg.boundary,  # the POSTs are marked with side_effect()
        }
    elif cfg.mode == "reference":
        guard = ReferenceIdempotency(
            _make_kv(cfg), lock_ttl=cfg.lease, result_ttl=cfg.retention, on_event=on_event
        )

        def protect(tools: list[BaseTool]) -> list[BaseTool]:
            return ReferenceIdempotentTool.wrap(tools, guard)

    elif cfg.mode != "none":
        raise ValueError(f"unknown protection mode {cfg.mode!r}; expected one of {MODES}")
    checkpointer = sqlite_checkpointer(Path(cfg.workdir) / "checkpoints.sqlite")
    hooks: dict[str, Any] = {
        "http": http,
        "idempotency": idempotency,
        "protect": protect,
        "after_refund_committed": kill,
        "on_refund_resent": lambda: count("refunds_resent"),
        "on_llm_call": lambda: count("llm_calls"),
    }
    if cfg.pipeline:
        from .pipeline import build_pipeline_agent  # preloaded by the fork server

        pipeline = build_pipeline_agent(
            store,
            checkpointer,
            seed=cfg.seed,
            error_rate=cfg.rates.llm_502,
            drift_rate=cfg.rates.arg_drift,
            on_fault=count,
            **hooks,
        )
        return pipeline, kill
    agent = build_refund_agent(
        store, _make_model(cfg, count), checkpointer, before_refund=kill.before, **hooks
    )
    return agent, kill


def answered(messages: Sequence[BaseMessage]) -> bool:
    """Whether a ticket's thread ends with the model's answer (no tool call left to run)."""
    return bool(messages) and isinstance(messages[-1], AIMessage) and not messages[-1].tool_calls


def run_ticket(
    agent: RefundAgent,
    ticket: Ticket,
    cfg: WorkerConfig,
    *,
    rng: random.Random,
    on_retry: Callable[[BaseException], None],
) -> bool:
    """Run one ticket to the end, resuming its thread; ``False`` after ``max_attempts``."""
    config: RunnableConfig = {
        "configurable": {"thread_id": cfg.thread_id(ticket)},
        "recursion_limit": 60,
    }
    for attempt in range(1, cfg.max_attempts + 1):
        try:
            state = agent.get_state(config)
            messages = state.values.get("messages") or []
            if not state.next and answered(messages):
                return True  # finished, e.g. by a concurrent delivery of the same ticket
            # A started thread is resumed, never given the ticket again: "no step left" with
            # messages and no answer is another delivery's step caught between its writes and
            # its next checkpoint (LangGraph's snapshot then shows no step left).
            started = state.next or messages
            inputs = None if started else MessagesState(messages=[HumanMessage(ticket.text)])
            # "sync": each step's checkpoint is written before the next step starts, so a
            # worker killed inside a tool leaves the thread with that tool step pending.
            agent.invoke(inputs, config, durability="sync")
            return True
        except Exception as exc:  # the loop retries anything; that is its whole job
            on_retry(exc)
            if attempt < cfg.max_attempts:
                ceiling = min(cfg.backoff_cap, cfg.backoff_base * 2 ** (attempt - 1))
                time.sleep(ceiling * (0.5 + rng.random() / 2))
    return False


def worker_main(cfg: WorkerConfig, slot: int, tasks: Queue[Any], shared: Shared) -> None:
    """Process entry point: take ``(ticket index, delivery, copy)`` until ``None``."""
    if cfg.verbose:
        logging.basicConfig(format=f"%(asctime)s worker-{slot} %(name)s %(message)s")
        logging.getLogger("langchain_idempotent").setLevel(logging.INFO)
    else:  # the events are counted in the report; keep the progress bar readable
        logging.getLogger("langchain_idempotent").setLevel(logging.ERROR)
    agent, kill = build_worker_agent(cfg, shared, slot)
    cpu = time.process_time()
    while True:
        item = tasks.get()
        if item is None:
            break
        index, delivery, copy = item
        if shared.status[index] != PENDING:
            continue
        ticket = cfg.tickets[index]
        shared.current[slot] = index
        kill.armed = (
            delivery == 1
            and copy == 0
            and chance(cfg.seed, "kill", ticket.ticket_id) < cfg.rates.worker_kill
        )
        kill.armed_before = (
            delivery == 1
            and copy == 0
            and not kill.armed
            and chance(cfg.seed, "kill-before", ticket.ticket_id) < cfg.rates.kill_before_refund
        )
        rng = random.Random(f"{cfg.seed}:{ticket.ticket_id}:{delivery}:{copy}")
        ok = run_ticket(
            agent, ticket, cfg, rng=rng, on_retry=lambda _e: shared.count(slot, "loop_retries")
        )
        kill.armed = kill.armed_before = False
        if ok:
            first = shared.status[index] != DONE  # a duplicate delivery may have finished it
            shared.status[index] = DONE
            final = agent.get_state({"configurable": {"thread_id": cfg.thread_id(ticket)}})
            if first and escalated(final.values.get("messages", ())):
                shared.count(slot, "escalated")  # a tool kept failing: handed to a human
        elif shared.status[index] != DONE:
            shared.status[index] = FAILED
        shared.current[slot] = -1
        now = time.process_time()
        shared.count(slot, "cpu_ms", int((now - cpu) * 1000))
        cpu = now
