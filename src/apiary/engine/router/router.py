"""Message routing (RFC 11-13, 21; DESIGN.md sections 4-5).

A message is accepted only once it is durably recorded (RECEIVED) in its recipient's inbox.
From there the pure MessageMachine (core/message_machine.py) decides every transition and
this module performs the effects: state writes, NACKs and forwarded ACKs to the producer,
DLQ entries, idempotency cache updates, credit release and events. Delivery to agents lives
in `engine/router/delivery.py`; the deadline loop in `engine/deadlines.py`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import TypeVar, cast

from apiary.core.addressing import resolve_recipient
from apiary.core.chunks import CHUNK_CONTENT_TYPE
from apiary.core.clock import Clock
from apiary.core.credit_adaptation import CreditAdapter
from apiary.core.credits import CreditLedger
from apiary.core.envelope import (
    ACK_STAGE_NAMES,
    MESSAGE_TYPE_NAMES,
    Ack,
    AckStage,
    Envelope,
    MessageType,
)
from apiary.core.envelope_ids import check_flow_id
from apiary.core.envelope_rules import (
    check_modality,
    content_type_base,
    ttl_deadline,
    validate_envelope,
)
from apiary.core.ids import is_uuid4
from apiary.core.lanes import LaneScheduler
from apiary.core.message_machine import (
    ACK_INPUTS,
    Effect,
    MessageInput,
    MessageMachine,
    Step,
)
from apiary.core.records import MessageState, StateChange, StoredMessage, changed, state_text
from apiary.core.signatures import SIGNATURE_KEY, verifies, with_origin
from apiary.engine.codec import EnvelopeCodec
from apiary.engine.dead_letters import DeadLetters
from apiary.engine.deadlines import Deadlines
from apiary.engine.eventlog import EventRecorder
from apiary.engine.notices import COORDINATOR, NoticeFactory
from apiary.engine.registry import Registry
from apiary.engine.router.admission import (
    DEAD_LETTER_CODES,
    SOFT_REJECTIONS,
    Outbound,
    PreparedSend,
    SendOutcome,
)
from apiary.engine.router.coalesce import Coalescer
from apiary.engine.router.dedup_gate import DedupGate
from apiary.engine.router.inbox import HandOver, Inbox
from apiary.engine.router.stats import RouterStats
from apiary.engine.settings import RouterSettings, adaptive_policy
from apiary.engine.transfers import Transfers
from apiary.errors import (
    ApiaryError,
    BufferFullError,
    NoRouteError,
    PermissionDeniedError,
    ValidationError,
)
from apiary.store.errors import DuplicateMessageError
from apiary.store.protocols import Store

NOTICE_TYPES = frozenset({MessageType.ACKNOWLEDGEMENT, MessageType.HEARTBEAT})
_ACK_TYPE = int(MessageType.ACKNOWLEDGEMENT)
DELIVERIES_WRITE_BEHIND_S = 1.0
"""How long a hand-out count may wait for its message's next state change to be written."""
_STAGE_ORDER = {s.name: i for i, s in enumerate(AckStage)}
_ACKED_STATE = {stage: MessageState[stage.name] for stage in ACK_INPUTS}
_ACK_EVENTS = frozenset(ACK_INPUTS.values())
_Handing = list[tuple[Inbox, HandOver, list[tuple[int, StoredMessage]]]]
"""Forwarded ACKs handed to producers' streams: per producer, its inbox, the hand-over and
the members (index in the batch, record)."""
"""The message state an ACK stage reports."""
_AWAITED_EFFECTS = frozenset({Effect.NACK, Effect.DEAD_LETTER, Effect.UPDATE_IDEMPOTENCY})
"""The effects `Router._perform` carries out (they may wait on the store); the router does
RELEASE_CREDIT itself, and the rest need nothing after the step."""


LocalEndpoint = Callable[[Envelope], Awaitable[None]]
"""A coordinator-internal participant's handler (see Router.attach)."""


def is_notice(message: StoredMessage) -> bool:
    """Notices need no acknowledgement and take no buffer space: ACKs, heartbeats and
    whatever the coordinator itself produced. They are FULFILLED when handed out."""
    return message.producer_id == COORDINATOR or message.message_type in NOTICE_TYPES


