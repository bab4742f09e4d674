"""An agent's ACK of a task's dispatch committed and never applied to the task
(docs/cluster.md, "ACKs committed and not applied"): the coordinator, or the replica that
was to relay the ACK to the leader, died between the ACK's commit and the task's. The ACK
is stored (the message's state, the result cached in its token's record), and the
Scheduler takes it from there:

- a single coordinator started again on its store completes the task with its result, once;
- a coordinator that goes on does when the agent's stream opens again, or when the agent
  deregisters (rather than failing the task agent_unavailable);
- in cluster mode, a follower that died before relaying the ACK (and the leader with it):
  the next leader completes the task with its result as it loads.

The dying replica is played by the real one with its ACK's way to the Scheduler cut after
the router's commit (the Scheduler's endpoint, or the relay, drops it), so the rows are
those the real router writes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import pytest

import apiary
from apiary.core.envelope import Envelope
from apiary.engine.cluster.settings import ClusterSettings
from apiary.engine.notices import SCHEDULER
from apiary.engine.router.ack_joins import AckedMessage, JoinedAcks
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from apiary.store.protocols import Store
from tests.server.test_cluster_leader import WAIT_S, Holder, _role, _running, _until

SCOPE = "repo:app"


class Cut:
    """The ACKs that never reached the Scheduler."""

    def __init__(self) -> None:
        self.dropped: list[Envelope] = []

    async def drop(self, env: Envelope) -> None:
        self.dropped.append(env)

    async def drop_relayed(self, endpoint: str, env: Envelope) -> None:
        self.dropped.append(env)


async def _no_join(_acks: Sequence[AckedMessage]) -> JoinedAcks | None:
    return None


def _cut(replica: Coordinator) -> Cut:
    """The Scheduler of `replica` hears no ACK of its dispatches: they are committed by the
    router alone (no task transition joins them) and dropped on their way to it."""
    cut = Cut()
    replica.router.join_acks(SCHEDULER, _no_join)
    replica.router.attach(SCHEDULER, cut.drop)
    return cut


async def _fulfilled(store: Store, task_id: str) -> None:
    """Until the task's dispatch is FULFILLED in the store while the task is not."""
    loop = asyncio.get_running_loop()
    until = loop.time() + WAIT_S
    while True:
        task = await store.tasks.get(task_id)
        message = await store.messages.get(task.message_id) if task and task.message_id else None
        if message is not None and message.state == "FULFILLED":
            assert task is not None and task.state in ("DISPATCHED", "RUNNING")
            return
        assert loop.time() < until, "the agent's ACK was never stored"
        await asyncio.sleep(0.02)


async def _completed_once(store: Store, task_id: str) -> None:
    task = await store.tasks.get(task_id)
    assert task is not None and (task.state, json.loads(task.result)) == ("COMPLETED", "held")
    events = await store.events.read(0, 10_000)
    ends = [e for e in events if e.event_type == "task.completed" and e.correlation_id == task_id]
    assert len(ends) == 1


async def _held_task_acked(coordinator: Coordinator, agent: Holder, task_id: str) -> Cut:
    """`task_id` submitted to `agent` through `coordinator`, run, and its FULFILLED ACK
    stored and cut on its way to the Scheduler (`_cut`)."""
    async with apiary.Client(str(coordinator.grpc_address), agent_id="app") as client:
        await client.submit_task("holder", {"n": 1}, scope=SCOPE, task_id=task_id)
    await asyncio.wait_for(agent.started.wait(), WAIT_S)
    cut = _cut(coordinator)
    agent.release.set()
    await _fulfilled(coordinator.store, task_id)
    return cut


