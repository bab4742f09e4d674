"""This replica's part in the cluster's leadership (docs/cluster.md, "The leader"): a
follower's Scheduler hands its inputs to the relay; once this replica's term as leader
begins, its Scheduler is loaded from the store (as a restarted coordinator's is), runs, and
applies what the other replicas relayed; a term that ends without a release ends the
replica (`lost`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Callable, Coroutine
from dataclasses import replace
from functools import partial
from typing import Any, Final

from apiary.core.clock import Clock
from apiary.core.envelope import Envelope
from apiary.engine.assembly import Engine, leader_loops, load_leader_parts, supervised
from apiary.engine.cluster.leader import (
    LeaderInbox,
    LeaderLease,
    LeadershipLostError,
    Relay,
)
from apiary.engine.deadlines import Sleep
from apiary.engine.notices import TOOLS, WORKTREES
from apiary.engine.router.admission import EndpointCheck
from apiary.engine.workflows import WORKFLOW
from apiary.store.cluster import ClusterLeader, FencedError, Leadership, Me
from apiary.store.errors import StoreError

log = logging.getLogger("apiary.cluster")

LEADER_ENDPOINTS: Final = (WORKFLOW, TOOLS, WORKTREES)
"""The router endpoints of the leader's components besides the Scheduler's: EVENT nodes'
messages, tool providers' results (and the ACKs of their TOOL_CALLs), WORKTREE_CONTROL."""
LOOK_S: Final = 0.05
"""How often a call waiting for a leader looks again."""


