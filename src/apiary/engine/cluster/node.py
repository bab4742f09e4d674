"""One replica of a cluster (docs/cluster.md): the lease keeper, the follower of the shared
store, the owner's timers and the ACK deadline writer, hooked into one engine.

The hooks (each None or off, changing nothing, outside cluster mode):
`LiveMessages.placement` and `Delivery.follower` (the follower decides what is live here),
`Registry.on_change` (a note to the others), `Router.count_in_store` (buffers and credits
counted by the store), `MessageLifecycle.conditional` (state changes stored only from the
state they were decided from) and `Registry.reads_through` (an agent this
replica does not know yet is looked up in the store before no_route), `Deadlines.on_ack`
(ACK deadlines stored for the owner) and `Presence.judges` (heartbeats judged by the
partition's owner only).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from apiary.core.clock import Clock
from apiary.core.cluster.partitions import partition_of
from apiary.engine.assembly import Engine, supervised
from apiary.engine.cluster.ack_deadlines import AckDeadlineWriter
from apiary.engine.cluster.follower import POLL_S as FOLLOW_POLL_S
from apiary.engine.cluster.follower import StoreFollower
from apiary.engine.cluster.keeper import LeaseKeeper
from apiary.engine.cluster.leader_part import LeaderPart
from apiary.engine.cluster.leader_role import LeaderRole
from apiary.engine.cluster.settings import ClusterSettings
from apiary.engine.cluster.stream_holds import StreamHolds
from apiary.engine.cluster.timers import POLL_S as TIMER_POLL_S
from apiary.engine.cluster.timers import OwnerTimers
from apiary.engine.deadlines import Sleep
from apiary.stopping import stop_tasks
from apiary.store.cluster import (
    ClusterLeader,
    ClusterLeases,
    ClusterWork,
    FencedError,
    ReplicaEvictedError,
    StreamHolders,
)
from apiary.store.errors import StoreError
from apiary.store.protocols import MessageStore

log = logging.getLogger("apiary.cluster")


@dataclass(slots=True)
class EngineReplica:
    """One engine's parts of a replica (`open_engine_replica`): the default tenant's, or
    another tenant's over its own schema, beside the replica's one lease keeper."""

    follower: StoreFollower
    timers: OwnerTimers
    deadlines: AckDeadlineWriter
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    halted: bool = False
    leader: LeaderPart | None = None
    """Another tenant's engine's share of the leadership (`LeaderRole.tenant_part`): its
    leader's components run on the replica that leads, with the default tenant's."""

    def halt(self) -> None:
        """Stop every loop at once, writing nothing more (as a killed process would)."""
        self.halted = True
        for task in self.tasks:
            task.cancel()
        if self.leader is not None:
            self.leader.halt()


@dataclass(slots=True)
class ClusterNode:
    """A running replica's cluster parts (`open_cluster_node`): its lease keeper and the
    default tenant's engine's parts; `tenants`, those of the other tenants' engines opened
    since (`open_engine_replica`, keyed by tenant)."""

    keeper: LeaseKeeper
    part: EngineReplica
    leasing: list[asyncio.Task[None]] = field(default_factory=list)
    """The lease keeper's loops."""
    halted: bool = False
    tenants: dict[str, EngineReplica] = field(default_factory=dict)
    leader: LeaderRole | None = None
    """The leader's lease and relays (docs/cluster.md, "The leader"), with a leader store:
    every tenant's coordinator-level components run on the replica that leads."""

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        """The loops of the lease keeper, the leader's role and the default tenant's
        engine's parts."""
        return [*self.leasing, *self._leading(), *self.part.tasks]

    def _leading(self) -> list[asyncio.Task[None]]:
        return list(self.leader.tasks) if self.leader is not None else []

    @property
    def follower(self) -> StoreFollower:
        return self.part.follower

    @property
    def timers(self) -> OwnerTimers:
        return self.part.timers

    @property
    def deadlines(self) -> AckDeadlineWriter:
        return self.part.deadlines

    def halt(self) -> None:
        """Stop every loop at once and release nothing, as a killed process would: the
        leases lapse and another replica takes the partitions over (tests in process)."""
        self.halted = True
        if self.leader is not None:
            self.leader.halt()
        for part in (self.part, *self.tenants.values()):
            part.halt()
        for task in self.leasing:
            task.cancel()


