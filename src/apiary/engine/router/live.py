"""The live copies of unfinished messages, shared by the message lifecycle and delivery.

The store is the source of truth; the live copy of a message is what the store holds for it
now, kept in step with every change the router makes, so that an ACK, a timer or a hand-out
needs no read. Each live message is also indexed in its recipient's Inbox and watched by a
deadline (`engine/deadlines.py`): its ACK deadline while a stream holds it, its TTL, and its
maximum age while it waits for a recipient with no stream. Hand-out counts are written behind
(`delivered`). Rebuilt from the store at start (`recover`), with no ACK deadline: that starts
again at the next hand-out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from apiary.core.records import MessageState, StoredMessage
from apiary.core.trace_context import TraceContext
from apiary.engine.deadlines import Deadlines
from apiary.engine.router.admission import is_notice
from apiary.engine.router.inbox import Inboxes
from apiary.store.protocols import MessageStore

DELIVERIES_WRITE_BEHIND_S = 1.0
"""How long a hand-out count may wait for its message's next state change to be written."""
_RECOVERY_PAGE = 1000
_UNFINISHED = frozenset(s for s in MessageState if not s.terminal)
_BUFFERED = (MessageState.RECEIVED, MessageState.RETRYING)

Placement = Callable[[StoredMessage], bool]
"""Cluster mode's say over a message admitted here (`LiveMessages.placement`): True when this
replica keeps it live now, False when it is followed from the store instead."""


