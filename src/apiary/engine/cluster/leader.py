"""The cluster's leader (docs/cluster.md, "The leader"): the one replica at a time that runs
the coordinator-level components (the Scheduler), the holder of the leader's lease.

`LeaderLease` keeps or seeks the lease: every `renew_s` it renews the term it holds, or
acquires the lease when it is free or lapsed (a takeover: a new epoch, which fences the old
leader's reads of the relay). A term is acted on until `lease_s` after the request that
granted or last renewed it was sent, on this replica's monotonic clock (as a partition's,
`core.cluster.holdings`): past that, the leader's work stops here (`on_suspend`) whatever
the store says. A term renewed late, or a lapsed lease taken again with the very next epoch
(no other replica led meanwhile), goes on (`on_resume`); when another term began, this
replica has lost the leadership for good (LeadershipLostError: the replica stops and its
supervisor starts it again as a follower; the Scheduler's memory is not rebuilt in place).

While another replica leads, this replica's Scheduler hands what it is told to the relay
(`Relay`, the Scheduler's `Deputy`): agents' readiness and reports, their losses, the
envelopes addressed to it; they are rows of the store's relay, which the leader applies in
order (`LeaderInbox`). Calls to the Scheduler's services are forwarded to the leader by the
server (`server.cluster_forward`). Each new term of a leader is announced (NOTIFY, and seen
by polling): every replica then relays again the readiness of the agents streaming on it,
so a new leader learns where agents are without anything of the old one's memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Final

from apiary.core.clock import Clock
from apiary.core.cluster.holdings import Term
from apiary.core.cluster.leases import LeaseAction, Verdict
from apiary.core.envelope import Envelope
from apiary.engine.codec import EnvelopeCodec
from apiary.engine.deadlines import Sleep, pause_until
from apiary.engine.hitl import Hitl
from apiary.engine.registry import Registry
from apiary.engine.router.router import Router
from apiary.engine.scheduler.scheduler import Scheduler
from apiary.store.cluster import (
    DEREGISTERED,
    ENVELOPE,
    HITL_CANCEL,
    LOST,
    READY,
    REGISTERED,
    REPORTED,
    ClusterLeader,
    FencedError,
    Leadership,
    Me,
    Relayed,
)
from apiary.store.errors import StoreError

log = logging.getLogger("apiary.cluster")

RELAY_BATCH: Final = 200
"""Relayed items the leader reads and applies at once."""
INBOX_POLL_S: Final = 0.5
"""How often the leader reads the relay without being woken (notes only make it sooner)."""


class LeadershipLostError(Exception):
    """This replica's term as leader ended without a release: it stops."""


