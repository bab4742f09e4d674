"""The idempotency cache cannot be poisoned by another producer (RFC 23)."""

from __future__ import annotations

import pytest

from apiary.core.envelope import AckStage
from apiary.testing.engine import open_test_engine


@pytest.mark.conformance("security.idempotency.anti-poisoning")
async def test_another_producer_cannot_read_or_block_a_token() -> None:
    async with open_test_engine() as h:
        for agent in ("alice", "mallory", "bob"):
            await h.register(agent)
        first = await h.send("alice", "bob", {"op": 1}, idempotency_token="alice:create:abc")
        await h.ack("bob", first.message_id, AckStage.FULFILLED, note="secret result")
        # mallory reuses alice's token: she neither gets alice's cached result nor blocks it
        theirs = await h.send("mallory", "bob", {"op": 1}, idempotency_token="alice:create:abc")
        assert theirs.accepted
        again = await h.send("alice", "bob", {"op": 1}, idempotency_token="alice:create:abc")
        assert (again.accepted, again.error_code) == (False, "duplicate_detected")
        assert again.details["original_message_id"] == first.message_id
