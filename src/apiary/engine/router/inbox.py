"""In-memory delivery state of one agent's inbound buffer.

The store is the source of truth; an Inbox indexes the agent's unfinished messages so that
delivery, buffer accounting and lane selection need no query per message. It is rebuilt from
the store when the coordinator starts.
"""

from __future__ import annotations

import asyncio
import bisect
from collections import deque

from apiary.core.lanes import PRIVILEGED, LanePolicy, LaneScheduler
from apiary.core.records import MessageState, StoredMessage
from apiary.core.value import value
from apiary.errors import ValidationError

LANES = ("PRIVILEGED", "STANDARD", "BULK")
_BUFFERED = frozenset({MessageState.RECEIVED, MessageState.RETRYING})


@value
class Handout:
    """One message handed to the agent's stream."""

    message: StoredMessage
    attempt: int
    urgent: bool
    overflowed: bool = False
    """A PRIVILEGED message over the lane's rate limit, served in STANDARD's share."""
    direct: bool = False
    """A forwarded ACK handed over from memory (`Inbox.hand_over`): never stored, so it has
    no offset and nothing to record once handed out."""


class HandOver:
    """Notices handed to a streaming agent from memory, and whether its stream took them
    all (`done` resolves when the last one is taken)."""

    __slots__ = ("done", "pending")

    def __init__(self, count: int) -> None:
        self.pending = count
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def took(self) -> None:
        self.pending -= 1
        if not self.pending and not self.done.done():
            self.done.set_result(None)


