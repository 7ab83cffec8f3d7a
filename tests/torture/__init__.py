"""The seeded torture campaign: replayable runs, every history checked (issue 22).

A run is a seed. The seed draws a plan (2-6 workers, 1-3 keys, 1-4 calls per worker, the
faults, ``on_expired``, whether a truthful ``reconcile=`` hook is set) and drives a
single-threaded scheduler: each worker is a greenlet calling the real
:class:`~langchain_idempotent.core.engine.Engine` (``Engine.run``), whose store hands every
operation to the scheduler, which executes it on the real store when the seed says, holds replies
back so operations overlap, moves the store's clock, and strikes the planned faults:

- ``crash_before_claim``, ``crash_after_claim``, ``crash_after_effect`` (the unknown
  outcome), ``crash_during_complete`` (the completion reaches the store or not);
- ``pause_past_lease`` (the owner stops, its lease passes, a taker runs, the owner resumes);
- ``lost_claim_reply``, ``lost_complete_reply`` (applied, the reply never arrives);
- ``clock_jump`` (the store's clock jumps past every lease), ``store_restart``.

The modules, in reading order: :mod:`.sim` (plan, scheduler, workers, the fence-checking
sink), :mod:`.history`, :mod:`.linearize` (the protocol model and the Wing-Gong search),
:mod:`.checker` (linearizability and the invariants), :mod:`.plants` (planted store bugs),
:mod:`.stores` (backends and their throwaway servers), :mod:`.campaign` (many seeds),
:mod:`.procs` (real processes, ``kill -9`` and ``SIGSTOP``).

Commands (``tests/torture/RESULTS.md`` has the figures)::

    python -m tests.torture --store memory --runs 1000 --seed 0      # CI, per store
    python -m tests.torture --store redis --plant list                 # planted bugs
    python -m tests.torture --store postgres --durability off --runs 30 # durability
    python -m tests.torture.procs --store redis --runs 2000 --seed 7  # real kill -9
"""
