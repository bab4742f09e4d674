"""The lease keeper: one replica's heartbeat and partition leases, kept in the store.

Every `renew_s` (a third of `lease_s`) a tick beats (extends the replica's heartbeat and
renews its live leases, in one transaction that also reads the cluster's view), then follows
`core.cluster.assignment.plan`: it lets go of the partitions assigned to another replica and
acquires those assigned to it that are free or lapsed, a lapsed one from a dead replica being
a takeover (a new epoch, which fences the old owner). Between ticks it sleeps until the next
renewal or until another replica's heartbeat or lease expires, whichever is first, so that a
dead replica's partitions are taken as soon as its leases lapse: within `lease_s` of its
last renewal. `wake()` (a NOTIFY from a replica releasing partitions, say) cuts a sleep short;
the timed ticks are what guarantee progress. `open_lease_keeper` runs both the ticks and
`follow_releases`, which wakes the keeper at each release another replica announces.

What the replica owns is `owned()`: the partitions whose terms are within their local
deadline (`core.cluster.holdings`), each with the epoch its fenced writes must name. A store
failure skips a tick (logged) and the terms run out on their own; a replica evicted from the
table (its id taken by a newer start) stops.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Final

from apiary.core.clock import Clock
from apiary.core.cluster.assignment import ClusterView, plan
from apiary.core.cluster.holdings import Holdings
from apiary.core.cluster.leases import Lease, Verdict
from apiary.engine.cluster.settings import ClusterSettings
from apiary.engine.deadlines import Sleep, pause_until
from apiary.stopping import stop_tasks
from apiary.store.cluster import (
    ClusterLeases,
    LeaseOutcome,
    Me,
    ReplicaEvictedError,
    ReplicaInUseError,
)
from apiary.store.errors import StoreError

log = logging.getLogger("apiary.cluster")

MIN_WAIT_S: Final = 0.005
"""The shortest sleep between ticks: the database's clock and ours may disagree by a few
milliseconds about an expiry, which must not turn into a busy loop."""


class LeaseKeeper:
    """One replica's membership and leases (module docstring); `open_lease_keeper` runs it."""

    def __init__(
        self,
        leases: ClusterLeases,
        settings: ClusterSettings,
        clock: Clock,
        sleep: Sleep,
        *,
        address: str = "",
        incarnation: str = "",
    ) -> None:
        self.me = Me(settings.resolved_replica_id(), incarnation or uuid.uuid4().hex, address)
        self.settings = settings
        self.view: ClusterView | None = None
        """The cluster as the last tick saw it (with its own acquisitions applied)."""
        self.ticks = 0
        self.takeovers = 0
        """Partitions taken over from a replica whose lease lapsed, since the start."""
        self._leases = leases
        self._clock = clock
        self._sleep = sleep
        self._holdings = Holdings()
        self._changed = asyncio.Condition()
        self._wake = asyncio.Event()

    @property
    def replica_id(self) -> str:
        return self.me.replica_id

    def owned(self) -> dict[int, int]:
        """Partition -> epoch of every partition this replica may act on now."""
        return self._holdings.owned(self._clock.monotonic())

    def epoch(self, partition: int) -> int | None:
        """The epoch `partition` is held under now, None when this replica does not own it."""
        return self._holdings.epoch(partition, self._clock.monotonic())

    def wake(self) -> None:
        """Look again now instead of at the next timed tick (a hint: ticks also come on
        their own)."""
        self._wake.set()

    async def follow_releases(self) -> None:
        """Wake at each release another replica announces (LISTEN/NOTIFY), until cancelled;
        when listening fails, say so and leave it to the timed ticks."""
        try:
            async for _ in self._leases.releases():
                self.wake()
        except StoreError as exc:
            log.warning("not listening for lease releases (ticks go on): %s", exc)

    async def wait_until(self, done: Callable[[LeaseKeeper], bool]) -> None:
        """Return once `done(self)` holds, checked after every tick (no timeout: bound it)."""
        async with self._changed:
            await self._changed.wait_for(lambda: done(self))

    async def join(self) -> None:
        """Enter the cluster's table (seeding the partitions on first use); the errors of
        `ClusterLeases.join`, except that a predecessor under the same id whose heartbeat is
        still running out is waited for once (a restart after a crash)."""
        try:
            self.view = await self._leases.join(
                self.me, self.settings.partitions, self.settings.lease_s
            )
        except ReplicaInUseError as exc:
            log.warning("%s; waiting %.1f s for it to lapse", exc, exc.remaining_s)
            await self._sleep(exc.remaining_s + MIN_WAIT_S)
            self.view = await self._leases.join(
                self.me, self.settings.partitions, self.settings.lease_s
            )

    async def run(self) -> None:
        """Tick until cancelled; ReplicaEvictedError ends it (nothing is owned then)."""
        while True:
            try:
                until = await self.tick()
            except ReplicaEvictedError:
                self._holdings.clear()
                await self._notify()
                raise
            except StoreError as exc:
                log.warning("cluster lease tick failed (leases run out unless renewed): %s", exc)
                until = self._clock.monotonic() + self.settings.renew_s
            await self._pause(until)

    async def tick(self) -> float:
        """Beat, release and acquire once; return when the next tick is due (monotonic),
        counted from this tick's start so that renewals keep their pace however long a
        tick takes."""
        lease_s = self.settings.lease_s
        started = sent = self._clock.monotonic()
        beat = await self._leases.beat(self.me, lease_s)
        self._keep(beat.renewed, sent)
        view = beat.view
        todo = plan(view, self.replica_id)
        if todo.release:
            self._holdings.dropped(todo.release)  # stop acting first, then let go
            view = _applied(view, await self._leases.release(self.me, todo.release))
        if todo.acquire:
            sent = self._clock.monotonic()
            outcomes = await self._leases.acquire(self.me, todo.acquire, lease_s)
            self._gained(view, outcomes, sent)
            view = _applied(view, outcomes)
        self.view = view
        self.ticks += 1
        await self._notify()
        delay = self.settings.renew_s
        later = view.next_change(self.replica_id)
        if later is not None:
            delay = min(delay, later - view.now)
        return started + max(delay, MIN_WAIT_S)

    async def leave(self) -> None:
        """Release every lease and leave the table (a clean stop); owns nothing after."""
        self._holdings.clear()
        await self._leases.leave(self.me)
        await self._notify()

    def _keep(self, renewed: Sequence[LeaseOutcome], sent: float) -> None:
        kept = {o.lease.partition for o in renewed if o.verdict.granted}
        for outcome in renewed:
            if outcome.verdict.granted:
                lease = outcome.lease
                self._holdings.granted(lease.partition, lease.epoch, sent, self.settings.lease_s)
        self._holdings.dropped([p for p in self._holdings.terms() if p not in kept])

    def _gained(self, view: ClusterView, outcomes: Sequence[LeaseOutcome], sent: float) -> None:
        before = {lease.partition: lease for lease in view.leases}
        for outcome in outcomes:
            lease = outcome.lease
            if outcome.verdict.granted:
                self._holdings.granted(lease.partition, lease.epoch, sent, self.settings.lease_s)
            if outcome.verdict is Verdict.TOOK_OVER:
                self.takeovers += 1
                old = before.get(lease.partition, Lease(lease.partition))
                log.warning(
                    "took over partition %d from %s (epoch %d -> %d): its lease lapsed",
                    lease.partition, old.owner, old.epoch, lease.epoch,
                )  # fmt: skip

    async def _pause(self, until: float) -> None:
        await pause_until(until, self._clock, self._sleep, self._wake)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()