class Inbox:
    def __init__(self, agent_id: str, capacity: int, scheduler: LaneScheduler) -> None:
        self.agent_id = agent_id
        self.capacity = capacity
        self._scheduler = scheduler
        self._pending: dict[str, deque[StoredMessage]] = {lane: deque() for lane in LANES}
        self._unacked: dict[str, StoredMessage] = {}
        # Finished messages still queued are dropped lazily when they reach the head, so
        # that finishing one costs O(1) however long the queue is.
        self._queued: set[str] = set()
        self._dropped: set[str] = set()
        self._occupied: set[str] = set()
        self._direct: deque[tuple[StoredMessage, HandOver]] = deque()
        self.arrived = asyncio.Event()
        self.session = 0
        """Incremented by every new stream; an older stream stops when it sees a newer one."""
        self.streams = 0
        """Streams reading this inbox right now (`Delivery.stream`)."""
        self.released = asyncio.Event()
        """Set when the last stream reading this inbox ends."""
        self.offline_since = 0.0
        """When the last stream reading this inbox ended (0: none has, since start)."""

    # ---- buffer accounting (RFC 13)

    @property
    def depth(self) -> int:
        """Messages admitted and not yet dequeued (READ) or finished."""
        return len(self._occupied)

    def has_room(self) -> bool:
        return len(self._occupied) < self.capacity

    def reserve(self, message_id: str) -> None:
        """Hold a buffer slot for a message being admitted (checked by has_room)."""
        self._occupied.add(message_id)

    def release(self, message_id: str) -> None:
        """Give back a slot reserved for a message that was not admitted after all."""
        self._occupied.discard(message_id)

    def _heads(self) -> None:
        for queue in self._pending.values():
            while queue and queue[0].message_id in self._dropped:
                self._dropped.discard(queue.popleft().message_id)

    def oldest_pending_at(self) -> float | None:
        self._heads()
        times = [q[0].created_at for q in self._pending.values() if q]
        return min(times) if times else None

    # ---- index maintenance

    def add(self, message: StoredMessage, *, occupies: bool) -> None:
        lane = message.lane if message.lane in self._pending else "STANDARD"
        queue = self._pending[lane]
        if queue and queue[-1].offset > message.offset:
            # Recovery may add out of order; keep each lane sorted by offset.
            items = list(queue)
            bisect.insort(items, message, key=lambda m: m.offset)
            self._pending[lane] = deque(items)
        else:
            queue.append(message)
        self._queued.add(message.message_id)
        self._dropped.discard(message.message_id)
        if occupies:
            self._occupied.add(message.message_id)
        self.arrived.set()

    def hand_over(self, messages: list[StoredMessage]) -> HandOver:
        """Queue notices for the agent's stream without storing them; they are taken before
        any stored message. Whoever hands them over waits on the result's `done` and takes
        back (`withdraw`) what the stream did not take in time."""
        handing = HandOver(len(messages))
        self._direct.extend((m, handing) for m in messages)
        self.arrived.set()
        return handing

    def withdraw(self, handing: HandOver) -> list[StoredMessage]:
        """Take back what is left of a hand-over (to store it instead)."""
        left = [m for m, h in self._direct if h is handing]
        if left:
            self._direct = deque(e for e in self._direct if e[1] is not handing)
        return left

    def dequeued(self, message_id: str) -> None:
        """The agent acknowledged READ (or beyond): the message leaves the buffer."""
        self._occupied.discard(message_id)

    def acknowledged(self, message_id: str) -> None:
        """Any acknowledgement: the message will not be redelivered."""
        self._unacked.pop(message_id, None)

    def finished(self, message_id: str) -> None:
        """A terminal state: forget the message entirely."""
        self._occupied.discard(message_id)
        self._unacked.pop(message_id, None)
        if message_id in self._queued:
            self._queued.discard(message_id)
            self._dropped.add(message_id)

    def update(self, message: StoredMessage) -> None:
        """Replace the indexed copy of an unacknowledged message (after a state change)."""
        if message.message_id in self._unacked:
            self._unacked[message.message_id] = message
        if message.state not in _BUFFERED:
            self._occupied.discard(message.message_id)

    # ---- streams (RFC 5.5)

    def open_session(self, resume_after: int) -> int:
        """Start a new stream: unacknowledged handouts go back for redelivery, except those
        at or below `resume_after`, which the consumer says it already holds."""
        self.session += 1
        returning = sorted(self._unacked.values(), key=lambda m: m.offset)
        self._unacked = {m.message_id: m for m in returning if m.offset <= resume_after}
        for message in returning:
            if message.offset > resume_after:
                self.add(message, occupies=message.message_id in self._occupied)
        for lane, queue in self._pending.items():
            live = [m for m in queue if m.message_id not in self._dropped]
            for m in live:
                if m.offset <= resume_after:
                    self._unacked[m.message_id] = m
                    self._queued.discard(m.message_id)
            self._pending[lane] = deque(m for m in live if m.offset > resume_after)
        self._dropped.clear()
        self.arrived.set()
        return self.session

    def supersede(self) -> None:
        """End the streams reading this inbox: a newer stream of the agent opened on another
        replica (cluster mode). Each sees a newer session at its next read, as when a newer
        stream opens here."""
        self.session += 1
        self.arrived.set()

    def awaiting(self) -> list[str]:
        """The ids of the messages queued for a stream or handed out and not acknowledged
        (notices handed over from memory aside): what a stream could hold."""
        dropped = self._dropped
        queued = [m.message_id for q in self._pending.values() for m in q]
        return [*(i for i in queued if i not in dropped), *self._unacked]

    def take(self, limit: int, now: float) -> list[Handout]:
        """Up to `limit` messages in lane order (weighted fair, PRIVILEGED urgent first)."""
        out: list[Handout] = []
        direct = self._direct
        while direct and len(out) < limit:
            message, handing = direct.popleft()
            handing.took()
            out.append(Handout(message, 1, False, direct=True))
        pending, dropped = self._pending, self._dropped
        self._heads()
        counts = {lane: len(q) for lane, q in pending.items()}
        ready = [lane for lane, count in counts.items() if count]
        if len(ready) == 1 and ready[0] != PRIVILEGED:
            # One plain lane has all there is: every pick would choose it. Taken as a batch,
            # the scheduler told once how many picks that was.
            self._take_plain(ready[0], limit, now, out)
            return out
        while len(out) < limit and any(counts.values()):
            choice = self._scheduler.pick_counted(counts, now)
            if choice is None:
                break
            queue = pending[choice.lane]
            message = queue.popleft()
            # Only this lane's head moved: drop what was finished behind it (as `_heads`).
            while queue and queue[0].message_id in dropped:
                dropped.discard(queue.popleft().message_id)
            counts[choice.lane] = len(queue)
            self._queued.discard(message.message_id)
            self._unacked[message.message_id] = message
            out.append(Handout(message, message.deliveries + 1, choice.urgent, choice.overflowed))
        return out

    def _take_plain(self, lane: str, limit: int, now: float, out: list[Handout]) -> None:
        """`take`'s picks from `lane`, the only lane with messages, up to `limit` in `out`."""
        queue, dropped = self._pending[lane], self._dropped
        queued, unacked = self._queued, self._unacked
        taken = 0
        while queue and len(out) < limit:
            message = queue.popleft()
            while queue and queue[0].message_id in dropped:
                dropped.discard(queue.popleft().message_id)
            queued.discard(message.message_id)
            unacked[message.message_id] = message
            out.append(Handout(message, message.deliveries + 1, False, False))
            taken += 1
        if taken:
            self._scheduler.pick_plain(lane, taken, now)

    @property
    def lanes(self) -> LaneScheduler:
        """The lane scheduler of this inbox (its PRIVILEGED tokens and urgent credit)."""
        return self._scheduler

    def has_pending(self) -> bool:
        self._heads()
        return bool(self._direct) or any(self._pending.values())


class Inboxes(dict[str, Inbox]):
    """Every agent's Inbox by agent id; `inboxes[agent_id]` makes a missing one, with the
    agent's buffer capacity (`get` does not). A dict, so that the lookup every admitted
    message and every acknowledgement makes costs no Python call once the inbox exists."""

    def __init__(self, capacity: int, lanes: LanePolicy) -> None:
        super().__init__()
        self._default = capacity
        self._lanes = lanes
        self._capacities: dict[str, int] = {}

    def __missing__(self, agent_id: str) -> Inbox:
        capacity = self._capacities.get(agent_id, self._default)
        inbox = self[agent_id] = Inbox(agent_id, capacity, LaneScheduler(self._lanes))
        return inbox

    def streaming(self, agent_id: str) -> bool:
        """Whether `agent_id` has a delivery stream open now."""
        inbox = self.get(agent_id)
        return inbox is not None and inbox.streams > 0

    def set_capacity(self, agent_id: str, capacity: int) -> int:
        """Per-agent buffer capacity (RFC 13: configurable per agent)."""
        if capacity < 1:
            raise ValidationError.for_field("capacity", f"must be at least 1, not {capacity}")
        self._capacities[agent_id] = capacity
        self[agent_id].capacity = capacity
        return capacity