class LiveMessages:
    def __init__(self, messages: MessageStore, inboxes: Inboxes, deadlines: Deadlines) -> None:
        self._messages = messages
        self._inboxes = inboxes
        self._deadlines = deadlines
        self._copies: dict[str, StoredMessage] = {}
        self._unwritten: dict[str, tuple[int, float]] = {}
        """Hand-out counts not yet stored, by message id: (deliveries, last_delivered_at),
        oldest hand-out first."""
        self.started_at = 0.0
        """When this coordinator recovered its messages (`recover`): the start of an offline
        recipient's wait when it has had no stream since."""
        self.traces: dict[str, TraceContext] = {}
        """The trace context of each live message that has one (docs/tracing.md), by id:
        in memory only, so a message recovered after a restart is delivered without one."""
        self.placement: Placement | None = None
        """Cluster mode only (engine/cluster/follower.py): decides whether a message admitted
        here is kept live here (`admitted`); None, the default, keeps every one."""

    @property
    def copies(self) -> Mapping[str, StoredMessage]:
        """The live copy of each unfinished message, by id (changed only through this)."""
        return self._copies

    def current(self, message: StoredMessage) -> StoredMessage:
        """The live copy of `message` (what the store holds now), or `message` itself once
        it is no longer live."""
        return self._copies.get(message.message_id, message)

    def refresh(self, message: StoredMessage) -> None:
        """Keep the live copy of an unfinished message in step with the store."""
        if message.message_id in self._copies:
            self._copies[message.message_id] = message

    def add(self, message: StoredMessage, *, occupies: bool) -> None:
        """A message admitted (or found unfinished at start): live, queued in its inbox
        (taking buffer space if `occupies`), its deadline watched."""
        self._copies[message.message_id] = message
        inbox = self._inboxes[message.recipient]
        inbox.add(message, occupies=occupies)
        # What occupies a slot is what may await an ACK (not a notice, not READ; the age
        # limit leaves out what was acknowledged); with a stream open it is handed out at
        # once, and its ACK deadline starts then.
        self._deadlines.watch(message, waiting=occupies and not inbox.streams)

    def admitted(self, message: StoredMessage, *, occupies: bool) -> None:
        """A message this router admitted: live (`add`), unless cluster mode's `placement`
        says another replica's stream, or a read of the store, takes it; its buffer slot
        here is given back then."""
        if self.placement is None or self.placement(message):
            self.add(message, occupies=occupies)
        else:
            self._inboxes[message.recipient].release(message.message_id)

    def waiting(self, message: StoredMessage) -> bool:
        """Whether `message` awaits an ACK with no stream holding it and none of its
        recipient's open: what its maximum age bounds."""
        return (
            not message.acked_stage
            and not is_notice(message)
            and not self._deadlines.ack_due(message.message_id)
            and not self._inboxes.streaming(message.recipient)
        )

    def watch(self, message: StoredMessage) -> None:
        """(Re)arm the earliest deadline `message` has now."""
        self._deadlines.watch(message, waiting=self.waiting(message))

    def offline_since(self, agent_id: str) -> float:
        """When `agent_id`'s last stream ended, or when this coordinator started if it has
        had none since."""
        inbox = self._inboxes.get(agent_id)
        return (inbox.offline_since if inbox is not None else 0.0) or self.started_at

    def awaiting(self, agent_id: str) -> list[StoredMessage]:
        """The live copies of `agent_id`'s messages queued for its stream or handed out and
        not acknowledged."""
        inbox = self._inboxes.get(agent_id)
        copies = self._copies
        if inbox is None:
            return []
        return [copies[i] for i in inbox.awaiting() if i in copies]

    def changed(self, message: StoredMessage, *, acked: bool) -> bool:
        """`message` as its state change left it (`acked`: by an acknowledgement); True when
        that state is terminal, and the message forgotten."""
        if message.state.terminal:
            self.forget(message)
            return True
        message_id = message.message_id
        inbox = self._inboxes[message.recipient]
        if acked:
            inbox.acknowledged(message_id)
        self._copies[message_id] = message
        inbox.update(message)
        if message.state is MessageState.READ:
            inbox.dequeued(message_id)
        return False

    def forget(self, message: StoredMessage) -> None:
        """`message` finished (its terminal state is stored, or it is a notice handed out and
        recorded FULFILLED): out of its inbox, not live, no deadline."""
        message_id = message.message_id
        self._inboxes[message.recipient].finished(message_id)
        self._copies.pop(message_id, None)
        self._deadlines.cancel(message_id)
        if self.traces:
            self.traces.pop(message_id, None)

    def writes_count(self, message_id: str, deliveries: int) -> None:
        """A state change about to be stored carries `deliveries` hand-outs of the message:
        its count need not be written behind unless a later hand-out counted more."""
        unwritten = self._unwritten.get(message_id)
        if unwritten is not None and unwritten[0] <= deliveries:
            del self._unwritten[message_id]

    async def delivered(self, handed: Sequence[StoredMessage], now: float) -> None:
        """Count hand-outs (`handed`: the messages as handed out, their delivery count and
        time set). The counts are written behind: with each message's next state change,
        which nearly every message has within moments (its ACK), or, for those still without
        one `DELIVERIES_WRITE_BEHIND_S` after their hand-out, by a later hand-out, or at close
        (`flush_deliveries`). A crash forgets at most the counts of that last second, which
        only lets a message be handed out once more than its retry budget says."""
        unwritten = self._unwritten
        for message in handed:
            message_id = message.message_id
            unwritten.pop(message_id, None)  # to the end: the order is by hand-out time
            unwritten[message_id] = (message.deliveries, message.last_delivered_at)
        due = now - DELIVERIES_WRITE_BEHIND_S
        stale = []
        for message_id, (deliveries, at) in unwritten.items():
            if at > due:
                break
            stale.append((message_id, deliveries, at))
        if stale:
            for message_id, _, _ in stale:
                del unwritten[message_id]
            await self._messages.record_deliveries(stale)

    async def flush_deliveries(self) -> None:
        """Store every hand-out count not yet written."""
        if self._unwritten:
            counts = [(i, n, at) for i, (n, at) in self._unwritten.items()]
            self._unwritten = {}
            await self._messages.record_deliveries(counts)

    async def recover(self, agent_ids: Iterable[str], now: float) -> int:
        """Rebuild the live copies, inboxes and deadlines of `agent_ids`' unfinished
        messages from the store after a (re)start at `now`; returns how many there are.

        No stream is open yet, so no ACK is due: whatever deadline a message had when the
        coordinator stopped, the unacknowledged ones wait for their recipients' streams,
        bounded by their TTL and maximum age, and the next hand-out starts a whole ACK
        deadline (a restart, however long, times nothing out)."""
        self.started_at = now
        recovered = 0
        for agent_id in agent_ids:
            after = 0
            while True:
                page = await self._messages.inbox(agent_id, after, _RECOVERY_PAGE, _UNFINISHED)
                for message in page:
                    occupies = not is_notice(message) and message.state in _BUFFERED
                    self.add(message, occupies=occupies)
                    recovered += 1
                if len(page) < _RECOVERY_PAGE:
                    break
                after = page[-1].offset
        return recovered
