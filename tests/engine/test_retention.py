"""Retention bounds storage (RFC 21.1) and gives stream resumption a time window (RFC 5.5)."""

from __future__ import annotations

import pytest

from apiary.core.envelope import AckStage
from apiary.engine.retention import purge_expired
from apiary.engine.settings import RouterSettings
from apiary.errors import ResumeExpiredError
from apiary.testing.engine import open_test_engine

DAY = 24 * 3600.0


@pytest.mark.conformance("dlq.retention", "transport.resume.windows")
async def test_old_finished_messages_and_dead_letters_are_purged() -> None:
    async with open_test_engine(RouterSettings(retention_s=DAY)) as h:
        await h.register("alice")
        await h.register("bob")
        done = await h.send("alice", "bob", {"n": 1})
        await h.take("bob")
        await h.ack("bob", done.message_id, AckStage.FULFILLED)
        failed = await h.send("alice", "bob", {"n": 2}, ttl_ms=1000)
        h.clock.advance(2)
        await h.fire()
        assert len(await h.store.dlq.list()) == 1
        assert await purge_expired(h.store, h.clock, h.engine.router.settings, h.engine.events) == {
            "messages": 0, "idempotency": 0, "dlq": 0,
        }  # fmt: skip
        pending = await h.send("alice", "bob", {"n": 3})
        h.clock.advance(DAY + 1)
        purged = await purge_expired(h.store, h.clock, h.engine.router.settings, h.engine.events)
        assert purged["dlq"] == 1 and purged["messages"] >= 2
        assert await h.store.messages.get(done.message_id) is None
        assert await h.store.messages.get(failed.message_id) is None
        assert await h.store.dlq.list() == []
        # Unfinished messages are never purged.
        assert (await h.message(pending.message_id)).state == "RECEIVED"
        (event,) = await h.events("retention.purged")
        assert event.details["dlq"] == 1
        # A position inside purged history has expired, with guidance to recover.
        with pytest.raises(ResumeExpiredError, match="resume_after=0"):
            await h.take("bob", resume_after=1)


async def test_unfinished_messages_survive_retention() -> None:
    async with open_test_engine(RouterSettings(retention_s=60, ack_timeout_s=3600)) as h:
        await h.register("alice")
        await h.register("bob")
        outcome = await h.send("alice", "bob", {"n": 1})
        h.clock.advance(120)
        await purge_expired(h.store, h.clock, h.engine.router.settings, h.engine.events)
        assert (await h.message(outcome.message_id)).state == "RECEIVED"
