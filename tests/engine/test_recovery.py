"""Restart recovery (DESIGN.md section 5): what was accepted is durable, and after a restart
every unfinished message is delivered again: its TTL as it was, its ACK deadline from the
hand-out after the restart (tests/engine/test_outages.py has the long outages)."""

from __future__ import annotations

from pathlib import Path

from apiary.core.envelope import AckStage
from apiary.testing.clock import FakeClock
from apiary.testing.engine import open_test_engine
from apiary.testing.ids import SequentialIds


async def test_unfinished_messages_are_redelivered_and_their_deadlines_rearmed(
    tmp_path: Path,
) -> None:
    url = f"sqlite://{tmp_path / 'apiary.db'}"
    clock, ids = FakeClock(), SequentialIds()
    async with open_test_engine(store_url=url, clock=clock, ids=ids) as h:
        await h.register("alice")
        await h.register("bob")
        done = await h.send("alice", "bob", {"n": "done"})
        acked = await h.send("alice", "bob", {"n": "acked"}, ttl_ms=60_000)
        silent = await h.send("alice", "bob", {"n": "silent"})
        await h.take("bob")
        await h.ack("bob", done.message_id, AckStage.FULFILLED)
        await h.ack("bob", acked.message_id, AckStage.RECEIVED)
        fresh = await h.send("alice", "bob", {"n": "never delivered"})
        depth = h.engine.router.inbox("bob").depth
    assert depth == 3
    clock.advance(2)
    async with open_test_engine(store_url=url, clock=clock, ids=ids) as h:
        # The buffer is rebuilt: the same three unfinished messages occupy it.
        assert h.engine.router.inbox("bob").depth == 3
        batch = await h.take("bob")
        assert [(x.message.message_id, x.attempt) for x in batch] == [
            (acked.message_id, 2),
            (silent.message_id, 2),
            (fresh.message_id, 1),
        ]
        # The ACK deadline runs from the hand-out, not from admission: a whole 10 s after
        # the restart's redelivery, however long ago the messages were admitted.
        clock.advance(9.5)
        await h.fire()
        assert (await h.message(fresh.message_id)).state == "RECEIVED"
        assert (await h.message(silent.message_id)).state == "RETRYING"
        clock.advance(1)
        await h.fire()
        states = {
            m: (await h.message(m)).state
            for m in (done.message_id, acked.message_id, silent.message_id, fresh.message_id)
        }
        assert states == {
            done.message_id: "FULFILLED",
            acked.message_id: "RETRYING",  # acknowledged before: no ACK deadline again
            silent.message_id: "TIMED_OUT",
            fresh.message_id: "TIMED_OUT",
        }
        nacked = {
            p["ack_for_message_id"]
            for p in await h.inbox_payloads("alice")
            if p.get("error_code") == "ACK_TIMEOUT"
        }
        assert nacked == {silent.message_id, fresh.message_id}
        # TTLs survive too: the acknowledged message still expires 60 s after it was sent.
        clock.advance(50)
        await h.fire()
        expired = await h.message(acked.message_id)
        assert (expired.state, expired.error_code) == ("FAILED", "ttl_expired")
        assert [e.message_id for e in await h.store.dlq.list()] == [acked.message_id]


async def test_accepted_means_durable(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'apiary.db'}"
    clock, ids = FakeClock(), SequentialIds()
    async with open_test_engine(store_url=url, clock=clock, ids=ids) as h:
        await h.register("alice")
        await h.register("bob")
        outcome = await h.send("alice", "bob", {"n": 1})
        assert outcome.accepted
    async with open_test_engine(store_url=url, clock=clock, ids=ids) as h:
        stored = await h.message(outcome.message_id)
        assert (stored.state, stored.recipient, stored.offset) == ("RECEIVED", "bob", 1)
        assert [x.message.message_id for x in await h.take("bob")] == [outcome.message_id]