async def test_a_coordinator_started_again_applies_the_ack_it_stored_and_never_applied(
    tmp_path: Path,
) -> None:
    url = f"sqlite://{tmp_path / 'apiary.db'}"
    async with AsyncExitStack() as agents:
        async with open_test_coordinator(tmp_path / "one", url) as first:
            agent = Holder(coordinator=str(first.grpc_address))
            # (the agent outlives the coordinator: it does not deregister before it dies)
            await agents.enter_async_context(_running(agent))
            cut = await _held_task_acked(first, agent, "t-r")
        assert cut.dropped
    async with open_test_coordinator(tmp_path / "two", url) as second:
        assert second.scheduler is not None and second.scheduler.get("t-r") is None
        await _completed_once(second.store, "t-r")


@pytest.mark.parametrize("then", ["stream", "deregistered"])
async def test_a_coordinator_that_goes_on_applies_the_ack_at_the_agents_next_stream_or_end(
    tmp_path: Path, then: str
) -> None:
    url = f"sqlite://{tmp_path / 'apiary.db'}"
    async with open_test_coordinator(tmp_path / "one", url) as coordinator:
        agent = Holder(coordinator=str(coordinator.grpc_address))
        scheduler = coordinator.scheduler
        assert scheduler is not None
        async with _running(agent):
            await _held_task_acked(coordinator, agent, "t-s")
            assert scheduler.get("t-s") is not None  # (the Scheduler never heard of the ACK)
            if then == "stream":
                # What the agent's stream opening again tells the Scheduler (its replica
                # died with the ACK, and it reconnected here).
                await scheduler.agent_ready("holder")
                assert scheduler.get("t-s") is None
        # Otherwise the agent deregisters as it stops: its task is settled from the store
        # first, not failed agent_unavailable.
        await _until(lambda: scheduler.get("t-s") is None, "the task ends")
        assert agent.ran == ["t-s"]  # (its dispatch had ended: not handed out again)
        await _completed_once(coordinator.store, "t-s")


@asynccontextmanager
async def _replicas(tmp_path: Path, url: str) -> AsyncIterator[list[Coordinator]]:
    """Three replicas, the leader first (a 2 s lease: under a loaded CI machine's stalls a
    1 s one lapsed now and then, and the term the test counts on changed hands)."""
    async with AsyncExitStack() as stack:
        replicas = [
            await stack.enter_async_context(
                open_test_coordinator(
                    tmp_path / name, url, cluster=ClusterSettings(True, name, 2.0, 4)
                )
            )
            for name in "abc"
        ]
        await _until(lambda: sum(_role(r).leads() for r in replicas) == 1, "one leader")
        replicas.sort(key=lambda r: not _role(r).leads())
        yield replicas


@pytest.mark.postgres
async def test_an_ack_stored_by_a_follower_that_died_before_relaying_it_ends_its_task(
    tmp_path: Path, postgres_dsn: str, postgres_schema: str
) -> None:
    url = f"{postgres_dsn}?apiary_schema={postgres_schema}"
    async with _replicas(tmp_path, url) as (leader, follower, third):
        agent = Holder(coordinator=str(follower.grpc_address))
        async with (
            _running(agent),
            apiary.Client(str(third.grpc_address), agent_id="app") as client,
        ):
            await client.submit_task("holder", {"n": 1}, scope=SCOPE, task_id="t-f")
            await asyncio.wait_for(agent.started.wait(), WAIT_S)
            # The follower dies right after the ACK's commit: its relay never writes it.
            cut = Cut()
            _role(follower).relay.envelope = cut.drop_relayed  # type: ignore[method-assign]
            agent.release.set()
            await _fulfilled(follower.store, "t-f")
            assert follower.cluster is not None and leader.cluster is not None
            follower.cluster.halt()
            leader.cluster.halt()  # (and the leader: the next one loads from the store)
            await _until(lambda: _role(third).leads(), "the third replica leads")
            scheduler = third.scheduler
            assert scheduler is not None
            await _until(lambda: scheduler.get("t-f") is None, "the task ends")
        assert cut.dropped
        await _completed_once(third.store, "t-f")
