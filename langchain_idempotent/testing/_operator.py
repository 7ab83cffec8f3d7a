"""Operator operations: get, list, delete, purge, close."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from ..core.record import FORMAT_VERSION, ClaimOutcome, State
from ..core.store import BaseIdempotencyStore
from ._faces import FP, ContractBase, Face, new_key, require


class OperatorContract(ContractBase):
    # -- the store's clock and facts ---------------------------------------------------

    async def test_now_ms_is_the_clock_records_are_stamped_with(self, face: Face) -> None:
        before = await face.now_ms()
        key = new_key()
        await face.claim(key, "owner-a", lease_ms=5_000)
        after = await face.now_ms()
        rec = require(await face.get(key))
        assert before <= rec.created_at <= after
        assert rec.lease_until == rec.created_at + 5_000

    async def test_describe_names_the_kind_and_is_json(self, store: BaseIdempotencyStore) -> None:
        import json

        facts = await asyncio.to_thread(store.describe)  # sync only, like doctor calls it
        assert isinstance(facts.get("kind"), str) and facts["kind"]
        json.dumps(facts)  # the doctor prints it as JSON

    # -- get ---------------------------------------------------------------------------

    @pytest.mark.parametrize("failed", [False, True], ids=["completed", "failed"])
    async def test_get_returns_every_field_of_the_record(self, face: Face, failed: bool) -> None:
        key = new_key()
        meta = {"namespace": "ns", "thread_id": "t-1", "tool": "refund"}
        assert await face.get(key) is None
        await face.claim(key, "owner-a", lease_ms=5_000, meta=meta)
        rec = require(await face.get(key))
        assert (rec.key, rec.state, rec.owner, rec.fence, rec.attempt) == (
            key,
            State.RUNNING,
            "owner-a",
            1,
            1,
        )
        assert rec.fingerprint == FP
        assert rec.payload is None
        assert rec.lease_until == rec.created_at + 5_000
        assert rec.updated_at == rec.created_at
        assert rec.version == FORMAT_VERSION
        assert dict(rec.meta) == meta
        assert not rec.done
        await self.pass_time(face, 10)
        await face.complete(key, "owner-a", 1, b"\x00done", failed=failed)
        done = require(await face.get(key))
        assert (done.state, done.owner, done.fence, done.attempt) == (
            State.FAILED if failed else State.COMPLETED,
            "owner-a",
            1,
            1,
        )
        assert (done.payload, done.lease_until, done.fingerprint) == (b"\x00done", 0, FP)
        assert done.created_at == rec.created_at
        assert done.updated_at > rec.updated_at
        assert dict(done.meta) == meta
        assert done.done
        assert await face.other.get(key) == done  # both faces read the same record

    # -- list --------------------------------------------------------------------------

    async def _populate(self, face: Face) -> tuple[str, str, dict[str, str]]:
        """Four records over two namespaces and two threads; returns (ns, other_ns, keys)."""
        tag = uuid.uuid4().hex[:8]
        ns, other = f"ns_{tag}", f"nsX{tag}"  # "_" must not act as a wildcard
        keys: dict[str, str] = {}
        for name, (n, t) in {
            "ns/t1": (ns, "t1"),
            "ns/t1b": (ns, "t1"),
            "ns/t2": (ns, "t2"),
            "other/t1": (other, "t1"),
        }.items():
            keys[name] = key = new_key(name.replace("/", "-"))
            c = await face.claim(key, "a", meta={"namespace": n, "thread_id": t})
            if name != "ns/t1b":
                await face.complete(key, "a", c.fence, name.encode())
        return ns, other, keys

    async def test_list_filters_by_namespace_and_thread_id(self, face: Face) -> None:
        ns, other, keys = await self._populate(face)

        async def listed(**kw: Any) -> set[str]:
            return {r.key for r in await face.list(**kw)}

        assert await listed(namespace=ns) == {keys["ns/t1"], keys["ns/t1b"], keys["ns/t2"]}
        assert await listed(namespace=ns, thread_id="t1") == {keys["ns/t1"], keys["ns/t1b"]}
        assert await listed(namespace=other, thread_id="t1") == {keys["other/t1"]}
        assert await listed(namespace=other, thread_id="t2") == set()
        by_thread = await listed(thread_id="t1") | await listed(thread_id="t2")
        assert set(keys.values()) <= by_thread
        assert set(keys.values()) <= await listed()
        for limit in (1, 2):
            limited = await face.list(namespace=ns, limit=limit)
            assert len(limited) == limit
            assert {r.key for r in limited} <= await listed(namespace=ns)
        by_key = {r.key: r for r in await face.list(namespace=ns)}
        assert by_key[keys["ns/t1"]].payload == b"ns/t1"
        assert by_key[keys["ns/t1b"]].state is State.RUNNING
        assert dict(by_key[keys["ns/t2"]].meta) == {"namespace": ns, "thread_id": "t2"}

    # -- delete, purge -----------------------------------------------------------------

    async def test_delete_removes_exactly_one_record(self, face: Face) -> None:
        a, b = new_key(), new_key()
        ca = await face.claim(a, "o")
        await face.claim(b, "o")
        assert await face.delete(a)
        assert await face.get(a) is None
        assert not await face.delete(a)
        assert await face.get(b) is not None
        assert not await face.renew(a, owner="o", fence=ca.fence)
        assert (await face.claim(a, "p")).outcome is ClaimOutcome.ACQUIRED

    async def test_purge_deletes_every_record_of_a_thread_and_nothing_else(
        self, face: Face
    ) -> None:
        ns, _other, keys = await self._populate(face)
        assert await face.purge(thread_id="t1", namespace=ns) == 2
        assert await face.get(keys["ns/t1"]) is None
        assert await face.get(keys["ns/t1b"]) is None
        assert await face.get(keys["ns/t2"]) is not None
        assert await face.get(keys["other/t1"]) is not None
        assert await face.purge(thread_id="t1", namespace=ns) == 0
        assert await face.purge(thread_id="t2", namespace=ns) == 1
        assert await face.get(keys["ns/t2"]) is None
        assert await face.get(keys["other/t1"]) is not None

    # -- close -------------------------------------------------------------------------

    async def test_a_closed_store_reconnects_on_next_use(self, face: Face) -> None:
        key = new_key()
        c = await face.claim(key, "a")
        await face.close()
        assert (await face.complete(key, "a", c.fence, b"after-close")).stored
        await face.close()
        await face.close()
        assert (await face.claim(key, "b")).payload == b"after-close"