class LeaderLease:
    """The leader's lease as this replica sees it (module docstring)."""

    def __init__(
        self, store: ClusterLeader, me: Me, lease_s: float, clock: Clock, sleep: Sleep
    ) -> None:
        self.me = me
        self.lease_s = lease_s
        self.seen: tuple[str | None, int] = (None, -1)
        """(leader, epoch) as last read: a change is a new term of some leader."""
        self.address = ""
        """The address the leader serves, as last read ('' while there is none)."""
        self._store = store
        self._clock = clock
        self._sleep = sleep
        self._term: Term | None = None
        self.last_epoch = 0
        """The epoch of the last term this replica held (0: it never led); kept when the
        term ends, so that writes made under it are refused from then on."""
        self._wake = asyncio.Event()
        self.changed = asyncio.Event()
        """Set at each new term seen (cleared by whoever waits for it)."""
        self.on_lead: Callable[[int], Awaitable[None]] = _nothing
        """Called once this replica's term begins (with its epoch), before it is announced."""
        self.on_term: Callable[[Leadership], Awaitable[None]] = _nothing_seen
        """Called at each new term seen, this replica's or another's."""
        self.suspended = False
        """This replica's term ran past its local deadline and is not renewed yet."""
        self.on_suspend: Callable[[], Awaitable[None]] = _nothing_more
        """Called when this replica's term runs past its local deadline unrenewed."""
        self.on_resume: Callable[[], Awaitable[None]] = _nothing_more
        """Called when a suspended term is renewed (or taken again with no other between)."""

    def epoch(self) -> int | None:
        """The epoch of this replica's term, while it may act on it; None otherwise."""
        term = self._term
        if term is None or self._clock.monotonic() >= term.until:
            return None
        return term.epoch

    def leads(self) -> bool:
        return self.epoch() is not None

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        """Renew or seek the lease every `lease_s / 3` until cancelled;
        LeadershipLostError when this replica's term ended and another began. A term past
        its local deadline is suspended (`on_suspend`: the leader's work stops) until it is
        renewed or, lapsed, taken again with no other term between (`on_resume`)."""
        while True:
            started = self._clock.monotonic()
            try:
                await self.tick()
            except StoreError as exc:
                log.warning("the leader's lease was not renewed or sought: %s", exc)
            await self.check_term()
            await self._pause(started + self.lease_s / 3)

    async def check_term(self) -> None:
        """Suspend the term held when it ran past its local deadline unrenewed."""
        if self._term is not None and self.epoch() is None and not self.suspended:
            log.warning(
                "the leader's term %d ran out before it was renewed: its work stops until it "
                "is renewed", self._term.epoch,
            )  # fmt: skip
            self.suspended = True
            await self.on_suspend()

    async def tick(self) -> None:
        """Renew the term held, or acquire the lease when it is free or lapsed."""
        sent = self._clock.monotonic()
        held = self._term
        if held is not None:
            await self._renew(held, sent)
        else:
            outcome = await self._store.step(
                self.me, LeaseAction.ACQUIRE, self.lease_s, self.me.address
            )
            lease = outcome.lease
            if outcome.verdict.granted:
                self._term = Term(lease.epoch, sent + self.lease_s)
                self.last_epoch = lease.epoch
                if outcome.verdict is Verdict.TOOK_OVER:
                    log.warning("took over as the cluster's leader (epoch %d)", lease.epoch)
                await self.on_lead(lease.epoch)
        await self._look()

    async def _renew(self, held: Term, sent: float) -> None:
        """Renew `held`; a lease that lapsed before its renewal is taken again, and the term
        goes on when no other began meanwhile (the epoch is the next one): nobody else acted
        as the leader, so what this replica holds in memory is still the truth."""
        outcome = await self._store.step(self.me, LeaseAction.RENEW, self.lease_s)
        if not outcome.verdict.granted:
            outcome = await self._store.step(
                self.me, LeaseAction.ACQUIRE, self.lease_s, self.me.address
            )
            if outcome.verdict is not Verdict.ACQUIRED or outcome.lease.epoch != held.epoch + 1:
                self._term = None
                if outcome.verdict.granted:  # (another term began and ended meanwhile)
                    await self._store.step(self.me, LeaseAction.RELEASE, self.lease_s)
                raise LeadershipLostError(
                    f"replica {self.me.replica_id} lost the cluster's leadership: another "
                    f"term began after its term {held.epoch} lapsed"
                )
            log.warning(
                "the leader's lease lapsed before its renewal; taken again with no other term "
                "between (epoch %d -> %d)", held.epoch, outcome.lease.epoch,
            )  # fmt: skip
        self._term = Term(outcome.lease.epoch, sent + self.lease_s)
        self.last_epoch = outcome.lease.epoch
        if self.suspended:
            self.suspended = False
            await self.on_resume()

    async def _look(self) -> None:
        """Read who leads; a new term seen is announced (`on_term`)."""
        found = await self._store.read()
        leader = found.leader()
        self.address = found.address if leader else ""
        if (leader, found.lease.epoch) != self.seen and leader is not None:
            self.seen = (leader, found.lease.epoch)
            self.changed.set()
            await self.on_term(found)

    async def release(self) -> None:
        """A clean stop: the term ends now, for the next leader to take at once."""
        if self._term is None:
            return
        self._term = None
        await self._store.step(self.me, LeaseAction.RELEASE, self.lease_s)

    async def follow(self, relayed: asyncio.Event) -> None:
        """Until cancelled: look at the lease again at each change of leader announced, and
        set `relayed` at each relay (hints: polling goes on without them)."""
        try:
            async for kind in self._store.wakes():
                if kind == "relay":
                    relayed.set()
                else:
                    self.wake()
        except StoreError as exc:
            log.warning("not listening for the leader's notes (polling goes on): %s", exc)

    async def _pause(self, until: float) -> None:
        await pause_until(until, self._clock, self._sleep, self._wake)


async def _nothing(_epoch: int) -> None:
    return None


async def _nothing_seen(_found: Leadership) -> None:
    return None


async def _nothing_more() -> None:
    return None