class LeaderRole:
    """The leader's lease, the relay and the leader's loops of one replica."""

    def __init__(
        self, store: ClusterLeader, me: Me, lease_s: float, engine: Engine, clock: Clock,
        sleep: Sleep,
    ) -> None:  # fmt: skip
        self.lease = LeaderLease(store, me, lease_s, clock, sleep)
        self.relay = Relay(store, me, engine.router.codec)
        self.inbox = LeaderInbox(
            store, self.lease, engine.scheduler, engine.registry, engine.router, sleep,
            hitl=engine.hitl,
        )  # fmt: skip
        self.forward_key = ""
        """The cluster's key for forwarded calls (`core.cluster.forwarding`)."""
        self.loaded = asyncio.Event()
        """Set once this replica leads with its Scheduler loaded."""
        self.lost = asyncio.Event()
        """Set when another term began after this replica's lapsed: it must stop."""
        self.tasks: list[asyncio.Task[None]] = []
        """The lease's loops, and the leader's while it leads (`_loops` too)."""
        self._loops: list[asyncio.Task[None]] = []
        self._loading = False
        self._released = False
        self._store = store
        self._engine = engine
        self._sleep = sleep
        self._clock = clock
        self._name = f"apiary-cluster-{me.replica_id}"
        self.lease.on_lead = self._lead
        self.lease.on_term = self._term
        self.lease.on_suspend = self._suspend
        self.lease.on_resume = self._resume
        router = engine.router
        self._endpoints = {
            name: (handler, router.endpoint_check(name))
            for name in LEADER_ENDPOINTS
            if (handler := router.endpoint(name)) is not None
        }
        """The leader's router endpoints besides the Scheduler's (which hands its envelopes
        to its deputy), with their checks, relayed while this replica does not lead."""
        self._relay_endpoints()

    async def seed(self) -> None:
        """The cluster's leader row (created by the first replica), and its key."""
        found = await self._store.seed(secrets.token_hex(32))
        self.forward_key = found.forward_key

    def start(self, address: str) -> None:
        """Seek (or keep) the lease from now on, recording `address` as where this replica
        serves calls forwarded to the leader."""
        self.lease.me = replace(self.lease.me, address=address)
        self.tasks += [
            asyncio.create_task(self._keep(), name=f"{self._name}-leader"),
            asyncio.create_task(
                self.lease.follow(self.inbox.woken), name=f"{self._name}-leader-notes"
            ),
        ]

    def leads(self) -> bool:
        return self.loaded.is_set() and self.lease.leads()

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
        """The term the leader's components write under (`store.sql.leader_writes`): the
        last this replica held, whether or not it still does (the store decides)."""
        return self.lease.me.replica_id, self.lease.last_epoch

    def refused(self, error: FencedError) -> None:
        """A write of the leader's components was refused: another replica's term began
        (this one was paused past its own, say). This replica stops leading at once, as
        when its lease's loop finds the term taken (`lost`: `apiary serve` exits 2, to be
        started again as a follower); what agents tell it goes to the relay from now on."""
        if self._released or self.lost.is_set() or not self.lease.last_epoch:
            return  # (stopping, stopped, or never led: nothing to stop)
        log.error(
            "a write of the leader's components was refused (%s): stopping (a supervisor "
            "starts the replica again)", error,
        )  # fmt: skip
        self.lost.set()
        self._relay_endpoints()
        self.loaded.clear()
        self.tasks.append(asyncio.create_task(self._suspend(), name=f"{self._name}-fenced"))

    async def release(self) -> None:
        """A clean stop: stop leading first, then let the next leader take over at once."""
        self._released = True
        self._engine.scheduler.deputy = self.relay
        self.loaded.clear()
        try:
            await self.lease.release()
        except StoreError as exc:
            log.warning("the leader's lease was not released (it will lapse): %s", exc)

    async def _keep(self) -> None:
        try:
            await _supervised_lease(self.lease.run)
        except LeadershipLostError as exc:
            log.error("%s: stopping (a supervisor starts the replica again)", exc)
            self.lost.set()  # (first: a load finishing now starts nothing)
            await self._suspend()

    async def _lead(self, epoch: int) -> None:
        """This replica's term begins: its components are loaded in a task of their own, so
        that the lease is renewed meanwhile however long loading takes."""
        self._loading = True
        self.tasks.append(asyncio.create_task(self._load(epoch), name=f"{self._name}-leader-load"))

    async def _load(self, epoch: int) -> None:
        """The leader's components (`assembly.LEADER_PARTS`: HITL, the Scheduler,
        workflows, tools, ...) loaded as a restarted coordinator's are, its MCP servers
        started, their loops started, then the readiness of the agents streaming here.
        Until then, what agents tell this replica's Scheduler goes to the relay, which the
        leader applies once loaded."""
        engine = self._engine
        try:
            await load_leader_parts(engine)
            engine.tools.start()
        finally:
            self._loading = False
        if self.lease.suspended or self.lost.is_set():
            return  # (`_resume` starts the work once the term is renewed)
        await self._resume()
        for agent_id in _streaming(engine):
            await engine.scheduler.agent_ready(agent_id)
        log.warning("leading the cluster (epoch %d)", epoch)

    def _start_loops(self) -> None:
        loops = leader_loops(self._engine, self._clock, self._sleep)
        loops["relay"] = self.inbox.run
        self._loops = [
            asyncio.create_task(supervised(f"{self._name}-{n}", loop), name=f"{self._name}-{n}")
            for n, loop in loops.items()
        ]
        self.tasks += self._loops

    def _relay_endpoints(self) -> None:
        """What agents tell the leader's components here goes to the relay (and HITL is
        refused: its invocations live on the leader)."""
        self._engine.scheduler.deputy = self.relay
        self._engine.hitl.leading = False
        router = self._engine.router
        for name, (_, check) in self._endpoints.items():
            router.attach(name, partial(self._relayed, name, check), check)

    def _serve_endpoints(self) -> None:
        """What agents tell the leader's components here is theirs to act on."""
        self._engine.scheduler.deputy = None
        self._engine.hitl.leading = True
        router = self._engine.router
        for name, (handler, check) in self._endpoints.items():
            router.attach(name, handler, check)

    async def _relayed(self, name: str, check: EndpointCheck | None, env: Envelope) -> None:
        """An envelope for the leader's endpoint `name`, refused here if its check refuses
        it (as the leader would), else relayed."""
        if check is not None:
            check(env)
        await self.relay.envelope(name, env)

    async def _suspend(self) -> None:
        """The leader's work stops: inputs go to the relay again, its loops end."""
        self._relay_endpoints()
        self.loaded.clear()
        loops, self._loops = self._loops, []
        for task in loops:
            task.cancel()
        for task in loops:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.tasks = [t for t in self.tasks if t not in loops]

    async def _resume(self) -> None:
        """The leader's work starts (once loaded) or goes on after a suspension: the
        components' memory is still the truth."""
        if self._loading or self.lost.is_set():
            return  # (`_load` starts it when it is done)
        self._serve_endpoints()
        self._start_loops()
        self.loaded.set()

    async def _term(self, found: Leadership) -> None:
        """A new term of another replica: it learns which agents stream here."""
        if found.leader() != self.lease.me.replica_id:
            self.loaded.clear()
            await self.relay.streaming(_streaming(self._engine))


def _streaming(engine: Engine) -> list[str]:
    router = engine.router
    return sorted(a for a in router.inboxes() if router.streaming(a))


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