class Router:
    def __init__(
        self,
        store: Store,
        registry: Registry,
        events: EventRecorder,
        codec: EnvelopeCodec,
        clock: Clock,
        notices: NoticeFactory,
        settings: RouterSettings | None = None,
    ) -> None:
        self.settings = settings or RouterSettings()
        self.stats = RouterStats()
        self._store = store
        self._messages = store.messages
        self._registry = registry
        self._events = events
        self._codec = codec
        self.codec = codec
        self._clock = clock
        self._notices = notices
        self._inboxes: dict[str, Inbox] = {}
        self._capacities: dict[str, int] = {}
        self._credits: dict[str, CreditLedger] = {}
        self._adapters: dict[str, CreditAdapter] = {}
        self._adaptive = adaptive_policy(self.settings) if self.settings.credit_adaptive else None
        self._live: dict[str, StoredMessage] = {}
        self._unwritten: dict[str, tuple[int, float]] = {}
        """Hand-out counts not yet stored, by message id: (deliveries, last_delivered_at),
        oldest hand-out first."""
        self._endpoints: dict[str, LocalEndpoint] = {}
        self._changes: Coalescer[StateChange, StoredMessage] = Coalescer(self._messages.apply)
        self._locks: dict[str, asyncio.Lock] = {}
        self.deadlines = Deadlines()
        self.dedup = DedupGate(
            store.idempotency, store.messages, self.settings.dedup_window_s, events
        )
        self.dead_letters = DeadLetters(store.dlq, events, codec, clock)
        self.transfers = Transfers(registry, codec, events, self._nack_transfer)

    # ------------------------------------------------------------------ inboxes

    def inbox(self, agent_id: str) -> Inbox:
        found = self._inboxes.get(agent_id)
        if found is None:
            capacity = self._capacities.get(agent_id, self.settings.buffer_capacity)
            scheduler = LaneScheduler(self.settings.lanes)
            found = self._inboxes[agent_id] = Inbox(agent_id, capacity, scheduler)
        return found

    def inboxes(self) -> dict[str, Inbox]:
        return dict(self._inboxes)

    def streaming(self, agent_id: str) -> bool:
        """Whether `agent_id` has a delivery stream open now."""
        inbox = self._inboxes.get(agent_id)
        return inbox is not None and inbox.streams > 0

    def set_capacity(self, agent_id: str, capacity: int) -> int:
        """Per-agent buffer capacity (RFC 13: configurable per agent)."""
        if capacity < 1:
            raise ValidationError.for_field("capacity", f"must be at least 1, not {capacity}")
        self._capacities[agent_id] = capacity
        self.inbox(agent_id).capacity = capacity
        return capacity

    def attach(self, endpoint_id: str, handler: LocalEndpoint) -> None:
        """Make `endpoint_id` a coordinator-internal participant (the Scheduler): envelopes
        addressed to it, the ACKs of the messages it produced and the NACKs it is owed are
        handed to `handler` instead of an inbox. A handler that raises rejects the envelope
        with its error, as admission would."""
        self._endpoints[endpoint_id] = handler

    def clock_now(self) -> float:
        return self._clock.now()

    def finish_notice(self, message: StoredMessage) -> None:
        """A notice was handed out and recorded FULFILLED: forget it (what `_track` does for
        a terminal state; a notice has no service time to observe)."""
        message_id = message.message_id
        inbox = self.inbox(message.recipient)
        inbox.acknowledged(message_id)
        inbox.finished(message_id)
        self._live.pop(message_id, None)
        self.deadlines.cancel(message_id)

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

    # ------------------------------------------------------------------ sending

    async def send(self, item: Outbound) -> SendOutcome:
        """Admit one envelope; malformed input raises, soft rejections answer accepted=False."""
        (outcome,) = await self.send_many([item])
        if outcome.error is not None and outcome.error.code not in SOFT_REJECTIONS:
            raise outcome.error
        return outcome

    async def send_many(self, items: Sequence[Outbound]) -> list[SendOutcome]:
        """Admit many envelopes with one durable write; every member has its own outcome."""
        return await self.complete(await self.prepare(items))

    async def prepare(self, items: Sequence[Outbound]) -> PreparedSend:
        """The first half of `send_many`: validate, apply ACKs, deduplicate and reserve buffer
        space, without the durable write. `complete` must follow (a stream pipelines the two:
        it prepares the next frame while this one's write commits)."""
        now = self._clock.now()
        refused = self._unsigned(items) if self.settings.signing_required else {}
        if self.settings.acl.messages:
            refused.update(self._not_allowed(items, refused))
        # Members are prepared concurrently so that their store work (ACK state changes,
        # lookups) shares group commits; buffer reservations are synchronous, so the
        # capacity check stays exact.
        early = await self._acknowledge_frame(items, now, refused)
        early.update(refused)
        prepared = await _each(
            range(len(items)), lambda i: self._prepare(items[i], now, early.get(i)),
            lambda i: i not in early and _waits_on_store(items[i]),
            lambda i: self._prepare_now(items[i], now, early.get(i)),
        )  # fmt: skip
        outcomes = [outcome for outcome, _ in prepared]
        admit = [(i, record) for i, (_, record) in enumerate(prepared) if record]
        return PreparedSend(items, now, outcomes, admit)

    async def complete(self, batch: PreparedSend) -> list[SendOutcome]:
        """The second half of `send_many`: one durable write for the admitted members, then
        their inboxes and events, then the rejections' NACKs."""
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
        await asyncio.gather(
            *(self._rejected(item, outcome, now)
              for outcome, item in zip(outcomes, items, strict=True) if outcome.error is not None)
        )  # fmt: skip
        return outcomes

    async def _persist(
        self, admit: list[tuple[int, StoredMessage]], items: Sequence[Outbound],
        outcomes: list[SendOutcome], now: float,
    ) -> None:  # fmt: skip
        """One durable write for `admit`, then each member's outcome, inbox and event."""
        results = await self._messages.admit_many([r for _, r in admit])
        pairs = list(zip(admit, results, strict=True))
        tokens = [p for p in pairs if items[p[0][0]].envelope.idempotency_token]
        if tokens:
            # Their idempotency records are written concurrently (shared commits).
            done = await asyncio.gather(
                *(self._admitted(items[i], record, result, now)
                  for (i, record), result in tokens)
            )  # fmt: skip
            for ((index, _), _), outcome in zip(tokens, done, strict=True):
                outcomes[index] = outcome
        for (index, record), result in pairs:
            if not items[index].envelope.idempotency_token:
                outcomes[index] = self._admitted_now(items[index], record, result, now)

    def _hand_over(self, admit: list[tuple[int, StoredMessage]]) -> _Handing:
        """Hand the batch's forwarded ACKs for producers that are streaming right now to
        their streams from memory: per producer, its inbox, the hand-over and its members.

        A forwarded ACK's lasting record is the acknowledged message's new state, stored
        before this; the ACK itself is a notice, FULFILLED once handed out. Storing it as a
        row of its own only to mark it delivered milliseconds later is most of what a
        streamed message costs the store, so it is stored only when its producer's stream
        does not take it within `hand_over_wait_s` (`_handed_over`)."""
        if self.settings.hand_over_wait_s <= 0:
            return []
        groups: dict[str, list[tuple[int, StoredMessage]]] = {}
        for pair in admit:
            record = pair[1]
            if (
                record.message_type == _ACK_TYPE
                and record.producer_id != COORDINATOR
                and not record.idempotency_token
            ):
                inbox = self._inboxes.get(record.recipient)
                if inbox is not None and inbox.streams:
                    groups.setdefault(record.recipient, []).append(pair)
        handing: _Handing = []
        for recipient, pairs in groups.items():
            inbox = self._inboxes[recipient]
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
            await asyncio.wait(pending, timeout=self.settings.hand_over_wait_s)
        late: list[tuple[int, StoredMessage]] = []
        for inbox, group, pairs in handing:
            left = {m.message_id for m in inbox.withdraw(group)}
            for index, record in pairs:
                if record.message_id in left:
                    late.append((index, record))
                else:
                    self.stats.accepted[record.recipient] += 1
                    outcomes[index] = SendOutcome(
                        record.message_id, True, stored=record, reason="handed over"
                    )
        if late:
            await self._persist(late, items, outcomes, now)

    def _prepare_now(
        self, item: Outbound, now: float, acked: str | ApiaryError | None
    ) -> tuple[SendOutcome, StoredMessage | None] | None:
        """What `_prepare` answers, for a member it can answer from memory alone (most of a
        stream: no token, a fresh sequence number, or an ACK applied with its frame); None
        for the rest, which has not been touched then."""
        env = item.envelope
        if item.requeue or (acked is None and (env.idempotency_token or _agent_ack(env))):
            return None
        if content_type_base(env.content_type) == CHUNK_CONTENT_TYPE:
            return None
        try:
            if isinstance(acked, ApiaryError):
                raise acked
            if acked is None:
                self._validate(env, now)
            target = resolve_recipient(env, item.recipient, acked or "")
            if target == COORDINATOR:
                return SendOutcome(env.message_id, True, reason="acknowledged"), None
            if target in self._endpoints:
                return None  # a coordinator-internal participant: awaited on the slow path
            notice = self._routable(env, target)
            if not notice:
                if not self.dedup.fresh(env):
                    return None
                self._reserve_checked(target, env)
            return SendOutcome(env.message_id, True), self._record(
                env, target, now, notice, item.raw, item.lane, self._verified(item, item.raw)
            )
        except ApiaryError as exc:
            return SendOutcome(env.message_id, False, exc, f"{exc.code}: {exc.message}"), None

    def check_flow_id(self, field: str, value: str) -> str:
        """`value`, an id that becomes the correlation_id of a flow's messages, unchanged;
        a ValidationError naming `field` when strict correlation ids are on and it is not a
        UUIDv4 (`core.envelope_ids.check_flow_id`)."""
        return check_flow_id(field, value, strict=self.settings.strict_correlation_ids)

    def _validate(self, env: Envelope, now: float) -> None:
        """The message-types validation rules with this router's settings (raises)."""
        settings = self.settings
        validate_envelope(
            env, limits=settings.limits, now=now, hlc_required=settings.hlc_required,
            strict_correlation=settings.strict_correlation_ids,
        )  # fmt: skip

    async def _prepare(
        self, item: Outbound, now: float, acked: str | ApiaryError | None = None
    ) -> tuple[SendOutcome, StoredMessage | None]:
        """`acked`: the member's ACK was applied with its frame (`_acknowledge_frame`), which
        found this forwarding target or this error; None when it was not."""
        env = item.envelope
        try:
            if isinstance(acked, ApiaryError):
                raise acked
            acked_producer = acked or ""
            if acked is None:
                self._validate(env, now)
            if acked is None and _agent_ack(env):
                acked_producer = await self._on_ack(env, now)
            target = resolve_recipient(env, item.recipient, acked_producer)
            raw = item.raw
            if content_type_base(env.content_type) == CHUNK_CONTENT_TYPE:
                assembled = await self.transfers.receive(env, target, now)
                if assembled is None:
                    return SendOutcome(env.message_id, True, reason="chunk buffered"), None
                env, raw = assembled, b""
                self._validate(env, now)
            return await self._admissible(
                env, target, now, requeue=item.requeue, raw=raw, lane=item.lane,
                signature=self._verified(item, raw),
            )  # fmt: skip
        except ApiaryError as exc:
            return SendOutcome(env.message_id, False, exc, f"{exc.code}: {exc.message}"), None

    async def _admissible(
        self, env: Envelope, target: str, now: float, *, requeue: bool = False,
        raw: bytes = b"", lane: str = "", signature: bytes = b"",
    ) -> tuple[SendOutcome, StoredMessage | None]:  # fmt: skip
        if target == COORDINATOR:
            # ACKs of coordinator notices end here: nothing to forward.
            return SendOutcome(env.message_id, True, reason="acknowledged"), None
        endpoint = self._endpoints.get(target)
        if endpoint is not None:
            await endpoint(env)
            return SendOutcome(env.message_id, True, reason=f"handled by {target}"), None
        notice = self._routable(env, target)
        if not notice:
            duplicate = await self.dedup.check(env, now, requeue=requeue)
            if duplicate is not None:
                return duplicate, None
            self._reserve_checked(target, env)
        return SendOutcome(env.message_id, True), self._record(
            env, target, now, notice, raw, lane, signature
        )

    def _routable(self, env: Envelope, target: str) -> bool:
        """Raise unless `target` is registered and takes `env`'s content type; whether `env`
        is a notice (which needs neither deduplication nor buffer space)."""
        agent = self._registry.known(target)
        if agent is None:
            raise NoRouteError(
                f"no registered agent {target!r} to deliver {env.message_id} to",
                {"recipient": target, "message_id": env.message_id},
            )
        notice = env.producer_id == COORDINATOR or env.message_type in NOTICE_TYPES
        if not notice:
            check_modality(env.content_type, agent.descriptor.get("modalities_supported") or ())
        return notice

    def _reserve_checked(self, target: str, env: Envelope) -> None:
        """`_reserve` after deduplication passed: a refusal frees what that reserved."""
        try:
            self._reserve(target, env)
        except ApiaryError:
            self.dedup.abandon(env.message_id)
            raise

    def _verified(self, item: Outbound, raw: bytes) -> bytes:
        """What vouches for the message admitted from `item` as `raw`, kept with it for its
        recipient (`core.signatures.with_origin`). With signing on: the signature admission
        verified over `raw`; for a message assembled from chunks (`raw` is not the item's
        own bytes), the signature over the chunk that completed it, with that chunk; for a
        requeued dead letter, the signature over the envelope it was derived from, with that
        envelope, once the producer's keys verify it again. Nothing without signing and for
        the coordinator's own envelopes."""
        if not self.settings.signing_required or not item.signature:
            return b""
        if item.remote and item.raw:
            return item.signature if raw is item.raw else with_origin(item.signature, item.raw)
        producer = item.envelope.producer_id
        if item.requeue and self._registry.vouches(producer, item.origin, item.signature):
            return with_origin(item.signature, item.origin)
        return b""

    def _record(
        self, env: Envelope, target: str, now: float, notice: bool, raw: bytes, lane: str = "",
        signature: bytes = b"",
    ) -> StoredMessage:  # fmt: skip
        if not lane:
            producer = self._registry.known(env.producer_id)
            lane = _lane(producer.descriptor if producer else {})
        # Positional, in StoredMessage's field order (a record per admitted envelope):
        # message_id ... updated_at, offset, error_code, idempotency_token, sequence_number,
        # lane, ack_deadline, expires_at, deliveries, last_delivered_at, acked_stage, signature.
        return StoredMessage(
            env.message_id, target, env.producer_id, env.correlation_id, int(env.message_type),
            raw or self._codec.encode(env), MessageState.RECEIVED, now, now, 0, "",
            env.idempotency_token, env.sequence_number, lane,
            0.0 if notice else now + self.settings.ack_timeout_s,
            ttl_deadline(env, received_at=now)
            or (now + self.settings.notice_ttl_s if notice else 0.0),
            0, 0.0, "", signature,
        )  # fmt: skip

    def _reserve(self, target: str, env: Envelope) -> None:
        inbox = self.inbox(target)
        if not inbox.has_room():
            raise BufferFullError(
                f"Inbound buffer capacity exceeded for agent={target} "
                f"({inbox.depth}/{inbox.capacity})",
                {"recipient": target, "capacity": str(inbox.capacity)},
            )
        if self.settings.credit_window:
            ledger = self._ledger(target)
            decision = ledger.try_consume(env.producer_id)
            if not decision.granted:
                raise BufferFullError(
                    f"no credit for {env.producer_id} at {target}: {decision.reason}",
                    {"recipient": target, "reason": "credit"},
                )
        inbox.reserve(env.message_id)

    def _adapt_credits(self, recipient: str, latency_s: float) -> None:
        """Let the recipient's credit window follow its delivery latency (RFC 13.1)."""
        ledger = self._credits.get(recipient)
        adapter = self._adapters.get(recipient)
        if ledger is None or adapter is None:
            return
        change = adapter.observe(latency_s)
        if change is not None:
            ledger.resize(change.after)
            self._events.note(
                "credit.window_changed", COORDINATOR, agent_id=recipient,
                before=change.before, after=change.after, reason=change.reason,
                smoothed_latency_s=round(change.smoothed_latency_s, 6),
            )  # fmt: skip

    def credit_window(self, recipient: str) -> int | None:
        """The recipient's current credit window (None without credit-based flow control)."""
        ledger = self._credits.get(recipient)
        return None if ledger is None else ledger.window

    def _ledger(self, target: str) -> CreditLedger:
        ledger = self._credits.get(target)
        if ledger is None:
            cap = self.settings.per_producer_cap or None
            ledger = self._credits[target] = CreditLedger(self.settings.credit_window, cap)
            if self._adaptive is not None:
                self._adapters[target] = CreditAdapter(self.settings.credit_window, self._adaptive)
        return ledger

    async def _admitted(
        self,
        item: Outbound,
        record: StoredMessage,
        result: StoredMessage | DuplicateMessageError,
        now: float,
    ) -> SendOutcome:
        outcome = self._admitted_now(item, record, result, now)
        if outcome.stored is not None:
            await self.dedup.admitted(outcome.stored, now)
        return outcome

    def _admitted_now(
        self,
        item: Outbound,
        record: StoredMessage,
        result: StoredMessage | DuplicateMessageError,
        now: float,
    ) -> SendOutcome:
        """`_admitted` but for the idempotency cache, which only members with a token
        (the ones `complete` awaits) have anything to write to."""
        env = item.envelope
        inbox = self.inbox(record.recipient)
        if isinstance(result, DuplicateMessageError):
            inbox.release(env.message_id)
            self.dedup.abandon(env.message_id)
            self._release_credit(record)
            # message_id is unique per attempt (RFC 11.3): reusing one is a malformed request,
            # not a duplicate of a logical operation; the first message stays as it was.
            error = ValidationError.for_field(
                "message_id", f"{env.message_id} was already used by another message"
            )
            return SendOutcome(env.message_id, False, error, f"{error.code}: {error.message}")
        stored = result
        self._live[stored.message_id] = stored
        notice = is_notice(stored)
        inbox.add(stored, occupies=not notice)
        self.deadlines.watch(stored)
        self.stats.accepted[stored.recipient] += 1
        started = env.timestamp if 0 < env.timestamp <= now else now
        self.stats.timing(self.stats.enqueue_latency, stored.recipient).observe(now - started)
        if not notice:
            # Notices are logged by their causes (message.state, agent.joined, ...); a
            # received event for each would repeat those and every heartbeat.
            self._events.note(
                "message.received",
                env.producer_id,
                correlation_id=env.correlation_id,
                agent_id=stored.recipient,
                message_id=env.message_id,
                message_type=MESSAGE_TYPE_NAMES[env.message_type],
                offset=stored.offset,
                lane=stored.lane,
            )
        return SendOutcome(env.message_id, True, stored=stored, reason=f"offset {stored.offset}")

    async def _rejected(self, item: Outbound, outcome: SendOutcome, now: float) -> None:
        """Never silent: log it, NACK the producer, dead-letter what cannot succeed."""
        env = item.envelope
        error = outcome.error
        assert error is not None
        recipient = item.recipient or error.details.get("recipient", "")
        self.stats.enqueue_rejects[(recipient, error.code)] += 1
        await self._events.record(
            "message.rejected",
            env.producer_id,
            correlation_id=env.correlation_id,
            agent_id=recipient,
            message_id=env.message_id,
            error_code=error.code,
            reason=error.message,
        )
        if error.code == "duplicate_detected" and outcome.details:
            await self._notify_duplicate(env, outcome)
        elif env.message_type is not MessageType.ACKNOWLEDGEMENT:
            await self._nack(env.producer_id, env.message_id, env.correlation_id,
                             AckStage.REJECTED, error.code, error.message, "SENT")  # fmt: skip
        if error.code in DEAD_LETTER_CODES and env.producer_id != COORDINATOR:
            signature = item.signature if self.settings.signing_required else b""
            await self.dead_letters.reject(
                env, recipient, error, now, raw=item.raw, signature=signature
            )
            self.stats.dead_lettered[error.code] += 1

    async def _notify_duplicate(self, env: Envelope, outcome: SendOutcome) -> None:
        stage = AckStage[outcome.details.get("original_status", "FULFILLED")]
        ack = Ack(env.message_id, stage, "duplicate_detected", outcome.reason)
        # The ACK's error_code says DUPLICATE_DETECTED; the cached error travels beside it.
        extra = dict(outcome.details)
        extra["original_error_code"] = extra.pop("error_code", "")
        notice = self._notices.ack(ack, env.correlation_id, extra)
        await self._deliver_notice(env.producer_id, notice)

    async def _nack(
        self, producer: str, message_id: str, correlation_id: str, stage: AckStage,
        code: str, note: str, failed_stage: str,
    ) -> None:  # fmt: skip
        endpoint = self._endpoints.get(producer)
        if endpoint is None and (
            producer == COORDINATOR or await self._registry.find(producer) is None
        ):
            return
        self.stats.nacks[(producer, code)] += 1
        if self.settings.strict_correlation_ids and not is_uuid4(correlation_id):
            # The refused envelope's own correlation_id is what was wrong with it: the NACK
            # cannot echo it and carries one of its own (its ack_for_message_id links them).
            correlation_id = ""
        ack = Ack(message_id, stage, code, note)
        notice = self._notices.ack(ack, correlation_id, {"failed_stage": failed_stage})
        if endpoint is not None:
            await endpoint(notice)
        else:
            await self._deliver_notice(producer, notice)

    async def _nack_transfer(
        self, producer: str, transfer_id: str, correlation_id: str, error: ApiaryError
    ) -> None:
        await self._nack(producer, transfer_id, correlation_id, AckStage.FAILED, error.code,
                         error.message, "RECEIVED")  # fmt: skip

    async def _deliver_notice(self, recipient: str, env: Envelope) -> None:
        await self.send_many([Outbound(env, recipient)])

    async def notify(self, recipient: str, env: Envelope) -> SendOutcome:
        """Deliver a coordinator notice (join/leave, heartbeat) to one agent."""
        (outcome,) = await self.send_many([Outbound(env, recipient)])
        return outcome

    # ------------------------------------------------------------------ acknowledgements

    def _lock(self, message_id: str) -> asyncio.Lock:
        lock = self._locks.get(message_id)
        if lock is None:
            lock = self._locks[message_id] = asyncio.Lock()
        return lock

    async def _on_ack(self, env: Envelope, now: float) -> str:
        """Apply an agent's ACK to the acknowledged message; returns that message's producer
        (where the ACK is forwarded) or '' when the ACK must not be forwarded."""
        ack = self._codec.decode_ack(env)
        async with self._lock(ack.ack_for_message_id):
            original = self._live.get(ack.ack_for_message_id) or await self._messages.get(
                ack.ack_for_message_id
            )
            if original is None:
                await self._events.record(
                    "message.ack_unknown", env.producer_id, correlation_id=env.correlation_id,
                    ack_for_message_id=ack.ack_for_message_id, stage=ack.ack_stage.name,
                )  # fmt: skip
                return COORDINATOR
            if env.producer_id != original.recipient:
                raise PermissionDeniedError(
                    f"{env.producer_id} may not acknowledge {original.message_id}: "
                    f"only its recipient {original.recipient} may",
                    {"ack_for_message_id": original.message_id},
                )
            effects = await self.apply(original, ACK_INPUTS[ack.ack_stage], now, ack=ack)
        self._locks.pop(ack.ack_for_message_id, None)
        return _forward_target(original, effects)

    def _not_allowed(
        self, items: Sequence[Outbound], refused: Mapping[int, ApiaryError]
    ) -> dict[int, ApiaryError]:
        """With message ACLs (`core.acl`): by member index, the refusal of each agent's
        envelope its producer may not send, each logged as `acl.denied` (the envelopes let
        through are logged as `message.received`). A member without a recipient is left to
        the normal path, which refuses it with no_route. Envelopes to the coordinator's own
        endpoints (tool results, worktree control, task and room answers, swarm replies)
        are requests to those services, which authorize them themselves."""
        denied: dict[int, ApiaryError] = {}
        acl = self.settings.acl
        for i, item in enumerate(items):
            env = item.envelope
            if not item.remote or i in refused or env.message_type is MessageType.ACKNOWLEDGEMENT:
                continue
            try:
                target = resolve_recipient(env, item.recipient)
                if target in self._endpoints or target == COORDINATOR:
                    continue
                acl.check_message(env.producer_id, env.message_type, target)
            except PermissionDeniedError as exc:
                denied[i] = exc
                self._events.note(
                    "acl.denied", env.producer_id, correlation_id=env.correlation_id,
                    agent_id=target, kind="message", message_id=env.message_id,
                    message_type=env.message_type.name, recipient=target,
                    field=exc.details.get("field", ""),
                )  # fmt: skip
            except ApiaryError:
                continue
        return denied

    def _unsigned(self, items: Sequence[Outbound]) -> dict[int, ApiaryError]:
        """With signing on (RFC 6.2): by member index, the refusal of each envelope from an
        agent whose signature is missing or does not verify against the key its producer
        registered. Envelopes produced inside the coordinator carry none."""
        refused: dict[int, ApiaryError] = {}
        for i, item in enumerate(items):
            if not item.remote:
                continue
            env = item.envelope
            key = self._registry.public_key(env.producer_id)
            details = {"field": "signature", "message_id": env.message_id}
            if not item.signature:
                refused[i] = PermissionDeniedError(
                    f"{env.message_id} from {env.producer_id} is not signed: message signing"
                    f" is on ({SIGNATURE_KEY} metadata, or OutboundEnvelope.signature)",
                    details,
                )
            elif not key:
                refused[i] = PermissionDeniedError(
                    f"{env.producer_id} has no registered public key to verify {env.message_id}"
                    " by: register with one", details,
                )  # fmt: skip
            elif not verifies(key, item.raw, item.signature):
                refused[i] = PermissionDeniedError(
                    f"the signature of {env.message_id} does not verify against the key"
                    f" {env.producer_id} registered", details,
                )  # fmt: skip
        return refused

    async def _acknowledge_frame(
        self, items: Sequence[Outbound], now: float, refused: Mapping[int, ApiaryError]
    ) -> dict[int, str | ApiaryError]:
        """Apply a frame's agent ACKs together: one batch of state changes (one writer job)
        instead of a task, a lock wait and a store round trip per ACK.

        The changes are recorded without reading the messages back: the live copies,
        changed as the store changes them, are the stored rows.

        Returns, by member index, what `_on_ack` would have: where the ACK is forwarded, or
        the error that rejects it. Members left out take the general path: ACKs of messages
        not in memory (the store must be asked), of a message acknowledged twice in the frame
        or being changed elsewhere right now (they wait for its lock), and chunked ones.
        """
        early: dict[int, str | ApiaryError] = {}
        claimed: set[str] = set()
        # One lock, held until the frame's changes are applied, stands for every message the
        # frame claims: a deadline or another stream's ACK of one of them waits for it, as it
        # would for `_on_ack`. A fresh lock's acquire returns at once.
        frame_lock = asyncio.Lock()
        await frame_lock.acquire()
        planned: list[tuple[int, StoredMessage, Ack, tuple[Step, StateChange | None] | None]] = []
        for i, item in enumerate(items):
            env = item.envelope
            if not _agent_ack(env) or env.idempotency_token or i in refused:
                continue
            if content_type_base(env.content_type) == CHUNK_CONTENT_TYPE:
                continue
            try:
                self._validate(env, now)
                ack = self._codec.decode_ack(env)
            except ApiaryError as exc:
                early[i] = exc
                continue
            target = ack.ack_for_message_id
            original = self._live.get(target)
            if original is None or target in claimed or target in self._locks:
                continue
            if env.producer_id != original.recipient:
                early[i] = PermissionDeniedError(
                    f"{env.producer_id} may not acknowledge {original.message_id}: "
                    f"only its recipient {original.recipient} may",
                    {"ack_for_message_id": original.message_id},
                )
                continue
            claimed.add(target)
            self._locks[target] = frame_lock
            plan = self._plan(original, ACK_INPUTS[ack.ack_stage], now, ack, "")
            planned.append((i, original, ack, plan))
        try:
            changes = [plan[1] for _, _, _, plan in planned if plan and plan[1]]
            if changes:
                await self._messages.record(changes)
            for i, original, ack, plan in planned:
                effects: tuple[Effect, ...] = ()
                if plan is not None:
                    step, change = plan
                    # The stored row is the live copy (held under the lock) with the change.
                    current = self._live.get(original.message_id, original)
                    updated = current if change is None else changed(current, change)
                    event = ACK_INPUTS[ack.ack_stage]
                    awaited, updated = self._follow_now(
                        original, updated, event, step, now, ack, ""
                    )
                    if awaited:
                        await self._perform_all(awaited, original, updated, ack, "", "", now)
                    effects = step.effects
                early[i] = _forward_target(original, effects)
        finally:
            frame_lock.release()
            for target in claimed:
                if self._locks.get(target) is frame_lock:
                    del self._locks[target]
        return early

    async def apply(
        self,
        message: StoredMessage,
        event: MessageInput,
        now: float,
        *,
        ack: Ack | None = None,
        error_code: str = "",
        note: str = "",
    ) -> tuple[Effect, ...]:
        """Run one machine step for `message` and perform its effects."""
        planned = self._plan(message, event, now, ack, error_code)
        if planned is None:
            return ()
        step, change = planned
        updated = message if change is None else await self._changes.submit(change)
        await self._follow(message, updated, event, step, now, ack, error_code, note)
        return step.effects

    def _plan(
        self, message: StoredMessage, event: MessageInput, now: float, ack: Ack | None,
        error_code: str,
    ) -> tuple[Step, StateChange | None] | None:  # fmt: skip
        """The machine step for `message` and the state change to persist (None: nothing to
        write), or None when the machine ignores `event` in the message's state."""
        step = MessageMachine.step_if_allowed(message.state, event)
        if step is None:
            return None
        effects = step.effects
        if Effect.PERSIST not in effects and Effect.CANCEL_ACK_TIMER not in effects:
            return step, None
        code = ack.error_code if ack else error_code
        stage = ACK_STAGE_NAMES[ack.ack_stage] if ack else ""
        further = stage and _STAGE_ORDER[stage] > _STAGE_ORDER.get(message.acked_stage, 0)
        message_id, deliveries = message.message_id, message.deliveries
        change = StateChange(
            message_id, step.state, now, code, stage if further else "",
            Effect.CANCEL_ACK_TIMER in effects, deliveries, message.last_delivered_at,
        )  # fmt: skip
        unwritten = self._unwritten.get(message_id)
        if unwritten is not None and unwritten[0] <= deliveries:
            del self._unwritten[message_id]  # the change writes the count
        return step, change

    async def _follow(
        self, message: StoredMessage, updated: StoredMessage, event: MessageInput, step: Step,
        now: float, ack: Ack | None, error_code: str, note: str,
    ) -> None:  # fmt: skip
        """What follows a step once its state change (if any) is stored: the in-memory
        indexes, the event and the step's effects."""
        awaited, updated = self._follow_now(message, updated, event, step, now, ack, error_code)
        if awaited:
            await self._perform_all(awaited, message, updated, ack, error_code, note, now)

    async def _perform_all(
        self, effects: list[Effect], before: StoredMessage, after: StoredMessage,
        ack: Ack | None, error_code: str, note: str, now: float,
    ) -> None:  # fmt: skip
        """Carry out the effects `_follow_now` left, in order (they may wait on the store)."""
        code = ack.error_code if ack else error_code
        note = ack.note if ack else note
        for effect in effects:
            await self._perform(effect, before, after, code, note, now)

    def _follow_now(
        self, message: StoredMessage, updated: StoredMessage, event: MessageInput, step: Step,
        now: float, ack: Ack | None, error_code: str,
    ) -> tuple[list[Effect], StoredMessage]:  # fmt: skip
        """`_follow` but for the effects that may wait on the store, which it returns (in
        order, with the message they apply to): an ACK frame awaits nothing for most ACKs."""
        code = ack.error_code if ack else error_code
        self._track(updated, acked=ack is not None)
        self._record_step(message, updated, event, step.late, code, now)
        if step.late and ack is not None:
            # RFC 11.1 rule 4: a late ACK leaves the message's state alone but counts for the
            # idempotency cache at the stage it reports (the only late effect reading it).
            updated = replace(updated, state=_ACKED_STATE[ack.ack_stage])
        awaited: list[Effect] = []
        for effect in step.effects:
            if effect is Effect.RELEASE_CREDIT:
                self._release_credit(message)
            elif effect in _AWAITED_EFFECTS and (
                effect is not Effect.UPDATE_IDEMPOTENCY or updated.idempotency_token
            ):
                # (Without a token there is no cache entry to update.)
                awaited.append(effect)
        return awaited, updated

    def _track(self, message: StoredMessage, *, acked: bool) -> None:
        inbox = self.inbox(message.recipient)
        if acked:
            inbox.acknowledged(message.message_id)
        if message.state.terminal:
            inbox.finished(message.message_id)
            self._live.pop(message.message_id, None)
            self.deadlines.cancel(message.message_id)
            # Service time is the agent's work on a message; notices need none.
            if message.last_delivered_at and not is_notice(message):
                timing = self.stats.timing(self.stats.process_time, message.recipient)
                latency = message.updated_at - message.last_delivered_at
                timing.observe(latency)
                if self._adaptive is not None:
                    self._adapt_credits(message.recipient, latency)
        else:
            self._live[message.message_id] = message
            inbox.update(message)
            if message.state is MessageState.READ:
                inbox.dequeued(message.message_id)

    def _record_step(
        self, before: StoredMessage, after: StoredMessage, event: MessageInput,
        late: bool, code: str, now: float,
    ) -> None:  # fmt: skip
        if late:
            self._events.note(
                "message.late_ack", before.recipient, correlation_id=before.correlation_id,
                agent_id=before.recipient, message_id=before.message_id, state=before.state,
                input=event, decided_at=before.updated_at, ack_at=now,
            )  # fmt: skip
        elif before.state is not after.state:
            self._events.note(
                "message.state", before.recipient, correlation_id=before.correlation_id,
                agent_id=before.recipient, message_id=before.message_id,
                **{"from": state_text(before.state), "to": state_text(after.state)},
                input=event, error_code=code,
            )  # fmt: skip
        elif event in _ACK_EVENTS:
            # An ACK that moves no state (RECEIVED while RECEIVED, a repeated READ) is still
            # an event of the message's life (RFC 19): its stage is recorded.
            self._events.note(
                "message.acknowledged", before.recipient, correlation_id=before.correlation_id,
                agent_id=before.recipient, message_id=before.message_id,
                state=state_text(after.state), input=event,
                acked_stage=after.acked_stage or before.acked_stage,
            )  # fmt: skip

    async def _perform(
        self, effect: Effect, before: StoredMessage, after: StoredMessage,
        code: str, note: str, now: float,
    ) -> None:  # fmt: skip
        if effect is Effect.NACK:
            stage = AckStage.FAILED if after.state is MessageState.FAILED else AckStage.TIMED_OUT
            await self._nack(
                before.producer_id, before.message_id, before.correlation_id, stage, code,
                note or f"{code} in state {before.state}", before.acked_stage or "RECEIVED",
            )  # fmt: skip
        elif effect is Effect.DEAD_LETTER and before.producer_id != COORDINATOR:
            # As at admission: the coordinator's own notices (heartbeats, NACKs, join/leave)
            # that expire unread are not dead letters; an operator has nothing to triage.
            await self.dead_letters.failed(after, code, note, now)
            self.stats.dead_lettered[code] += 1
        elif effect is Effect.UPDATE_IDEMPOTENCY:
            await self.dedup.progress(after, before.message_id, now, code, note)

    def _release_credit(self, message: StoredMessage) -> None:
        ledger = self._credits.get(message.recipient)
        if ledger is not None and ledger.in_flight(message.producer_id) > 0:
            ledger.release(message.producer_id)

    # ------------------------------------------------------------------ deadlines

    async def fire_due(self) -> int:
        """Apply every deadline that has passed (ack timeouts, TTL expiry, transfers)."""
        await self.transfers.expire(self._clock.now())
        fired = 0
        for message_id in self.deadlines.due(self._clock.now()):
            message = self._live.get(message_id)
            if message is None or message.state.terminal:
                continue
            now = self._clock.now()
            async with self._lock(message_id):
                if message.expires_at and message.expires_at <= now:
                    await self.apply(
                        message, MessageInput.TTL_EXPIRE, now, error_code="ttl_expired"
                    )
                elif message.ack_deadline and message.ack_deadline <= now:
                    await self.apply(
                        message, MessageInput.ACK_TIMEOUT, now, error_code="ack_timeout"
                    )
                else:
                    self.deadlines.watch(message)
            fired += 1
        return fired

    # ------------------------------------------------------------------ recovery

    async def recover(self) -> int:
        """Rebuild inboxes and re-arm deadlines from the store after a (re)start."""
        recovered = 0
        unfinished = frozenset(s for s in MessageState if not s.terminal)
        for agent in await self._registry.list():
            after = 0
            while True:
                page = await self._messages.inbox(agent.agent_id, after, 1000, unfinished)
                for message in page:
                    self._live[message.message_id] = message
                    occupies = not is_notice(message) and message.state in (
                        MessageState.RECEIVED, MessageState.RETRYING,
                    )  # fmt: skip
                    self.inbox(agent.agent_id).add(message, occupies=occupies)
                    self.deadlines.watch(message)
                    recovered += 1
                if len(page) < 1000:
                    break
                after = page[-1].offset
        return recovered

    def current(self, message: StoredMessage) -> StoredMessage:
        """The live copy of `message` (what the store holds now), or `message` itself once
        it is no longer live."""
        return self._live.get(message.message_id, message)

    def refresh(self, message: StoredMessage) -> None:
        """Keep the live copy of an unfinished message in step with the store."""
        if message.message_id in self._live:
            self._live[message.message_id] = message


