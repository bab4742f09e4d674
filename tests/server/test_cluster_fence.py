"""A leader paused past its term, in process on the real PostgreSQL (docs/cluster.md, "The
leader"): its lease's loop stops (as a stop-the-world pause stops it), the lease lapses and
another replica takes the term over; the old leader, which still believes it leads, then
has a task write refused (its agent's FULFILLED ACK, whose task transition commits with
it): nothing of the task is written, the replica stops leading (it is lost: `apiary serve`
exits 2), and the ACK, applied alone, goes to the relay for the next leader."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import apiary
from apiary.core.cluster.leases import LeaseAction
from apiary.core.records import TaskRecord
from apiary.engine.cluster.leader_role import LeaderRole
from apiary.engine.cluster.settings import ClusterSettings
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from apiary.store.cluster import ENVELOPE, Me
from apiary.store.postgres.cluster_leader import PostgresClusterLeader
from apiary.store.postgres.store import PostgresStore
from tests.server.test_cluster_leader import WAIT_S, Holder, _running, _until

pytestmark = pytest.mark.postgres

LEASE_S = 1.0
USURPER = Me("usurper", "inc-u", "10.9.9.9:50051")


def _role(replica: Coordinator) -> LeaderRole:
    assert replica.cluster is not None and replica.cluster.leader is not None
    return replica.cluster.leader


async def _take_over(store: PostgresStore) -> int:
    """Another replica's term: taken over once the lease lapsed (the database's clock)."""
    leader = PostgresClusterLeader(store.pool)
    loop = asyncio.get_running_loop()
    until = loop.time() + WAIT_S
    while True:
        outcome = await leader.step(USURPER, LeaseAction.ACQUIRE, 3600.0, USURPER.address)
        if outcome.verdict.granted:
            return outcome.lease.epoch
        assert loop.time() < until, "the paused leader's lease never lapsed"
        await asyncio.sleep(0.05)


def _state(task: TaskRecord | None) -> str:
    return "" if task is None else task.state


async def _relayed_envelopes(store: PostgresStore) -> int:
    async with store.pool.connection() as conn:
        cursor = await conn.execute(
            "SELECT count(*) FROM cluster_relay WHERE kind = %s", [ENVELOPE]
        )
        row = await cursor.fetchone()
    assert row is not None
    return int(row[0])


async def test_a_leader_paused_past_its_term_has_its_task_write_refused_and_stops_leading(
    tmp_path: Path, url: str
) -> None:
    settings = ClusterSettings(True, "a", LEASE_S, 4)
    async with open_test_coordinator(tmp_path / "a", url, cluster=settings) as replica:
        role = _role(replica)
        await _until(role.leads, "the replica leads")
        store = replica.store
        assert isinstance(store, PostgresStore) and replica.scheduler is not None
        agent = Holder(coordinator=str(replica.grpc_address))
        async with (
            _running(agent),
            apiary.Client(str(replica.grpc_address), agent_id="app") as client,
        ):
            await client.submit_task("holder", {"n": 1}, scope="repo:app", task_id="t-p")
            await asyncio.wait_for(agent.started.wait(), WAIT_S)
            scheduler = replica.scheduler
            await _until(lambda: _state(scheduler.get("t-p")) == "RUNNING", "the task runs")
            # The pause: the lease's loop stops (nothing renews, nothing notices), the lease
            # lapses and another replica's term begins. The Scheduler goes on as it was.
            keeper = next(t for t in role.tasks if t.get_name().endswith("-leader"))
            keeper.cancel()
            epoch = await _take_over(store)
            assert epoch == role.lease.last_epoch + 1 and not role.lost.is_set()
            relayed = await _relayed_envelopes(store)
            agent.release.set()
            await _until(role.lost.is_set, "the refused write ends the leadership")
            await _until(replica.leadership_lost.is_set, "the replica stops serving")
            assert not role.leads() and scheduler.deputy is role.relay
            # The agent's ACK is applied alone and goes to the relay, for the next leader.
            loop = asyncio.get_running_loop()
            until = loop.time() + WAIT_S
            while await _relayed_envelopes(store) == relayed:
                assert loop.time() < until, "the ACK never reached the relay"
                await asyncio.sleep(0.05)
        stored = await store.tasks.get("t-p")
        assert stored is not None and stored.state == "RUNNING" and stored.result == ""
        dispatch = await store.messages.get(stored.message_id)
        assert dispatch is not None and dispatch.state == "FULFILLED"
        ends = await store.events.read(0, 1000)
        assert not [e for e in ends if e.event_type == "task.completed"]
