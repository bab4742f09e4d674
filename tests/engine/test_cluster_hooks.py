"""The engine's hooks for cluster mode (engine/cluster/node.py sets them; docs/cluster.md),
each on one engine over a memory store: off, the default, they change nothing (the rest of
the suite); on, each does what the cluster relies on.

- `Registry.reads_through`: an agent another replica registered (in the store, not in this
  engine's view) is looked up before no_route, as a recipient and as the producer an ACK
  is forwarded to; one registered nowhere is still no_route.
- `LiveMessages.placement`: a message placed elsewhere is stored, not live here, and gives
  its buffer slot back.
- `Deadlines.on_ack`: told each ACK deadline a hand-out starts and each one a lost stream
  stops.
- `Router.count_in_store`: buffer capacity and credits counted by the store (what another
  replica admitted counts; this replica's memory holds none of it).
- `MessageLifecycle.conditional`: a change decided from a live copy another replica has
  overtaken is decided again from the stored message.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from apiary.core.envelope import AckStage
from apiary.core.records import MessageState, StateChange, StoredMessage
from apiary.engine.settings import RouterSettings
from apiary.errors import NoRouteError
from apiary.testing.engine import EngineHarness, open_test_engine


async def _only_in_the_store(h: EngineHarness, agent_id: str) -> None:
    """`agent_id` as another replica's registration looks to this one: in the store only."""
    if h.engine.registry.known(agent_id) is None:
        await h.register(agent_id)
    record = await h.engine.registry.get(agent_id)
    await h.engine.registry.deregister(agent_id, "test")
    await h.store.agents.put(replace(record))
    assert h.engine.registry.known(agent_id) is None


async def test_reads_through_finds_a_recipient_and_a_producer_registered_elsewhere() -> None:
    async with open_test_engine() as h:
        h.engine.registry.reads_through = True
        await h.register("bob")
        await _only_in_the_store(h, "alice")
        sent = await h.send("bob", "alice", {"n": 1})
        assert sent.accepted and sent.recipient == "alice"
        assert h.engine.registry.known("alice") is not None
        # dave sent bob a message, then registered "elsewhere": bob's ACK still reaches him.
        await h.register("dave")
        from_dave = await h.send("dave", "bob", {"n": 2})
        await _only_in_the_store(h, "dave")
        (handout,) = await h.take("bob")
        assert handout.message.message_id == from_dave.message_id
        acked = await h.ack("bob", from_dave.message_id, AckStage.FULFILLED)
        assert acked.accepted and acked.recipient == "dave", acked.reason
        with pytest.raises(NoRouteError):
            await h.send("bob", "erin", {"n": 3})


async def test_without_reads_through_an_agent_only_in_the_store_is_no_route() -> None:
    async with open_test_engine() as h:
        await h.register("bob")
        await _only_in_the_store(h, "alice")
        with pytest.raises(NoRouteError):
            await h.send("bob", "alice", {"n": 1})


async def test_a_message_placed_elsewhere_is_stored_not_live_and_frees_its_slot() -> None:
    async with open_test_engine() as h:
        await h.register("bob", capacity=1)
        await h.register("alice")
        placed: list[StoredMessage] = []

        def elsewhere(message: StoredMessage) -> bool:
            placed.append(message)
            return False

        h.engine.router.live.placement = elsewhere
        first = await h.send("alice", "bob", {"n": 1})
        second = await h.send("alice", "bob", {"n": 2})  # capacity 1: the first left no slot
        assert first.accepted and second.accepted
        assert [m.message_id for m in placed] == [first.message_id, second.message_id]
        assert h.engine.router.live.copies == {}
        assert h.engine.router.inbox("bob").depth == 0
        assert await h.store.messages.get(first.message_id) is not None


async def test_on_ack_hears_each_ack_deadline_started_and_stopped() -> None:
    async with open_test_engine() as h:
        await h.register("bob")
        await h.register("alice")
        heard: list[tuple[str, float]] = []
        h.engine.router.deadlines.on_ack = lambda message_id, due: heard.append((message_id, due))
        sent = await h.send("alice", "bob", {"n": 1})
        stream = await h.connect("bob")
        handed = [item for item in heard if item[0] == sent.message_id]
        timeout = h.engine.router.settings.ack_timeout_s
        assert handed == [(sent.message_id, h.clock.now() + timeout)]
        await stream.aclose()  # the stream is lost: its deadline stops
        assert heard[-1] == (sent.message_id, 0.0)


async def test_count_in_store_counts_what_the_store_holds_for_the_recipient() -> None:
    async with open_test_engine(RouterSettings(credit_window=5, per_producer_cap=1)) as h:
        await h.register("bob", capacity=2)
        await h.register("alice")
        await h.register("carol")
        h.engine.router.live.placement = lambda message: False  # (bob streams elsewhere)
        h.engine.router.count_in_store(True)
        first = await h.send("alice", "bob", {"n": 1})
        assert first.accepted
        capped = await h.send("alice", "bob", {"n": 2})
        assert not capped.accepted and "producer_cap (1/1)" in capped.reason
        assert (await h.send("carol", "bob", {"n": 3})).accepted
        full = await h.send("dave", "bob", {"n": 4})
        assert not full.accepted and "capacity exceeded for agent=bob (2/2)" in full.reason
        # Finished elsewhere (in the store): alice's credit and slot are back.
        await h.store.messages.apply([StateChange(first.message_id, MessageState.FULFILLED, 1.0)])
        assert (await h.send("alice", "bob", {"n": 5})).accepted


async def test_conditional_decides_again_from_the_stored_message() -> None:
    async with open_test_engine() as h:
        await h.register("bob")
        await h.register("alice")
        h.engine.router.lifecycle.conditional = True
        sent = await h.send("alice", "bob", {"n": 1})
        (handout,) = await h.take("bob")
        assert handout.message.message_id == sent.message_id
        # Another replica applied bob's FAILED ACK (and recorded its dead letter there).
        await h.store.messages.apply([
            StateChange(sent.message_id, MessageState.FAILED, h.clock.now(), "x",
                        acked_stage="FAILED", expected="RECEIVED")
        ])  # fmt: skip
        acked = await h.ack("bob", sent.message_id, AckStage.FAILED)
        assert acked.accepted
        # Decided again from FAILED: a late ACK, no second dead letter, no second forward.
        assert await h.store.dlq.list() == []
        assert (await h.message(sent.message_id)).state is MessageState.FAILED
        assert sent.message_id not in h.engine.router.live.copies
        assert await h.events("message.late_ack") != []