T = TypeVar("T")
R = TypeVar("R")


def _waits_on_store(item: Outbound) -> bool:
    """Whether handling `item` does store I/O worth overlapping: ACKs change the acknowledged
    message, and tokens read and write the idempotency cache."""
    env = item.envelope
    return env.message_type is MessageType.ACKNOWLEDGEMENT or bool(env.idempotency_token)


async def _each(
    items: Sequence[T],
    fn: Callable[[T], Awaitable[R]],
    overlap: Callable[[T], bool],
    quick: Callable[[T], R | None],
) -> list[R]:
    """`fn` over `items`, in order: concurrently where `overlap` says the work waits on the
    store (so it shares group commits), directly otherwise (a task per item costs more than
    the work), and there `quick`'s answer instead where it has one (a coroutine per item
    costs more than most of them need: `quick` answers from memory or says None)."""
    results: list[R | None] = [None] * len(items)
    waiting = [i for i, item in enumerate(items) if overlap(item)]
    if waiting:
        for i, result in zip(
            waiting, await asyncio.gather(*(fn(items[i]) for i in waiting)), strict=True
        ):
            results[i] = result
    for i, item in enumerate(items):
        if not overlap(item):
            found = quick(item)
            results[i] = found if found is not None else await fn(item)
    return cast(list[R], results)


def _agent_ack(env: Envelope) -> bool:
    """An agent's ACK, which moves the message it acknowledges. The coordinator's own ACKs
    (NACKs, duplicate notices) acknowledge nothing it received."""
    return env.message_type is MessageType.ACKNOWLEDGEMENT and env.producer_id != COORDINATOR


def _forward_target(original: StoredMessage, effects: tuple[Effect, ...]) -> str:
    """Where an ACK of `original` goes once applied: its producer, or the coordinator (which
    ends it) when the step forwards nothing or `original` was the coordinator's notice."""
    if Effect.FORWARD_ACK not in effects or is_notice(original):
        return COORDINATOR
    return original.producer_id


def _lane(descriptor: object) -> str:
    value = descriptor.get("communication_class", "") if isinstance(descriptor, dict) else ""
    return value if value in ("PRIVILEGED", "STANDARD", "BULK") else "STANDARD"
