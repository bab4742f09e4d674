"""This replica's part in the cluster's leadership (docs/cluster.md, "The leader"): the one
leader's lease, which covers every tenant, and the share of each engine in it (`LeaderPart`:
the default tenant's, and each other tenant's opened here). A follower's Schedulers hand
their inputs to their relays; once this replica's term as leader begins, each engine's
leader's components are loaded from its store (as a restarted coordinator's are), run, and
apply what the other replicas relayed; a term that ends without a release ends the replica
(`lost`)."""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable, Coroutine
from dataclasses import replace
from typing import Any, Final

from apiary.core.access.principal import DEFAULT_TENANT
from apiary.core.clock import Clock
from apiary.engine.assembly import Engine
from apiary.engine.cluster.leader import LeaderLease, LeadershipLostError, Relay
from apiary.engine.cluster.leader_part import LeaderPart
from apiary.engine.deadlines import Sleep
from apiary.store.cluster import ClusterLeader, FencedError, Leadership, Me
from apiary.store.errors import StoreError

log = logging.getLogger("apiary.cluster")

LOOK_S: Final = 0.05
"""How often a call waiting for a leader looks again."""


class LeaderRole:
    """The leader's lease of one replica and each engine's share in it (`parts`, by
    tenant)."""

    def __init__(
        self, store: ClusterLeader, me: Me, lease_s: float, engine: Engine, clock: Clock,
        sleep: Sleep,
    ) -> None:  # fmt: skip
        self.lease = LeaderLease(store, me, lease_s, clock, sleep)
        self.forward_key = ""
        """The cluster's key for forwarded calls (`core.cluster.forwarding`)."""
        self.lost = asyncio.Event()
        """Set when another term began after this replica's lapsed: it must stop."""
        self._name = f"apiary-cluster-{me.replica_id}"
        self._clock = clock
        self._sleep = sleep
        self.part = LeaderPart(
            store, self.lease, engine, clock, sleep, name=self._name, lost=self.lost
        )
        """The default tenant's engine's share (it takes part from the start)."""
        self.part.joined = True
        self.parts: dict[str, LeaderPart] = {DEFAULT_TENANT: self.part}
        """Each engine's share, by tenant: the default's, and each tenant's opened here."""
        self._leasing: list[asyncio.Task[None]] = []
        self._released = False
        self._store = store
        self.lease.on_lead = self._lead
        self.lease.on_term = self._term
        self.lease.on_suspend = self._suspend
        self.lease.on_resume = self._resume

    @property
    def loaded(self) -> asyncio.Event:
        """Set once this replica leads with the default tenant's components loaded."""
        return self.part.loaded

    @property
    def relay(self) -> Relay:
        """The default tenant's relay to the leader."""
        return self.part.relay

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        """The lease's loops, and each engine's leader's while it leads."""
        return [*self._leasing, *(t for part in self.parts.values() for t in part.tasks)]

    def tenant_part(self, tenant: str, store: ClusterLeader, engine: Engine) -> LeaderPart:
        """The share of `tenant`'s engine, over its relay `store`, under this replica's
        lease; it takes part in the terms once it `join`s (its engine loaded), and no more
        once it `leave`s (`forget` then)."""
        part = LeaderPart(
            store, self.lease, engine, self._clock, self._sleep,
            name=f"{self._name}-t-{tenant[:32]}", lost=self.lost, listens=True,
        )  # fmt: skip
        self.parts[tenant] = part
        return part

    def forget(self, tenant: str) -> None:
        if tenant != DEFAULT_TENANT:
            self.parts.pop(tenant, None)

    async def seed(self) -> None:
        """The cluster's leader row (created by the first replica), and its key."""
        found = await self._store.seed(secrets.token_hex(32))
        self.forward_key = found.forward_key

    def start(self, address: str) -> None:
        """Seek (or keep) the lease from now on, recording `address` as where this replica
        serves calls forwarded to the leader."""
        self.lease.me = replace(self.lease.me, address=address)
        self._leasing += [
            asyncio.create_task(self._keep(), name=f"{self._name}-leader"),
            asyncio.create_task(
                self.lease.follow(self.part.inbox.woken), name=f"{self._name}-leader-notes"
            ),
        ]

    def leads(self, tenant: str = DEFAULT_TENANT) -> bool:
        """Whether this replica leads with `tenant`'s components loaded."""
        part = self.parts.get(tenant)
        return part is not None and part.leads()

    async def address(self, wait_s: float) -> str:
        """The leader's address, waiting up to `wait_s` for one; '' when there is none by
        then."""
        loop = asyncio.get_running_loop()
        until = loop.time() + wait_s
        while True:
            found = self.lease.address
            if found and not self.lost.is_set():
                return found
            if loop.time() >= until:
                return ""
            self.lease.wake()
            await asyncio.sleep(LOOK_S)

    def term(self) -> tuple[str, int]:
        """The term the leader's components write under (`store.sql.leader_writes`), every
        tenant's: the last this replica held, whether or not it still does (the store
        decides)."""
        return self.lease.me.replica_id, self.lease.last_epoch

    def refused(self, error: FencedError) -> None:
        """A write of the leader's components (of any tenant) was refused: another
        replica's term began (this one was paused past its own, say). This replica stops
        leading at once, as when its lease's loop finds the term taken (`lost`: `apiary
        serve` exits 2, to be started again as a follower); what agents tell it goes to the
        relays from now on."""
        if self._released or self.lost.is_set() or not self.lease.last_epoch:
            return  # (stopping, stopped, or never led: nothing to stop)
        log.error(
            "a write of the leader's components was refused (%s): stopping (a supervisor "
            "starts the replica again)", error,
        )  # fmt: skip
        self.lost.set()
        for part in self.parts.values():
            part.release()
        self._leasing.append(asyncio.create_task(self._suspend(), name=f"{self._name}-fenced"))

    async def release(self) -> None:
        """A clean stop: stop leading first, then let the next leader take over at once."""
        self._released = True
        for part in self.parts.values():
            part.release()
        try:
            await self.lease.release()
        except StoreError as exc:
            log.warning("the leader's lease was not released (it will lapse): %s", exc)

    def halt(self) -> None:
        """Stop every loop at once, releasing nothing (as a killed process would)."""
        for part in self.parts.values():
            part.halt()
        for task in self._leasing:
            task.cancel()

    async def _keep(self) -> None:
        try:
            await _supervised_lease(self.lease.run)
        except LeadershipLostError as exc:
            log.error("%s: stopping (a supervisor starts the replica again)", exc)
            self.lost.set()  # (first: a load finishing now starts nothing)
            await self._suspend()

    async def _lead(self, epoch: int) -> None:
        for part in list(self.parts.values()):
            await part.lead(epoch)

    async def _suspend(self) -> None:
        for part in list(self.parts.values()):
            await part.suspend()

    async def _resume(self) -> None:
        for part in list(self.parts.values()):
            await part.resume()

    async def _term(self, found: Leadership) -> None:
        for part in list(self.parts.values()):
            if part.joined:
                await part.term(found)


async def _supervised_lease(run: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """The lease's loop: LeadershipLostError ends it; anything else is logged and the loop
    started again (the term runs out on its own when renewals keep failing)."""
    while True:
        try:
            await run()
            return
        except LeadershipLostError:
            raise
        except Exception as exc:
            log.warning("the leader's lease loop failed, starting again: %s", exc)
            await asyncio.sleep(0.5)
