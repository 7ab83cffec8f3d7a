"""The store contract: one test suite that every idempotency store runs.

Every store — the ones shipped here and any you write — must give the answers of
:mod:`langchain_idempotent.core.protocol` through both its sync and its ``a``-prefixed async
operations. :class:`StoreContractTests` checks that. Each guarantee is written once and runs
twice, through the ``face`` fixture: once against the store's sync operations (called
inline, as sync code) and once against their async twins. The guarantees, by module:

- ``_claim``: acquire, replay, mismatch, busy, owned, takeover, expired;
- ``_batch``: ``claim_many`` answers (and writes) exactly what the same claims made one by
  one would, in order (a property test over random batches included);
- ``_lease``: release and renew only for the owner at its fence, fences only grow, a stale
  owner cannot renew or release;
- ``_abandon``: a cancelled owner's abandon leaves the key for an immediate takeover told
  the reason (``cancelled``), never a clean first run; only the owner at its fence may;
- ``_effect``: the side-effect mark (``boundary`` claims, ``mark_effect`` for the owner at
  its fence), an attempt that never entered its block retried cleanly (RETRY), and a
  takeover's unknown outcome never turned into one (a takeover keeps the mark it found);
- ``_complete``: write-once, stale completions, retention (TTL);
- ``_watch``: how soon a watch returns;
- ``_operator``: get, list, delete, purge, close;
- ``_concurrency``: racing threads and tasks, large payloads, odd keys;
- ``_model``: random operation sequences against a pure model built from the protocol
  functions, asserting identical answers and records;
- ``_backend``: through the hooks below, a waiter woken across store objects, corrupt
  records, a newer release's backend, pickling.

Besides the decision table, the suite holds every store to these rules:

- time is the store's clock, in milliseconds; ``lease_until = now + lease_ms`` and a lease
  ending exactly now has expired;
- a record expires ``ttl_ms`` after the write that set it, but never while its lease is
  live (a TTL shorter than the lease must not let a second caller in);
- ``watch``/``awatch`` return within ``wake_latency_s`` of a completion, release or abandon made by
  another thread, task or process; at once when the record is absent, done or at another
  fence; by the lease deadline when nobody finishes; by ``timeout`` otherwise — and not
  before, while nothing changed (a waiter must not spin);
- claims and completions racing from many threads or tasks are serialised: one winner;
- payloads are opaque bytes (``b""`` and 1 MiB included); keys are any ``str``.

Use it from your own test module (needs ``pytest``, ``pytest-asyncio`` and ``hypothesis``)::

    import uuid
    from collections.abc import Iterator

    import pytest

    from langchain_idempotent.testing import StoreContractTests
    from my_package import MyIdempotencyStore


    class TestMyStore(StoreContractTests):
        @pytest.fixture
        def store(self) -> Iterator[MyIdempotencyStore]:
            s = MyIdempotencyStore(prefix=f"test-{uuid.uuid4().hex}:")
            yield s
            s.close()

**Time.** Lease expiry, takeovers and retention are tested on short leases
(``short_lease_ms``) that must pass on the store's clock. If your store takes a clock,
give the suite a ``clock`` fixture: the :class:`FakeClock` (``ticking=True``) your
``store`` fixture passes to the store; the suite then moves it past each lease instead of
sleeping (any object with ``advance(ms)`` will do: :class:`MovableClock`)::

    class TestMyStore(StoreContractTests):
        @pytest.fixture
        def clock(self) -> FakeClock:
            return FakeClock(ticking=True)

        @pytest.fixture
        def store(self, clock: FakeClock) -> MyIdempotencyStore:
            return MyIdempotencyStore(clock=clock)

Without one (a store on a server's clock, like Redis ``TIME`` or PostgreSQL
``clock_timestamp()``), those tests wait each lease out in real time: keep
``short_lease_ms`` as short as the store's round trips allow (tens of ms) and
``expiry_margin_ms`` over the clock skew between the store and this host. Wake-up and
watch-timeout tests always run in real time; tune ``wake_latency_s`` and
``late_return_s`` if a backend is slower.

**Hooks.** Four guarantees need a way into the backend; each is a fixture the subclass
may override (a test whose hook is not given is skipped, and says which hook to give):

- ``second_store``: another store object on the same backend (the same file, server
  prefix or table): a waiter on one is woken by a completion, release or delete made
  through the other;
- ``corruptions``: ``{name: plant}``, each ``plant(key)`` overwriting the record under
  ``key`` with bytes or a row the store must refuse: ``get``, ``claim`` and ``complete``
  raise :class:`~langchain_idempotent.errors.CorruptRecordError` naming the key, no
  write replaces or changes it, ``list`` never returns it, and ``delete`` still removes it;
- ``newer_schema``: marks the backend as written by a newer release and returns a fresh
  store object on it, which must refuse to work (``StoreUnavailableError`` saying so);
- ``picklable = True`` (a class attribute): the store pickles as its configuration, and
  the copy works on the same records.
"""

from __future__ import annotations

from ._abandon import AbandonContract
from ._backend import BackendContract
from ._batch import BatchClaimContract
from ._claim import ClaimContract
from ._clock import FakeClock, MovableClock
from ._complete import CompleteContract
from ._concurrency import ConcurrencyContract
from ._effect import EffectContract
from ._lease import LeaseContract
from ._model import ModelContract
from ._operator import OperatorContract
from ._watch import WatchContract

__all__ = ["FakeClock", "MovableClock", "StoreContractTests"]


class StoreContractTests(
    ClaimContract,
    BatchClaimContract,
    AbandonContract,
    EffectContract,
    LeaseContract,
    CompleteContract,
    WatchContract,
    OperatorContract,
    ConcurrencyContract,
    ModelContract,
    BackendContract,
):
    """The guarantees every :class:`~langchain_idempotent.stores.BaseIdempotencyStore`
    gives, through its sync operations and through their async twins.

    Subclass it (with a ``Test`` prefix so pytest collects it) and provide a
    function-scoped ``store`` fixture that yields a fresh, isolated store — for a server
    store, one with a unique key prefix so parallel runs never see each other::

        class TestSqliteStore(StoreContractTests):
            @pytest.fixture
            def store(self, tmp_path: Path) -> Iterator[SqliteIdempotencyStore]:
                s = SqliteIdempotencyStore(tmp_path / "idem.sqlite")
                yield s
                s.close()

    Every test is a coroutine marked ``pytest.mark.asyncio`` (function-scoped loop) and
    takes the ``face`` fixture, so it runs as ``test_…[sync]`` and ``test_…[async]``.
    """
