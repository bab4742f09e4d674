"""A batch of envelopes sent together (RFC 5.4: one frame of a send stream, or a single
send): prepared, every member through the admission gates (`Admission`), then completed
with one durable write for the admitted members, their inboxes, events and idempotency
records, and the answers to the refused ones (`Rejections`).

Forwarded ACKs for producers that are streaming right now are handed to their streams from
memory instead of being stored (`_hand_over`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from dataclasses import replace
from functools import partial
from typing import Any, Final

from apiary.core.admission_bounds import CAPACITY
from apiary.core.clock import Clock
from apiary.core.envelope import MESSAGE_TYPE_NAMES, Envelope, MessageType
from apiary.core.quota import QUEUED_MESSAGES, quota_exceeded
from apiary.core.records import AdmissionBound, AdmissionWrites, StoredMessage
from apiary.engine.eventlog import EventRecorder
from apiary.engine.notices import COORDINATOR
from apiary.engine.router.admission import (
    ACK_FIRST,
    Admission,
    Admitted,
    Decision,
    Outbound,
    PreparedSend,
    SendOutcome,
    Wait,
    is_notice,
)
from apiary.engine.router.credit_control import CreditControl
from apiary.engine.router.dedup_gate import DedupGate
from apiary.engine.router.inbox import HandOver, Inbox, Inboxes
from apiary.engine.router.lifecycle import MessageLifecycle
from apiary.engine.router.live import LiveMessages
from apiary.engine.router.rejections import Rejections
from apiary.engine.router.stats import RouterStats
from apiary.engine.tracing import Tracing
from apiary.errors import (
    AlreadyCompletedError,
    BufferFullError,
    UnavailableError,
    ValidationError,
)
from apiary.store.errors import (
    AdmissionRefusal,
    BoundExceededError,
    DuplicateMessageError,
    RequeuedError,
    StoreError,
    StoreUnavailableError,
    TokenTakenError,
)
from apiary.store.protocols import MessageStore

IN_DOUBT_WAIT_S: Final = 2.0
"""How long a send whose write the database cut waits to learn whether it committed: it is
answered accepted when it did, `unavailable` when it did not or nobody can tell yet (safe to
retry: the idempotency record commits with the admission)."""
_ACK = MessageType.ACKNOWLEDGEMENT
_ACK_TYPE = int(MessageType.ACKNOWLEDGEMENT)
_NO_TOKEN: Final = AdmissionWrites()
"""The writes of a member admitted under no token, before its own are added."""
_Handing = list[tuple[Inbox, HandOver, list[tuple[int, StoredMessage]]]]
"""Forwarded ACKs handed to producers' streams: per producer, its inbox, the hand-over and
the members (index in the batch, record)."""


class Batches:
    def __init__(
        self, admission: Admission, lifecycle: MessageLifecycle, rejections: Rejections,
        messages: MessageStore, inboxes: Inboxes, live: LiveMessages, dedup: DedupGate,
        credits: CreditControl, events: EventRecorder, stats: RouterStats, clock: Clock,
        hand_over_wait_s: float, tracing: Tracing | None = None,
    ) -> None:  # fmt: skip
        self._admission = admission
        self._lifecycle = lifecycle
        self._rejections = rejections
        self._messages = messages
        self._inboxes = inboxes
        self._live = live
        self._dedup = dedup
        self._credits = credits
        self._events = events
        self._stats = stats
        self._clock = clock
        self._hand_over_wait_s = hand_over_wait_s
        self._tracing = tracing
        self._background: set[asyncio.Future[None]] = set()
        self.bounds_in_store = False
        """Cluster mode: each member's buffer capacity and credits are counted by the store
        in the admitting transaction (`AdmissionWrites.bound`), over every replica's
        messages; a member past one is refused buffer_full as on one coordinator."""
        self.queued_quota: tuple[str, int] | None = None
        """The tenant and its `queued_messages` quota, which the store holds each member to
        along with the bounds above (`bounds_in_store`): quota_exceeded past it."""

    async def prepare(self, items: Sequence[Outbound]) -> PreparedSend:
        """Every member through the admission gates, without the durable write; `complete`
        must follow (a stream pipelines the two: it prepares the next frame while this one's
        write commits).

        A frame's agent ACKs are applied together first (one batch of state changes), then
        the members whose gates wait on the store run concurrently, so that their store work
        shares group commits; then the rest, in order (answered from memory, most of them:
        a task or a coroutine each would cost more than their gates). Buffer reservations
        are synchronous, so the capacity check stays exact."""
        now = self._clock.now()
        admission = self._admission
        decided: list[Admitted | None] = [None] * len(items)
        acks, waiting = self._sorted(items)
        acked: dict[int, str] = {}
        first: dict[int, Decision] = {}
        if acks:
            acked, left = await self._acknowledge(items, acks, decided, now)
            if left:
                first = dict.fromkeys(left, ACK_FIRST)
                waiting = sorted(waiting + left)
        if waiting:
            done = await asyncio.gather(
                *(admission.admit(items[i], now, first.get(i)) for i in waiting)
            )
            for i, admitted in zip(waiting, done, strict=True):
                decided[i] = admitted
        outcomes: list[SendOutcome] = []
        admit: list[tuple[int, StoredMessage]] = []
        decide = admission.decide
        for i, item in enumerate(items):
            found = decided[i]
            if found is None:
                decision = decide(item, now, acked.get(i, ""))
                if isinstance(decision, Wait):
                    decision = await admission.admit(item, now, decision)
                found = decision
            outcome, record = found
            outcomes.append(outcome)
            if record is not None:
                admit.append((i, record))
        return PreparedSend(items, now, outcomes, admit)

    def _sorted(self, items: Sequence[Outbound]) -> tuple[list[int], list[int]]:
        """The indexes of the ACKs among `items`, and of the other members whose gates
        always wait on the store (idempotency tokens)."""
        acks: list[int] = []
        waiting: list[int] = []
        waits = self._dedup.waits
        for i, item in enumerate(items):
            env = item.envelope
            if env.message_type is _ACK:
                acks.append(i)
            elif waits(env):
                waiting.append(i)
        return acks, waiting

    async def _acknowledge(
        self, items: Sequence[Outbound], acks: list[int], decided: list[Admitted | None],
        now: float,
    ) -> tuple[dict[int, str], list[int]]:  # fmt: skip
        """The gates for a batch's ACKs (`acks`, by index) up to the agents' ACKs'
        application, which follows for them all together (`MessageLifecycle.
        acknowledge_frame`); what is decided goes into `decided` (the coordinator's own ACKs
        acknowledge nothing it received: their gates end here). Returns where each applied
        ACK is forwarded, by index (its gates go on from there), and the members the frame
        left to wait on the store one by one."""
        screened: list[tuple[int, Envelope]] = []
        for i in acks:
            decision = self._admission.decide(items[i], now)
            if isinstance(decision, Wait):
                screened.append((i, items[i].envelope))
            else:
                decided[i] = decision
        if not screened:
            return {}, []
        applied = await self._lifecycle.acknowledge_frame(screened, now)
        acked: dict[int, str] = {}
        left: list[int] = []
        for i, env in screened:
            result = applied.get(i)
            if result is None:
                left.append(i)
            elif isinstance(result, str):
                acked[i] = result
            else:
                decided[i] = SendOutcome.refusal(env.message_id, result), None
        return acked, left

    async def complete(self, batch: PreparedSend) -> list[SendOutcome]:
        """One durable write for the admitted members, then their inboxes and events, then
        the rejections' answers."""
        items, now, outcomes = batch.items, batch.now, batch.outcomes
        admit = batch.admit
        handing = self._hand_over(admit)
        if handing:
            handed = {index for _, _, pairs in handing for index, _ in pairs}
            admit = [pair for pair in admit if pair[0] not in handed]
        if admit:
            await self._persist(admit, items, outcomes, now)
        if handing:
            await self._handed_over(handing, items, outcomes, now)
        refused = [
            (item, outcome)
            for outcome, item in zip(outcomes, items, strict=True)
            if outcome.error is not None
        ]
        if refused:
            rejected = self._rejections.rejected
            await asyncio.gather(*(rejected(item, outcome) for item, outcome in refused))
        return outcomes

    async def _persist(
        self, admit: list[tuple[int, StoredMessage]], items: Sequence[Outbound],
        outcomes: list[SendOutcome], now: float,
    ) -> None:  # fmt: skip
        """One durable write for `admit` with each member's event and token record
        (`_writes`), then each member's outcome and inbox."""
        records = [r for _, r in admit]
        try:
            writes = await self._writes(admit, items, now)
        except BaseException:
            self._release(admit, items)  # nothing written yet
            raise
        admit_many = partial(self._messages.admit_many, records, writes)
        try:
            results: Sequence[StoredMessage | AdmissionRefusal] = await self._events.commit(
                [], admit_many
            )
        except StoreUnavailableError:
            # The database went away during the write: it may have committed or not.
            found = await self._in_doubt(records, IN_DOUBT_WAIT_S)
            if found is None:
                self._track(self._in_doubt_later(admit, items, now))
                raise
            settled = await self._settled(admit, items, found, now)
            if settled is None:
                raise
            for (index, _), outcome in zip(admit, settled, strict=True):
                outcomes[index] = outcome
            return
        except Exception:
            self._release(admit, items)  # refused by the database: nothing committed
            raise
        except BaseException:
            self._track(self._in_doubt_later(admit, items, now))  # (cancelled: it may commit)
            raise
        for (index, record), result in zip(admit, results, strict=True):
            outcomes[index] = self._admitted(items[index], record, result, now)

    async def _settled(
        self, admit: list[tuple[int, StoredMessage]], items: Sequence[Outbound],
        found: list[StoredMessage | None], now: float,
    ) -> list[SendOutcome] | None:  # fmt: skip
        """The outcome of each member of an admission in doubt, from what the store holds
        (`found`, by `_in_doubt`): accepted when its message is stored as it was sent (the
        admission committed). One that is not was refused by a transaction that committed,
        or rolled back with it: it is answered as a retry of it would be when another
        message holds its id (already used) or its token's record refuses it now
        (already_in_progress naming the attempt that holds the token, or duplicate_detected
        with the cached outcome: `DedupGate.settle`), else `unavailable` (its outcome is not
        known: a retry is answered rightly). None when every member is `unavailable` (the
        caller raises it; their reservations are released)."""
        settled: list[SendOutcome] = []
        known = False
        for (index, record), stored in zip(admit, found, strict=True):
            item = items[index]
            if stored is not None and stored.envelope == record.envelope:
                settled.append(self._admitted(item, record, stored, now))
                known = True
                continue
            if stored is not None:  # (`_admitted` releases its reservations)
                used = DuplicateMessageError(stored.message_id)
                settled.append(self._admitted(item, record, used, now))
                known = True
                continue
            self._free(item.envelope, record)
            outcome = await self._dedup.settle(item.envelope, now)
            if outcome is not None:
                known = True
            else:
                lost = UnavailableError(
                    f"the store was lost while admitting {record.message_id}, which it did "
                    "not admit; the outcome of its attempt is not known: send it again",
                    {"message_id": record.message_id},
                )
                outcome = SendOutcome.refusal(record.message_id, lost)
            settled.append(outcome)
        return settled if known else None

    async def _in_doubt(
        self, records: list[StoredMessage], wait_s: float
    ) -> list[StoredMessage | None] | None:
        """What the store holds under the ids of an admission whose outcome it could not
        tell: each member's id as stored (None: nothing is), or None when the store does not
        answer within `wait_s`."""
        deadline = asyncio.get_running_loop().time() + wait_s
        pause = 0.05
        while True:
            try:
                return [await self._messages.get(r.message_id) for r in records]
            except StoreError:
                if asyncio.get_running_loop().time() + pause > deadline:
                    return None
                await asyncio.sleep(pause)
                pause = min(pause * 2, 1.0)

    async def _in_doubt_later(
        self, admit: list[tuple[int, StoredMessage]], items: Sequence[Outbound], now: float
    ) -> None:
        """An admission still in doubt when its caller was answered `unavailable`: its
        reservations (buffer space, credit, the idempotency token: a retry is answered
        already_in_progress meanwhile) stay until the store tells whether it committed; then
        the members stored as sent are delivered as admitted, the others released."""
        found = await self._in_doubt([r for _, r in admit], float("inf"))
        assert found is not None
        for (index, record), stored in zip(admit, found, strict=True):
            if stored is not None and stored.envelope == record.envelope:
                self._admitted(items[index], record, stored, now)
            else:
                self._free(items[index].envelope, record)

    def _release(self, admit: list[tuple[int, StoredMessage]], items: Sequence[Outbound]) -> None:
        """Free what the admission of `admit` reserved: it did not commit."""
        for index, record in admit:
            self._free(items[index].envelope, record)

    def _free(self, env: Envelope, record: StoredMessage) -> None:
        self._inboxes[record.recipient].release(env.message_id)
        self._dedup.release(env.message_id)
        self._credits.release(record)

    def _track(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _writes(
        self, admit: list[tuple[int, StoredMessage]], items: Sequence[Outbound], now: float
    ) -> list[AdmissionWrites]:
        """What commits with each member's admission: its event (notices are logged by their
        causes: message.state, agent.joined, ...; a received event for each would repeat
        those and every heartbeat; a member whose producer's own event records its
        admission has none either: `Outbound.admission_logged`), its token's record
        (`DedupGate.record_for`; the records are read concurrently: shared reads) and its
        producer's own writes (`Outbound.stored_with`, their events after the member's)."""
        dedup, draft = self._dedup, self._events.draft
        held = [r for _, r in admit if dedup.holds(r.message_id)] if dedup.holding() else []
        tokens = await asyncio.gather(*(dedup.record_for(r, now) for r in held))
        by_id = {r.message_id: t for r, t in zip(held, tokens, strict=True)}
        writes: list[AdmissionWrites] = []
        for index, record in admit:
            item = items[index]
            env = item.envelope
            own = item.stored_with
            logged = is_notice(record) or (own is not None and item.admission_logged)
            event = () if logged else (draft(
                "message.received", env.producer_id, correlation_id=env.correlation_id,
                agent_id=record.recipient, message_id=env.message_id,
                message_type=MESSAGE_TYPE_NAMES[env.message_type], lane=record.lane,
            ),)  # fmt: skip
            token = by_id.get(record.message_id) or _NO_TOKEN
            if self.bounds_in_store and not is_notice(record):
                token = replace(token, bound=self._bound(record, item.remote))
            requeues = item.dead_letter if item.requeue else 0
            if own is None:
                writes.append(replace(token, events=event, requeues=requeues))
            else:
                writes.append(replace(
                    token, events=(*event, *own.events), task=own.task,
                    task_new=own.task_new, requeues=requeues,
                ))  # fmt: skip
        return writes

    def _bound(self, record: StoredMessage, remote: bool) -> AdmissionBound:
        """The limits the store holds `record`'s admission to (`bounds_in_store`); the
        quota only when it came from a client's call (`remote`), the calls one coordinator
        checks the quota on: what the coordinator produces (a Scheduler's dispatch) counts
        towards it and is never refused by it."""
        window, cap = self._credits.bound(record.recipient)
        queued = 0 if self.queued_quota is None or not remote else self.queued_quota[1]
        return AdmissionBound(self._inboxes[record.recipient].capacity, window, cap, queued)

    def _admitted(
        self, item: Outbound, record: StoredMessage,
        result: StoredMessage | AdmissionRefusal,
        now: float,
    ) -> SendOutcome:  # fmt: skip
        """The outcome of `item`, whose `record` the store answered with `result`."""
        env = item.envelope
        if isinstance(result, TokenTakenError):
            self._free(env, record)
            return self._dedup.taken(env, result.record, now)
        if isinstance(result, BoundExceededError):
            self._free(env, record)
            if result.limit == QUEUED_MESSAGES and self.queued_quota is not None:
                tenant = self.queued_quota[0]
                over = quota_exceeded(tenant, QUEUED_MESSAGES, result.count, result.bound)
                return SendOutcome.refusal(env.message_id, over)
            return SendOutcome.refusal(env.message_id, _bound_refusal(env, record, result))
        if isinstance(result, RequeuedError):
            self._free(env, record)
            entry = str(result.entry_id)
            done = AlreadyCompletedError(
                f"DLQ entry {entry} was requeued meanwhile", {"entry_id": entry}
            )
            return SendOutcome.refusal(env.message_id, done)
        if not isinstance(result, StoredMessage):
            self._free(env, record)
            # message_id is unique per attempt (RFC 11.3): reusing one is a malformed request,
            # not a duplicate of a logical operation; the first message stays as it was.
            error = ValidationError.for_field(
                "message_id", f"{env.message_id} was already used by another message"
            )
            return SendOutcome.refusal(env.message_id, error)
        stored = result
        self._dedup.release(stored.message_id)
        self._live.admitted(stored, occupies=not is_notice(stored))
        if self._tracing is not None and stored.message_id in self._live.copies:
            trace = item.trace or self._tracing.current()
            if trace is not None:
                self._live.traces[stored.message_id] = trace
        stats = self._stats
        stats.accepted[stored.recipient] += 1
        started = env.timestamp if 0 < env.timestamp <= now else now
        stats.timing(stats.enqueue_latency, stored.recipient).observe(now - started)
        return SendOutcome(env.message_id, True, stored=stored, reason=f"offset {stored.offset}")

    def _hand_over(self, admit: list[tuple[int, StoredMessage]]) -> _Handing:
        """Hand the batch's forwarded ACKs for producers that are streaming right now to
        their streams from memory: per producer, its inbox, the hand-over and its members.

        A forwarded ACK's lasting record is the acknowledged message's new state, stored
        before this; the ACK itself is a notice, FULFILLED once handed out. Storing it as a
        row of its own only to mark it delivered milliseconds later is most of what a
        streamed message costs the store, so it is stored only when its producer's stream
        does not take it within `hand_over_wait_s` (`_handed_over`). One the idempotency
        cache follows is stored as it is."""
        if self._hand_over_wait_s <= 0:
            return []
        groups: dict[str, list[tuple[int, StoredMessage]]] = {}
        inboxes, cached = self._inboxes, self._dedup.cached
        for pair in admit:
            record = pair[1]
            if (
                record.message_type == _ACK_TYPE
                and record.producer_id != COORDINATOR
                and not cached(record)
            ):
                inbox = inboxes.get(record.recipient)
                if inbox is not None and inbox.streams:
                    groups.setdefault(record.recipient, []).append(pair)
        handing: _Handing = []
        for recipient, pairs in groups.items():
            inbox = inboxes[recipient]
            handing.append((inbox, inbox.hand_over([r for _, r in pairs]), pairs))
        return handing

    async def _handed_over(
        self, handing: _Handing,
        items: Sequence[Outbound], outcomes: list[SendOutcome], now: float,
    ) -> None:  # fmt: skip
        """Wait (bounded) for the streams to take the hand-overs; store what is left, as any
        notice is stored, so that an accepted ACK is always either handed out or stored."""
        pending = [group.done for _, group, _ in handing if not group.done.done()]
        if pending:
            await asyncio.wait(pending, timeout=self._hand_over_wait_s)
        late: list[tuple[int, StoredMessage]] = []
        for inbox, group, pairs in handing:
            left = {m.message_id for m in inbox.withdraw(group)}
            for index, record in pairs:
                if record.message_id in left:
                    late.append((index, record))
                else:
                    self._stats.accepted[record.recipient] += 1
                    outcomes[index] = SendOutcome(
                        record.message_id, True, stored=record, reason="handed over"
                    )
        if late:
            await self._persist(late, items, outcomes, now)


def _bound_refusal(
    env: Envelope, record: StoredMessage, exc: BoundExceededError
) -> BufferFullError:
    """buffer_full for a member the store found past a limit, worded as on one coordinator
    (`Admission._reserve`, `CreditControl.consume`)."""
    recipient = record.recipient
    if exc.limit == CAPACITY:
        return BufferFullError(
            f"Inbound buffer capacity exceeded for agent={recipient} ({exc.count}/{exc.bound})",
            {"recipient": recipient, "capacity": str(exc.bound)},
        )
    return BufferFullError(
        f"no credit for {env.producer_id} at {recipient}: {exc.limit} ({exc.count}/{exc.bound})",
        {"recipient": recipient, "reason": "credit"},
    )