class Relay:
    """The Scheduler's `Deputy` on a replica that does not lead: each input becomes a row
    of the store's relay, for the leader to apply."""

    def __init__(self, store: ClusterLeader, me: Me, codec: EnvelopeCodec) -> None:
        self._store = store
        self._me = me
        self._codec = codec

    async def _put(self, item: Relayed) -> None:
        await self._store.relay(self._me, [item])

    async def registered(self, agent_id: str, agent_type: str) -> None:
        await self._put(Relayed(REGISTERED, agent_id, agent_type))

    async def ready(self, agent_id: str) -> None:
        await self._put(Relayed(READY, agent_id))

    async def reported(self, agent_id: str, state: str) -> None:
        await self._put(Relayed(REPORTED, agent_id, state))

    async def deregistered(self, agent_id: str) -> None:
        await self._put(Relayed(DEREGISTERED, agent_id))

    async def lost(self, agent_id: str, reason: str) -> None:
        await self._put(Relayed(LOST, agent_id, reason))

    async def envelope(self, endpoint: str, env: Envelope) -> None:
        await self._put(Relayed(ENVELOPE, env.producer_id, endpoint, self._codec.encode(env)))

    async def hitl_cancel(self, invocation_id: str, by: str, reason: str) -> None:
        """A HITL invocation withdrawn here, for the leader to cancel (when still pending)."""
        await self._put(Relayed(HITL_CANCEL, invocation_id, json.dumps([by, reason])))

    async def streaming(self, agent_ids: list[str]) -> None:
        """The agents streaming on this replica, relayed as ready (a new leader's term)."""
        await self._store.relay(self._me, [Relayed(READY, a) for a in agent_ids])


class LeaderInbox:
    """The leader's side of the relay: each row applied in order to the Scheduler (or the
    router endpoint an envelope names), then deleted, under the leader's term."""

    def __init__(
        self,
        store: ClusterLeader,
        lease: LeaderLease,
        scheduler: Scheduler,
        registry: Registry,
        router: Router,
        sleep: Sleep,
        poll_s: float = INBOX_POLL_S,
        hitl: Hitl | None = None,
    ) -> None:
        self._store = store
        self._lease = lease
        self._scheduler = scheduler
        self._hitl = hitl
        self._registry = registry
        self._router = router
        self._sleep = sleep
        self._poll_s = poll_s
        self.woken = asyncio.Event()
        self.applied = 0

    async def run(self) -> None:
        """Apply the relay until cancelled: at each wake-up and every `poll_s`."""
        while True:
            epoch = self._lease.epoch()
            if epoch is None:
                return
            try:
                while await self.drain(epoch) == RELAY_BATCH:
                    pass
            except FencedError:
                return  # (the term is over: the lease's loop ends the leadership)
            except StoreError as exc:
                log.warning("the leader's relay was not read: %s", exc)
            sleeper = asyncio.ensure_future(self._sleep(self._poll_s))
            waker = asyncio.ensure_future(self.woken.wait())
            try:
                await asyncio.wait({sleeper, waker}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                sleeper.cancel()
                waker.cancel()
                self.woken.clear()

    async def drain(self, epoch: int) -> int:
        """Apply one batch of the relay; how many items it had."""
        me = self._lease.me
        items = await self._store.relayed(me, epoch, RELAY_BATCH)
        done: list[int] = []
        try:
            for item in items:
                await self._apply(item)
                done.append(item.seq)
        finally:
            with contextlib.suppress(StoreError):
                await self._store.applied(me, epoch, done)
        self.applied += len(done)
        return len(items)

    async def _apply(self, item: Relayed) -> None:
        scheduler, agent = self._scheduler, item.agent_id
        try:
            if item.kind == ENVELOPE:
                endpoint = self._router.endpoint(item.detail)
                if endpoint is not None:
                    await endpoint(self._router.codec.decode(item.envelope))
            elif item.kind in (READY, REGISTERED):
                if await self._registry.refresh(agent) is None:
                    return
                if item.kind == READY:
                    await scheduler.agent_ready(agent)
                else:
                    await scheduler.agent_registered(agent, item.detail)
            elif item.kind == REPORTED:
                await scheduler.agent_reported(agent, item.detail)
            elif item.kind == LOST:
                await scheduler.agent_lost(agent, item.detail)
            elif item.kind == DEREGISTERED:
                await self._registry.refresh(agent)
                await scheduler.agent_deregistered(agent)
            elif item.kind == HITL_CANCEL and self._hitl is not None:
                by, reason = json.loads(item.detail)
                await self._hitl.cancel(agent, str(by), str(reason))
        except StoreError:
            raise  # (kept in the relay: applied again at the next pass)
        except Exception as exc:
            # What the Scheduler refuses it would have refused on one coordinator: the
            # relayed item is done with, as the agent's call would have been answered.
            log.warning("relayed %s of %s not applied: %s", item.kind, agent, exc)
