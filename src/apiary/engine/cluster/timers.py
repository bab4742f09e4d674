"""The message deadlines a partition's owner runs (docs/cluster.md, "Timers").

In a cluster the deadlines of a message (its ACK deadline, stored by the replica that
handed it out: `ack_deadlines.py`; its TTL, stored at admission) are run by the owner of
its recipient's partition, and by no other replica: the router's own deadline loop is not
started in cluster mode (`start_engine_tasks(message_deadlines=False)`). Every `poll_s` the
owner reads the due messages, keeps those of the partitions it owns now, and claims each in
a transaction fenced by its lease's epoch (`ClusterWork.claim_due`) before applying the
deadline's input through the router (`MessageLifecycle.fire`): NACK, dead letter and
idempotency follow as on one coordinator. A replica whose term ended cannot claim; of two
claims of one deadline only the first finds it due. The claim moves the deadline to
`retry_s` later, so that a firing cut short (a crash, a store error) is taken up again then
by whoever owns the partition; a firing that finished leaves the message finished, never
due again. Then the recipient's host is told (a note), which forgets the message.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Final

from apiary.core.clock import Clock
from apiary.core.cluster.partitions import partition_of
from apiary.core.message_machine import MessageInput
from apiary.core.records import StoredMessage
from apiary.engine.cluster.keeper import LeaseKeeper
from apiary.engine.deadlines import Sleep
from apiary.engine.router.router import Router
from apiary.store.cluster import CHANGED, ClusterWork, FencedError, Me
from apiary.store.errors import StoreError
from apiary.store.protocols import MessageStore

log = logging.getLogger("apiary.cluster")
Claimed = Awaitable[StoredMessage | None]
Claim = Callable[[Me, int, int, str], Claimed]
"""A store claim of one message (replica, partition, term, message id) under that term."""

POLL_S: Final = 0.25
"""How often the owner reads the due messages: how late, at most, a deadline fires."""
PAGE: Final = 500
_AWAY: Final = "on any replica"


class OwnerTimers:
    """The deadlines of the messages of the partitions this replica owns (module doc)."""

    def __init__(
        self,
        router: Router,
        messages: MessageStore,
        work: ClusterWork,
        keeper: LeaseKeeper,
        clock: Clock,
        sleep: Sleep,
        note: Callable[[str, str], None],
        *,
        poll_s: float = POLL_S,
    ) -> None:
        self._router = router
        self._messages = messages
        self._work = work
        self._keeper = keeper
        self._clock = clock
        self._sleep = sleep
        self._note = note
        self.poll_s = poll_s
        self.fired = 0
        """Deadlines this replica fired since it started."""

    async def run(self) -> None:
        """Until cancelled: fire what is due, then wait `poll_s`."""
        while True:
            try:
                await self.fire_due()
            except StoreError as exc:
                log.warning("cluster: firing deadlines failed (next poll retries): %s", exc)
            await self._sleep(self.poll_s)

    async def fire_due(self) -> int:
        """Fire every deadline due now of the partitions owned now; returns how many."""
        now = self._clock.now()
        await self._router.transfers.expire(now)
        owned = self._keeper.owned()
        if not owned:
            return 0
        retry_at = now + self._keeper.settings.lease_s
        fired = 0
        due = await self._messages.due(now, PAGE)

        def claim(me: Me, partition: int, epoch: int, message_id: str) -> Claimed:
            return self._work.claim_due(me, partition, epoch, message_id, now, retry_at)

        async for claimed in self._claimed(due, owned, claim):
            if await self._fire(claimed, now):
                fired += 1
        fired += await self._fire_aged(now, owned)
        self.fired += fired
        return fired

    async def _fire_aged(self, now: float, owned: dict[int, int]) -> int:
        """Fail the messages of the partitions owned that waited past `max_age_s` for a
        recipient with no stream on any replica (AGE_EXPIRE, as on one coordinator)."""
        max_age_s = self._router.deadlines.max_age_s
        if not max_age_s:
            return 0
        born_before = now - max_age_s
        fired = 0
        aged = await self._work.aged(born_before, PAGE)

        def claim(me: Me, partition: int, epoch: int, message_id: str) -> Claimed:
            return self._work.claim_aged(me, partition, epoch, message_id, born_before)

        async for claimed in self._claimed(aged, owned, claim):
            if await self._router.lifecycle.fire(
                claimed.message_id, MessageInput.AGE_EXPIRE, now, "agent_unavailable",
                away=_AWAY,
            ):  # fmt: skip
                fired += 1
            self._note(CHANGED, claimed.recipient)
        return fired

    async def _claimed(
        self, found: list[StoredMessage], owned: dict[int, int], claim: Claim
    ) -> AsyncIterator[StoredMessage]:
        """Each of `found` in a partition owned (by its term, `owned`) that `claim` takes
        under that term; one whose term is over (fenced) or that no longer qualifies is
        left out."""
        partitions = self._keeper.settings.partitions
        for message in found:
            partition = partition_of(message.recipient, partitions)
            epoch = owned.get(partition)
            if epoch is None:
                continue
            try:
                claimed = await claim(self._keeper.me, partition, epoch, message.message_id)
            except FencedError as exc:
                log.info("cluster: %s", exc)
                continue
            if claimed is not None:
                yield claimed

    async def _fire(self, message: StoredMessage, now: float) -> bool:
        """Apply the input of the deadline of `message` (as claimed) that passed at `now`."""
        if 0 < message.expires_at <= now:
            event, code = MessageInput.TTL_EXPIRE, "ttl_expired"
        elif 0 < message.ack_deadline <= now:
            event, code = MessageInput.ACK_TIMEOUT, "ack_timeout"
        else:
            return False
        done = await self._router.lifecycle.fire(message.message_id, event, now, code)
        self._note(CHANGED, message.recipient)
        return done