def _applied(view: ClusterView, outcomes: Sequence[LeaseOutcome]) -> ClusterView:
    """`view` with the leases of `outcomes` as they are stored now."""
    after: Mapping[int, Lease] = {o.lease.partition: o.lease for o in outcomes}
    return replace(view, leases=tuple(after.get(lease.partition, lease) for lease in view.leases))


@asynccontextmanager
async def open_lease_keeper(
    leases: ClusterLeases,
    settings: ClusterSettings,
    clock: Clock,
    sleep: Sleep = asyncio.sleep,
    *,
    address: str = "",
) -> AsyncIterator[LeaseKeeper]:
    """A joined keeper ticking in a task for the duration of the block; on exit the task
    is cancelled and the replica leaves the cluster (its leases released at once)."""
    keeper = LeaseKeeper(leases, settings, clock, sleep, address=address)
    await keeper.join()
    name = f"apiary-cluster-{keeper.replica_id}"
    tasks = [
        asyncio.create_task(keeper.run(), name=name),
        asyncio.create_task(keeper.follow_releases(), name=f"{name}-releases"),
    ]
    try:
        yield keeper
    finally:
        await stop_tasks(tasks, name, expected=(ReplicaEvictedError,))
        try:
            await keeper.leave()
        except StoreError as exc:
            log.warning("could not leave the cluster (leases will lapse instead): %s", exc)
