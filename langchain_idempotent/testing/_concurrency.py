"""Racing callers (threads on the sync face, tasks on the async face), large payloads and
odd keys."""

from __future__ import annotations

import uuid
from collections import Counter
from typing import ClassVar

from ..core.record import ClaimOutcome
from ._faces import ContractBase, Face, new_key, require


class ConcurrencyContract(ContractBase):
    # -- racing callers ----------------------------------------------------------------

    async def test_concurrent_claims_acquire_exactly_once(self, face: Face) -> None:
        n = 8
        key = new_key()
        claims = await face.race(n, lambda i: face.claim(key, f"owner-{i}"))
        outcomes = Counter(c.outcome for c in claims)
        # One owner, the rest busy. On the async face the owner's claim may have been
        # resent after a lost reply (seen on a Redis Cluster), and so be OWNED; the sync
        # face has never needed that allowance and is held to the exact count.
        owners = outcomes[ClaimOutcome.ACQUIRED] + outcomes[ClaimOutcome.OWNED]
        assert (owners, outcomes[ClaimOutcome.BUSY]) == (1, n - 1), outcomes
        if face.name == "sync":
            assert outcomes == {ClaimOutcome.ACQUIRED: 1, ClaimOutcome.BUSY: n - 1}

    async def test_concurrent_completions_store_exactly_one_payload(self, face: Face) -> None:
        n = 8
        key = new_key()
        c = await face.claim(key, "owner-0")
        results = await face.race(
            n, lambda i: face.complete(key, f"owner-{i}", c.fence, f"payload-{i}".encode())
        )
        assert len(results) == n
        assert sum(r.stored for r in results) == 1
        assert len({r.payload for r in results}) == 1
        assert require(await face.get(key)).payload == results[0].payload

    # -- payloads and keys -------------------------------------------------------------

    async def test_a_one_megabyte_payload_round_trips(self, face: Face) -> None:
        key = new_key()
        payload = bytes(range(256)) * 4096  # 1 MiB, every byte value
        c = await face.claim(key, "a")
        assert (await face.complete(key, "a", c.fence, payload)).stored
        replay = await face.claim(key, "b")
        assert replay.payload == payload
        assert require(await face.get(key)).payload == payload

    ODD_KEYS: ClassVar[tuple[str, ...]] = (
        "ключ-🔑-鍵",
        "with space\tand\nnewline",
        "a:b|c/d\\e",
        "{tag}}{",
        "*?[glob]",
        "100%_like'\"",
        "x" * 512,
    )

    async def test_keys_with_unicode_and_odd_characters_are_distinct_and_work(
        self, face: Face
    ) -> None:
        suffix = uuid.uuid4().hex
        keys = [k + suffix for k in self.ODD_KEYS]
        for i, key in enumerate(keys):
            c = await face.claim(key, "a")
            assert c.outcome is ClaimOutcome.ACQUIRED, key
            await face.complete(key, "a", c.fence, str(i).encode())
        for i, key in enumerate(keys):
            rec = require(await face.get(key))
            assert (rec.key, rec.payload) == (key, str(i).encode())
            assert (await face.claim(key, "b")).payload == str(i).encode()
        assert set(keys) <= {r.key for r in await face.list()}
        assert await face.delete(keys[0])
        assert await face.get(keys[0]) is None
        assert await face.get(keys[1]) is not None