@asynccontextmanager
async def open_cluster_node(
    engine: Engine,
    messages: MessageStore,
    leases: ClusterLeases,
    work: ClusterWork,
    holders: StreamHolders,
    settings: ClusterSettings,
    clock: Clock,
    sleep: Sleep = asyncio.sleep,
    *,
    address: str = "",
    leader: ClusterLeader | None = None,
    follow_poll_s: float = FOLLOW_POLL_S,
    timer_poll_s: float = TIMER_POLL_S,
) -> AsyncIterator[ClusterNode]:
    """`engine` as a replica for the duration of the block: joined to the cluster, its
    hooks set and its loops running; on exit the loops stop and the replica leaves (its
    leases released at once) unless it was halted."""
    keeper = LeaseKeeper(leases, settings, clock, sleep, address=address)
    await keeper.join()
    name = f"apiary-cluster-{keeper.replica_id}"
    # The lease keeper ends the replica when it is evicted (ReplicaEvictedError).
    tasks = [
        asyncio.create_task(keeper.run(), name=f"{name}-lease"),
        asyncio.create_task(keeper.follow_releases(), name=f"{name}-releases"),
    ]
    node: ClusterNode | None = None
    role: LeaderRole | None = None
    try:
        if leader is not None:
            role = LeaderRole(leader, keeper.me, settings.lease_s, engine, clock, sleep)
            await role.seed()
        async with open_engine_replica(
            engine, messages, work, holders, keeper, clock, sleep, name=name,
            follow_poll_s=follow_poll_s, timer_poll_s=timer_poll_s,
        ) as part:  # fmt: skip
            node = ClusterNode(keeper, part, tasks, leader=role)
            try:
                yield node
            finally:
                if role is not None and not node.halted:
                    await role.release()
    finally:
        leading = list(role.tasks) if role is not None else []
        # FencedError: the leader's components were still loading when its term was
        # released just above, and their next write was fenced (nothing was written).
        await stop_tasks(
            [*tasks, *leading], "cluster replica", expected=(ReplicaEvictedError, FencedError)
        )
    if node is not None and not node.halted:
        await _leave(node)


@asynccontextmanager
async def open_engine_replica(
    engine: Engine,
    messages: MessageStore,
    work: ClusterWork,
    holders: StreamHolders,
    keeper: LeaseKeeper,
    clock: Clock,
    sleep: Sleep = asyncio.sleep,
    *,
    name: str,
    follow_poll_s: float = FOLLOW_POLL_S,
    timer_poll_s: float = TIMER_POLL_S,
) -> AsyncIterator[EngineReplica]:
    """`engine`'s parts of the replica `keeper` runs, over its store (`messages`, `work`,
    `holders`: the default tenant's schema or another tenant's), for the duration of the
    block: its hooks set and its loops running (named `name`-...); on exit the loops stop
    and, unless it was halted, the last ACK deadlines are stored."""
    holds = StreamHolds(engine.router, holders, keeper.me)
    follower = StoreFollower(
        engine.router, engine.registry, engine.presence, messages, work, holds,
        poll_s=follow_poll_s,
    )  # fmt: skip
    timers = OwnerTimers(
        engine.router, messages, work, keeper, clock, sleep, follower.note, poll_s=timer_poll_s
    )
    part = EngineReplica(follower, timers, AckDeadlineWriter(work))
    _hook(engine, part, keeper, clock)
    # The loops are kept running through failures, as the engine's own are (`supervised`):
    # a follower that stopped would leave its agents' messages admitted elsewhere
    # undelivered.
    loops: dict[str, Callable[[], Coroutine[Any, Any, None]]] = {
        "follow": follower.run,
        "listen": follower.listen,
        "notes": follower.send_notes,
        "timers": timers.run,
        "ack-deadlines": part.deadlines.run,
    }
    part.tasks = [
        asyncio.create_task(supervised(f"{name}-{loop}", run), name=f"{name}-{loop}")
        for loop, run in loops.items()
    ]
    try:
        yield part
    finally:
        await stop_tasks(part.tasks, f"cluster replica {name}")
        _unhook(engine)
        if not part.halted:
            try:
                await part.deadlines.flush()
            except StoreError as exc:
                log.warning("cluster: ACK deadlines not stored at stop: %s", exc)


def _hook(engine: Engine, part: EngineReplica, keeper: LeaseKeeper, clock: Clock) -> None:
    router, follower = engine.router, part.follower
    partitions = keeper.settings.partitions
    router.live.started_at = clock.now()
    router.live.placement = follower.place
    router.deadlines.on_ack = part.deadlines.queue
    router.count_in_store(True)
    router.lifecycle.conditional = True
    engine.delivery.follower = follower
    engine.registry.on_change = follower.agent_changed
    engine.registry.reads_through = True
    engine.presence.judges = lambda agent_id: (
        keeper.epoch(partition_of(agent_id, partitions)) is not None
    )


def _unhook(engine: Engine) -> None:
    engine.router.live.placement = None
    engine.router.deadlines.on_ack = None
    engine.router.count_in_store(False)
    engine.router.lifecycle.conditional = False
    engine.delivery.follower = None
    engine.registry.on_change = None
    engine.registry.reads_through = False
    engine.presence.judges = None


async def _leave(node: ClusterNode) -> None:
    """A clean stop (the last ACK deadlines were stored): the leases released."""
    try:
        await node.keeper.leave()
    except StoreError as exc:
        log.warning("could not leave the cluster (leases will lapse instead): %s", exc)
