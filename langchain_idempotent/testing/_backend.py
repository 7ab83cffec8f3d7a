"""Guarantees that need a way into the backend, each through a hook the store's test module
gives: a second store object on the same backend (its waiters are woken by changes made
through the first), a planted corrupt record (refused naming its key, never overwritten,
never changed or listed, still deletable), a backend written by a newer release (refused), and a
pickled store (works on the same records). A hook not given skips its test, naming it."""

from __future__ import annotations

import asyncio
import pickle
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping
from typing import Any, ClassVar

import pytest

from ..core.record import ClaimOutcome
from ..core.store import BaseIdempotencyStore
from ..errors import CorruptRecordError, StoreUnavailableError
from ._faces import ContractBase, Face, new_key, run_inline

#: Plants a record the store must refuse under a key (overwriting what is there).
Plant = Callable[[str], None]


class BackendContract(ContractBase):
    #: Whether the store pickles as its configuration (a copy on the same records).
    picklable: ClassVar[bool] = False

    @pytest.fixture
    def second_store(self) -> Iterator[BaseIdempotencyStore | None]:
        """Another store object on the ``store`` fixture's backend (the same file, server
        and prefix, or table), closed afterwards; ``None`` when there is no such thing (an
        in-process store is its own backend)."""
        yield None

    @pytest.fixture
    def corruptions(self) -> Mapping[str, Plant]:
        """``{name: plant}``: each ``plant(key)`` overwrites the record under ``key`` in the
        ``store`` fixture's backend with one the store must refuse (an unknown format
        version, a garbled field, a foreign value, ...). Empty: the store keeps no bytes a
        test could corrupt."""
        return {}

    @pytest.fixture
    def newer_schema(self) -> Callable[[], BaseIdempotencyStore] | None:
        """Marks the ``store`` fixture's backend (already set up) as written by a newer
        release of the store and returns a fresh store object on it; ``None``: the store
        records no schema version."""
        return None

    # -- a second store object ---------------------------------------------------------

    @pytest.mark.parametrize("change", ["complete", "release", "delete"])
    async def test_a_change_through_another_store_object_wakes_a_waiter_on_this_one(
        self, face: Face, second_store: BaseIdempotencyStore | None, change: str
    ) -> None:
        if second_store is None:
            pytest.skip("no second store object on the same backend (fixture second_store)")
        writer = Face(face.store, "sync")
        waiter = Face(second_store, face.name)
        key = new_key()
        c = run_inline(writer.claim(key, "a"))
        changes: dict[str, Callable[[], Coroutine[Any, Any, object]]] = {
            "complete": lambda: writer.complete(key, "a", c.fence, b"r"),
            "release": lambda: writer.release(key, owner="a", fence=c.fence),
            "delete": lambda: writer.delete(key),
        }
        changed_at: list[float] = []

        def later() -> None:
            time.sleep(0.1)
            changed_at.append(time.monotonic())
            run_inline(changes[change]())

        waker = asyncio.get_running_loop().run_in_executor(None, later)
        await waiter.watch(key, fence=c.fence, timeout=5.0)
        ended = time.monotonic()
        await waker
        self.assert_woken(changed_at, ended)
        expected = ClaimOutcome.REPLAY if change == "complete" else ClaimOutcome.ACQUIRED
        assert (await waiter.claim(key, "b")).outcome is expected

    # -- a corrupt record --------------------------------------------------------------

    async def test_a_corrupt_record_is_refused_naming_its_key_kept_unlisted_and_deletable(
        self, face: Face, corruptions: Mapping[str, Plant]
    ) -> None:
        if not corruptions:
            pytest.skip("no way to corrupt a record (fixture corruptions)")
        for name, plant in corruptions.items():
            await self._a_planted_record_is_refused(face, name, plant)

    async def _a_planted_record_is_refused(self, face: Face, name: str, plant: Plant) -> None:
        key = new_key(name.replace(" ", "-"))
        thread = new_key("t")
        c = await face.claim(key, "a", meta={"thread_id": thread})
        await face.complete(key, "a", c.fence, b"r", meta={"thread_id": thread})
        await asyncio.to_thread(plant, key)
        refused: dict[str, Callable[[], Awaitable[object]]] = {
            "get": lambda: face.get(key),
            "claim": lambda: face.claim(key, "b"),
            "complete": lambda: face.complete(key, "b", 1, b"other"),
        }
        for op, call in refused.items():
            with pytest.raises(CorruptRecordError) as err:
                await call()
            assert err.value.key == key, f"{name}: {op} named {err.value.key!r}"
        # An owner's own moves may also just find nothing of theirs to change.
        owners: dict[str, Callable[[], Awaitable[bool]]] = {
            "renew": lambda: face.renew(key, owner="a", fence=1),
            "release": lambda: face.release(key, owner="a", fence=1),
            "mark_effect": lambda: face.mark_effect(key, owner="a", fence=1),
        }
        for op, move in owners.items():
            try:
                changed = await move()
            except CorruptRecordError as exc:
                assert exc.key == key, f"{name}: {op} named {exc.key!r}"
            else:
                assert not changed, f"{name}: {op} changed a corrupt record"
        with pytest.raises(CorruptRecordError):  # no write above replaced it
            await face.get(key)
        try:
            listed = [r.key for r in await face.list(thread_id=thread)]
        except CorruptRecordError as exc:
            assert exc.key == key, name
        else:
            assert key not in listed, f"{name}: list returned a corrupt record"
        assert await face.delete(key), f"{name}: an operator could not delete it"
        assert (await face.claim(key, "b")).outcome is ClaimOutcome.ACQUIRED, name

    # -- a newer release's backend -----------------------------------------------------

    async def test_a_backend_written_by_a_newer_release_is_refused(
        self, face: Face, newer_schema: Callable[[], BaseIdempotencyStore] | None
    ) -> None:
        if newer_schema is None:
            pytest.skip("the store records no schema version (fixture newer_schema)")
        key = new_key()
        await face.claim(key, "a")  # the backend is set up, at today's version
        fresh = Face(await asyncio.to_thread(newer_schema), face.name)
        try:
            with pytest.raises(StoreUnavailableError, match="newer") as err:
                await fresh.get(key)
            assert err.value.key == key
            with pytest.raises(StoreUnavailableError, match="newer"):
                await fresh.claim(new_key(), "a")
        finally:
            await fresh.close()

    # -- pickling ----------------------------------------------------------------------

    async def test_a_pickled_store_works_on_the_same_records(self, face: Face) -> None:
        if not self.picklable:
            pytest.skip("the store does not pickle (class attribute picklable)")
        key = new_key()
        c = await face.claim(key, "a")
        copy = Face(pickle.loads(pickle.dumps(face.store)), face.name)
        try:
            assert repr(copy.store) == repr(face.store)
            busy = await copy.claim(key, "b")
            assert (busy.outcome, busy.fence) == (ClaimOutcome.BUSY, c.fence)
            await face.complete(key, "a", c.fence, b"r")
            assert (await copy.claim(key, "b")).payload == b"r"
        finally:
            await copy.close()
