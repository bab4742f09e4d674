"""One engine's share of the cluster's leadership (docs/cluster.md, "The leader" and
"Tenants"): the default tenant's engine, or another tenant's over its own schema. The one
leader's lease of the cluster covers every tenant; each engine has its own relay (its
schema's `cluster_relay`, read under the cluster's lease), its own leader's components
(`assembly.LEADER_PARTS`) and its own router endpoints of them.

While this replica does not lead (or the part has not joined yet), the engine's Scheduler
hands its inputs to the relay and HITL is refused here; once the term begins (or the part
joins a term under way: a tenant opened on the leader), the components are loaded from the
engine's store as a restarted coordinator's are, their loops run, and what the other
replicas relayed for this engine is applied (`LeaderInbox`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any, Final

from apiary.core.clock import Clock
from apiary.core.envelope import Envelope
from apiary.engine.assembly import Engine, leader_loops, load_leader_parts, supervised
from apiary.engine.cluster.leader import LeaderInbox, LeaderLease, Relay
from apiary.engine.deadlines import Sleep
from apiary.engine.notices import TOOLS, WORKTREES
from apiary.engine.router.admission import EndpointCheck
from apiary.engine.workflows import WORKFLOW
from apiary.stopping import stop_tasks
from apiary.store.cluster import ClusterLeader, Leadership
from apiary.store.errors import StoreError

log = logging.getLogger("apiary.cluster")

LEADER_ENDPOINTS: Final = (WORKFLOW, TOOLS, WORKTREES)
"""The router endpoints of the leader's components besides the Scheduler's: EVENT nodes'
messages, tool providers' results (and the ACKs of their TOOL_CALLs), WORKTREE_CONTROL."""
RELAY = "relay"
"""The kind of note that something was relayed (`ClusterLeader.wakes`)."""


