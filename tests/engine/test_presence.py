"""Registry presence (RFC 14): join/leave broadcasts, coordinator heartbeats, debounce before
an agent counts as gone, and deregistration that only ever happens on request."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from apiary.core.agent_state import UNAVAILABLE
from apiary.store.sqlite.store import SqliteStore
from apiary.testing.engine import EngineHarness, open_test_engine


@pytest.fixture
async def h() -> AsyncIterator[EngineHarness]:
    async with open_test_engine() as harness:
        await harness.register("alice")
        await harness.register("bob")
        yield harness


async def _notifications(h: EngineHarness, agent: str) -> list[dict[str, Any]]:
    return [p for p in await h.inbox_payloads(agent) if p["type"] == "NOTIFICATION"]


async def _heartbeats(h: EngineHarness, agent: str) -> list[dict[str, Any]]:
    return [p for p in await h.inbox_payloads(agent) if p["type"] == "HEARTBEAT"]


async def _asleep(h: EngineHarness) -> None:
    """Until the heartbeat loop waits on the fake clock (advancing earlier would be lost)."""
    # Yields to the event loop, never waits in time: nothing signals "now sleeping".
    while h.clock.pending_sleepers == 0:  # noqa: ASYNC110
        await asyncio.sleep(0)


async def _state(h: EngineHarness, agent: str) -> str:
    return (await h.engine.registry.get(agent)).state


@pytest.mark.conformance("registry.events.broadcast")
async def test_joins_and_leaves_reach_every_other_participant(h: EngineHarness) -> None:
    await h.connect("alice")
    await h.connect("bob")
    await h.register("carol", capabilities=["translate"])
    for agent in ("alice", "bob"):
        joined = [n for n in await _notifications(h, agent) if n["event"] == "agent_joined"]
        assert joined[-1]["agent"] == {
            "agent_id": "carol", "name": "carol", "capabilities": ["translate"],
            "state": "RUNNABLE",
        }  # fmt: skip
    # The newcomer gets the directory (itself included) when its stream opens, not an
    # announcement of itself.
    assert await _notifications(h, "carol") == []
    await h.connect("carol")
    carol = await _notifications(h, "carol")
    assert [n["event"] for n in carol] == ["directory"]
    assert [a["agent_id"] for a in carol[0]["agents"]] == ["alice", "bob", "carol"]
    # Leaving is announced as explicitly as joining.
    assert await h.engine.registry.deregister("bob", "maintenance")
    await h.engine.presence.left("bob", "maintenance")
    for agent in ("alice", "carol"):
        left = (await _notifications(h, agent))[-1]
        assert left == {**left, "event": "agent_left", "agent_id": "bob", "reason": "maintenance"}
    assert [n["event"] for n in await _notifications(h, "bob")][-1] != "agent_left"
    # A notification is delivered like any message, on the agent's stream.
    delivered = await h.take("alice", notices=True)
    assert {x.message.message_type for x in delivered} == {4}


async def test_an_agent_away_is_sent_the_directory_when_it_connects_not_each_change(
    h: EngineHarness,
) -> None:
    # dave registers and goes away; while it is away others come and go.
    await h.register("dave")
    await h.connect("alice")
    await h.register("carol")
    assert await h.engine.registry.deregister("bob", "maintenance")
    await h.engine.presence.left("bob", "maintenance")
    assert await _notifications(h, "dave") == []  # nothing piles up for it
    assert [n["event"] for n in await _notifications(h, "alice")] == [
        "directory", "agent_joined", "agent_left",
    ]  # fmt: skip
    # On connecting it learns the directory as it is now: carol in, bob out.
    stream = await h.connect("dave")
    (directory,) = await _notifications(h, "dave")
    assert [a["agent_id"] for a in directory["agents"]] == ["alice", "carol", "dave"]
    # Connected, it is told of each change as it happens, after that directory.
    await h.register("erin")
    batch = await asyncio.wait_for(anext(stream), 5)
    (joined,) = [h.engine.router.codec.decode(x.message.envelope) for x in batch]
    assert b'"agent_joined"' in joined.payload and b'"erin"' in joined.payload
    # Each time its stream opens again it gets a fresh directory (the store of the
    # notices it missed while away is not kept).
    await stream.aclose()
    await h.connect("dave")
    assert [n["event"] for n in await _notifications(h, "dave")] == [
        "directory", "agent_joined", "directory",
    ]  # fmt: skip


@pytest.mark.conformance("registry.heartbeat.emit")
async def test_the_coordinator_emits_heartbeats_every_interval(h: EngineHarness) -> None:
    await h.connect("alice")
    await h.connect("bob")
    await h.register("carol")  # registered, never connected: it could not read them
    interval = h.engine.presence.settings.heartbeat_interval_s
    runner = asyncio.create_task(h.engine.presence.run(h.clock.sleep))
    try:
        for round_number in (1, 2, 3):
            await asyncio.wait_for(_asleep(h), 5)  # the loop waits on the fake clock
            mark = await h.engine.events.last_sequence()
            h.clock.advance(interval)

            async def emitted(n: int = round_number, seen: int = mark) -> None:
                while len(await _heartbeats(h, "bob")) < n:
                    await h.engine.events.wait_after(seen)
                    seen = await h.engine.events.last_sequence()

            await asyncio.wait_for(emitted(), 5)
            for agent in ("alice", "bob"):
                assert len(await _heartbeats(h, agent)) == round_number
            assert await _heartbeats(h, "carol") == []
    finally:
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner
    beat = (await _heartbeats(h, "alice"))[-1]
    assert (beat["command"], beat["agent_id"]) == ("heartbeat", "alice")
    # Heartbeats are delivered on the agent's stream and need no acknowledgement.
    batch = await h.take("alice", notices=True)
    assert sum(1 for x in batch if x.message.message_type == 3) == 3
    assert all(p["state"] == "FULFILLED" for p in await _heartbeats(h, "alice"))


@pytest.mark.conformance(
    "registry.heartbeat.debounce", "registry.deregister.explicit", "registry.heartbeat.respond"
)
async def test_a_silent_agent_is_unavailable_only_after_debounce_and_never_removed(
    h: EngineHarness,
) -> None:
    await h.connect("bob")  # alice is not even connected: judged all the same
    settings = h.engine.presence.settings
    assert (settings.heartbeat_timeout_s, settings.debounce) == (15.0, 3)

    async def tick(seconds: float) -> None:
        h.clock.advance(seconds)
        await h.engine.registry.heartbeat("bob", "", {})  # bob answers; alice is silent
        await h.engine.presence.tick()

    for _ in range(3):
        await tick(5)  # t = 15: within the timeout, nobody has missed anything
    assert await _state(h, "alice") == "RUNNABLE"
    await tick(5)  # t = 20: first miss
    await tick(5)  # second miss
    assert await _state(h, "alice") == "RUNNABLE"
    await tick(5)  # third consecutive miss: debounced long enough
    assert await _state(h, "alice") == UNAVAILABLE
    assert await _state(h, "bob") == "RUNNABLE"
    (change,) = await h.events("agent.state")
    assert change.details == {**change.details, "from": "RUNNABLE", "to": UNAVAILABLE}
    assert "3 missed heartbeats" in change.details["reason"]
    told = [n for n in await _notifications(h, "bob") if n["event"] == "agent_unavailable"]
    assert [n["agent_id"] for n in told] == ["alice"]
    # However long the silence, alice stays registered: only an explicit request removes it.
    for _ in range(100):
        await tick(5)
    assert (await h.engine.registry.find("alice")) is not None
    assert [a.agent_id for a in await h.engine.registry.list()] == ["alice", "bob"]
    assert await h.events("agent.deregistered") == []
    told = [n for n in await _notifications(h, "bob") if n["event"] == "agent_unavailable"]
    assert len(told) == 1  # announced once, not every round
    assert (await h.send("bob", "alice", {"n": 1})).accepted  # still addressable


@pytest.mark.conformance("registry.heartbeat.debounce")
async def test_an_answer_resets_the_miss_count(h: EngineHarness) -> None:
    h.clock.advance(20)
    await h.engine.presence.tick()
    h.clock.advance(5)
    await h.engine.presence.tick()  # two misses
    await h.engine.registry.heartbeat("alice", "", {})
    for _ in range(2):
        h.clock.advance(5)
        await h.engine.presence.tick()
    h.clock.advance(10)
    await h.engine.presence.tick()  # 20 s since the answer: one miss again
    h.clock.advance(5)
    await h.engine.presence.tick()
    assert await _state(h, "alice") == "RUNNABLE"


async def test_a_heartbeat_revives_an_unavailable_agent(h: EngineHarness) -> None:
    h.clock.advance(20)
    for _ in range(3):
        await h.engine.presence.tick()
        h.clock.advance(5)
    assert await _state(h, "alice") == UNAVAILABLE
    record = await h.engine.registry.heartbeat("alice", "", {"load": "0.1"})
    assert record.state == "RUNNABLE"
    (available,) = await h.events("agent.available")
    assert (available.agent_id, available.details["health"]) == ("alice", {"load": "0.1"})


async def test_a_join_and_a_heartbeat_round_are_one_write_however_many_agents(
    tmp_path: Path,
) -> None:
    # Announcing to N agents is one admission (one writer job), not N in a row: a fleet's
    # start-up registers every agent, each announced to all the others.
    async with open_test_engine(store_url=f"sqlite:///{tmp_path}/a.db", data_dir=tmp_path) as h:
        for n in range(40):
            await h.register(f"agent-{n}")
            await h.connect(f"agent-{n}")
        assert isinstance(h.store, SqliteStore)
        jobs = h.store.stats.writer.jobs
        await h.register("late")
        for n in range(40):
            joined = [
                note["agent"]["agent_id"]
                for note in await _notifications(h, f"agent-{n}")
                if note["event"] == "agent_joined"
            ]
            assert joined[-1] == "late"
        # The registration itself, its event, and one write for the 40 notices.
        assert h.store.stats.writer.jobs - jobs <= 4
        await h.connect("late")
        (directory,) = await _notifications(h, "late")
        assert len(directory["agents"]) == 41
        jobs = h.store.stats.writer.jobs
        await h.engine.presence.tick()
        assert h.store.stats.writer.jobs - jobs <= 2
        assert [len(await _heartbeats(h, f"agent-{n}")) for n in range(40)] == [1] * 40
        assert len(await _heartbeats(h, "late")) == 1


async def test_a_fleet_starting_up_stores_no_notices_for_agents_not_yet_connected(
    tmp_path: Path,
) -> None:
    # Each of N agents registering used to be announced to all the others: N^2/2 rows
    # before anyone connected (50 million for 10,000 agents), expiring unread. Now only a
    # directory per agent, when its stream opens.
    async with open_test_engine(store_url=f"sqlite:///{tmp_path}/a.db", data_dir=tmp_path) as h:
        for n in range(60):
            await h.register(f"agent-{n}")
        await h.engine.presence.tick()
        assert [len(await h.inbox_payloads(f"agent-{n}")) for n in range(60)] == [0] * 60
        for n in range(60):
            await h.connect(f"agent-{n}")
        first, last = (await _notifications(h, "agent-0")), await _notifications(h, "agent-59")
        assert [n["event"] for n in first] == [n["event"] for n in last] == ["directory"]
        assert len(first[0]["agents"]) == len(last[0]["agents"]) == 60


async def test_an_agent_that_registers_again_while_connected_gets_the_directory_again(
    h: EngineHarness,
) -> None:
    stream = await h.connect("alice")
    await h.connect("bob")
    await h.register("alice", capabilities=["review"])  # a new descriptor, same stream
    batch = await asyncio.wait_for(anext(stream), 5)
    (again,) = [h.engine.router.codec.decode(x.message.envelope) for x in batch]
    assert b'"directory"' in again.payload and b'"review"' in again.payload
    # The others hear of it as a join, with the new descriptor.
    (joined,) = [n for n in await _notifications(h, "bob") if n["event"] == "agent_joined"]
    assert joined["agent"]["capabilities"] == ["review"]