class LeaderPart:
    """One engine's leader's components, relay and inbox under the shared `lease` (module
    docstring). `listens`: the part listens for its own relay's notes while it leads (a
    tenant's schema; the default tenant's are heard by the lease's listener)."""

    def __init__(
        self, store: ClusterLeader, lease: LeaderLease, engine: Engine, clock: Clock,
        sleep: Sleep, *, name: str, lost: asyncio.Event, listens: bool = False,
    ) -> None:  # fmt: skip
        self.lease = lease
        self.relay = Relay(store, lease.me, engine.router.codec)
        self.inbox = LeaderInbox(
            store, lease, engine.scheduler, engine.registry, engine.router, sleep,
            hitl=engine.hitl,
        )  # fmt: skip
        self.loaded = asyncio.Event()
        """Set while this replica leads with this engine's components loaded and running."""
        self.joined = False
        """Whether the part takes part in the terms (`join`; a tenant's, once loaded)."""
        self.tasks: list[asyncio.Task[None]] = []
        """The load under way and the leader's loops while it leads."""
        self._loops: list[asyncio.Task[None]] = []
        self._loading = False
        self._ready = False
        """Whether the components were loaded (they are once, in the first term led)."""
        self._store = store
        self._engine = engine
        self._clock = clock
        self._sleep = sleep
        self._name = name
        self._lost = lost
        self._listens = listens
        router = engine.router
        self._endpoints = {
            endpoint: (handler, router.endpoint_check(endpoint))
            for endpoint in LEADER_ENDPOINTS
            if (handler := router.endpoint(endpoint)) is not None
        }
        """The leader's router endpoints besides the Scheduler's (which hands its envelopes
        to its deputy), with their checks, relayed while this replica does not lead."""
        self.relay_endpoints()

    def leads(self) -> bool:
        return self.loaded.is_set() and self.lease.leads()

    async def join(self) -> None:
        """Take part in the terms from now on: in the one under way at once, if this
        replica leads (a tenant opened on the leader)."""
        self.joined = True
        epoch = self.lease.epoch()
        if epoch is not None and not self.lease.suspended and not self._lost.is_set():
            await self.lead(epoch)

    async def lead(self, epoch: int) -> None:
        """This replica's term begins: the components are loaded in a task of their own, so
        that the lease is renewed meanwhile however long loading takes."""
        if not self.joined:
            return
        self._loading = True
        self.tasks.append(asyncio.create_task(self._load(epoch), name=f"{self._name}-leader-load"))

    async def _load(self, epoch: int) -> None:
        """The leader's components loaded as a restarted coordinator's are, its MCP servers
        started, their loops started, then the readiness of the agents streaming here.
        Until then, what agents tell this replica's Scheduler goes to the relay, which the
        leader applies once loaded."""
        engine = self._engine
        try:
            await load_leader_parts(engine)
            engine.tools.start()
            self._ready = True
        finally:
            self._loading = False
        if self.lease.suspended or self._lost.is_set() or not self.joined:
            return  # (`resume` starts the work once the term is renewed)
        await self.resume()
        for agent_id in _streaming(engine):
            await engine.scheduler.agent_ready(agent_id)
        log.warning("%s: leading (epoch %d)", self._name, epoch)

    async def suspend(self) -> None:
        """The leader's work stops: inputs go to the relay again, its loops end."""
        self.relay_endpoints()
        self.loaded.clear()
        loops, self._loops = self._loops, []
        await stop_tasks(loops, f"{self._name}: the leader's loops")
        self.tasks = [t for t in self.tasks if t not in loops and not t.done()]

    async def resume(self) -> None:
        """The leader's work starts (once loaded) or goes on after a suspension: the
        components' memory is still the truth."""
        if self._loading or self._lost.is_set() or not self.joined:
            return  # (`_load` starts it when it is done)
        if not self._ready:  # (it joined while the term was suspended: loaded now)
            epoch = self.lease.epoch()
            if epoch is not None:
                await self.lead(epoch)
            return
        self._serve_endpoints()
        self._start_loops()
        self.loaded.set()

    async def term(self, found: Leadership) -> None:
        """A new term of another replica: it learns which agents stream here."""
        if found.leader() != self.lease.me.replica_id:
            self.loaded.clear()
            await self.relay.streaming(_streaming(self._engine))

    async def leave(self) -> None:
        """No more part in the terms (its engine closes): the loops and a load end."""
        self.joined = False
        tasks, self.tasks = self.tasks, []
        await self.suspend()
        await stop_tasks(tasks, f"{self._name}: the leader's load", expected=(StoreError,))

    def release(self) -> None:
        """A clean stop: inputs go to the relay, for the next leader."""
        self.relay_endpoints()
        self.loaded.clear()

    def halt(self) -> None:
        """Stop at once, writing nothing more (as a killed process would)."""
        self.loaded.clear()
        for task in self.tasks:
            task.cancel()

    def relay_endpoints(self) -> None:
        """What agents tell the leader's components here goes to the relay (and HITL is
        refused: its invocations live on the leader)."""
        self._engine.scheduler.deputy = self.relay
        self._engine.hitl.leading = False
        router = self._engine.router
        for endpoint, (_, check) in self._endpoints.items():
            router.attach(endpoint, partial(self._relayed, endpoint, check), check)

    def _serve_endpoints(self) -> None:
        """What agents tell the leader's components here is theirs to act on."""
        self._engine.scheduler.deputy = None
        self._engine.hitl.leading = True
        router = self._engine.router
        for endpoint, (handler, check) in self._endpoints.items():
            router.attach(endpoint, handler, check)

    async def _relayed(self, endpoint: str, check: EndpointCheck | None, env: Envelope) -> None:
        """An envelope for the leader's endpoint `endpoint`, refused here if its check
        refuses it (as the leader would), else relayed."""
        if check is not None:
            check(env)
        await self.relay.envelope(endpoint, env)

    def _start_loops(self) -> None:
        loops: dict[str, Callable[[], Coroutine[Any, Any, None]]] = dict(
            leader_loops(self._engine, self._clock, self._sleep)
        )
        loops["relay"] = self.inbox.run
        if self._listens:
            loops["relay-notes"] = self._follow_relay
        self._loops = [
            asyncio.create_task(supervised(f"{self._name}-{n}", loop), name=f"{self._name}-{n}")
            for n, loop in loops.items()
        ]
        self.tasks += self._loops

    async def _follow_relay(self) -> None:
        """Until cancelled: wake the inbox at each note of a relay (a hint: it polls; a lost
        connection ends the loop, which `supervised` starts again)."""
        async for kind in self._store.wakes():
            if kind == RELAY:
                self.inbox.woken.set()


def _streaming(engine: Engine) -> list[str]:
    router = engine.router
    return sorted(a for a in router.inboxes() if router.streaming(a))
