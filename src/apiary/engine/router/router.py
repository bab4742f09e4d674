"""Message routing (RFC 11-13, 21; DESIGN.md sections 4-5): the Router, the face of the
package to the rest of the engine.

A message is accepted only once it is durably recorded (RECEIVED) in its recipient's inbox.
The Router builds its parts and hands each call to the part that owns it: the admission
gates (`admission.py`) and a batch's durable write (`batches.py`), the message lifecycle
(`lifecycle.py`) over the live copies (`live.py`), credit control (`credit_control.py`),
deduplication (`dedup_gate.py`) and the answers to failures (`rejections.py`). Delivery to
agents is `delivery.py`; the deadline loop is `engine/deadlines.py`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from apiary.core.clock import Clock
from apiary.core.envelope import Ack, AckStage, Envelope
from apiary.core.envelope_ids import check_flow_id
from apiary.core.message_machine import Effect, MessageInput
from apiary.core.records import MessageState, StoredMessage
from apiary.engine.codec import EnvelopeCodec
from apiary.engine.dead_letters import DeadLetters
from apiary.engine.deadlines import Deadlines
from apiary.engine.eventlog import EventRecorder
from apiary.engine.notices import NoticeFactory
from apiary.engine.registry import Registry
from apiary.engine.router.ack_joins import AckJoin
from apiary.engine.router.admission import (
    SOFT_REJECTIONS,
    Admission,
    EndpointCheck,
    LocalEndpoint,
    Outbound,
    PreparedSend,
    SendOutcome,
)
from apiary.engine.router.batches import Batches
from apiary.engine.router.credit_control import CreditControl
from apiary.engine.router.dedup_gate import DedupGate
from apiary.engine.router.inbox import Inbox, Inboxes
from apiary.engine.router.lifecycle import MessageLifecycle
from apiary.engine.router.live import LiveMessages
from apiary.engine.router.rejections import Rejections
from apiary.engine.router.stats import RouterStats
from apiary.engine.settings import RouterSettings
from apiary.engine.tracing import Tracing
from apiary.engine.transfers import Transfers
from apiary.store.protocols import Store

_STORED_ACKS: Final = {
    MessageState[stage.name]: stage
    for stage in (AckStage.READ, AckStage.FULFILLED, AckStage.REJECTED, AckStage.FAILED,
                  AckStage.TIMED_OUT)
}  # fmt: skip
"""The ACK stage a message's stored state records (`Router.stored_ack`)."""


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
        *,
        tracing: Tracing | None = None,
    ) -> None:
        self.settings = settings = settings or RouterSettings()
        self.tracing = tracing
        """Tracing when the coordinator traces (docs/tracing.md): each admitted message keeps
        the trace context it continues (`live.traces`), which its delivery carries."""
        self.stats = stats = RouterStats()
        self.codec = codec
        self._clock = clock
        self._registry = registry
        self._messages = store.messages
        self._endpoints: dict[str, LocalEndpoint] = {}
        self._checks: dict[str, EndpointCheck] = {}
        self._joins: dict[str, AckJoin] = {}
        self._inboxes = Inboxes(settings.buffer_capacity, settings.lanes)
        self.deadlines = Deadlines(settings.ack_timeout_s, settings.max_age_s)
        self.live = LiveMessages(store.messages, self._inboxes, self.deadlines)
        """The live copies of unfinished messages, which delivery shares."""
        self.dedup = DedupGate(store.idempotency, store.messages, settings.dedup_window_s, events)
        self.dead_letters = DeadLetters(store.dlq, events, codec, clock)
        self._credits = CreditControl(settings, events)
        rejections = Rejections(
            settings, registry, events, notices, stats, self._endpoints, self.notify,
        )  # fmt: skip
        self.transfers = Transfers(registry, codec, events, rejections.nack_transfer)
        self.lifecycle = MessageLifecycle(
            store.messages, self.live, self.deadlines, codec, events, clock, stats,
            self._credits, self.dedup, self.dead_letters, self.transfers, rejections.nack,
            self._endpoints.keys(), self._joins,
        )  # fmt: skip
        admission = Admission(
            settings, registry, codec, events, self._inboxes, self._credits, self.dedup,
            self._endpoints, self.transfers, self.lifecycle,
        )  # fmt: skip
        self._batches = Batches(
            admission, self.lifecycle, rejections, store.messages, self._inboxes, self.live,
            self.dedup, self._credits, events, stats, clock, settings.hand_over_wait_s,
            tracing,
        )  # fmt: skip

    # ------------------------------------------------------------------ inboxes

    def inbox(self, agent_id: str) -> Inbox:
        return self._inboxes[agent_id]

    def inboxes(self) -> dict[str, Inbox]:
        return dict(self._inboxes)

    def queued(self) -> int:
        """Messages admitted and not yet read or finished, over every inbox (a tenant's
        `queued_messages` quota)."""
        return sum(inbox.depth for inbox in self._inboxes.values())

    def streaming(self, agent_id: str) -> bool:
        """Whether `agent_id` has a delivery stream open now."""
        return self._inboxes.streaming(agent_id)

    def set_capacity(self, agent_id: str, capacity: int) -> int:
        """Per-agent buffer capacity (RFC 13: configurable per agent)."""
        return self._inboxes.set_capacity(agent_id, capacity)

    def count_in_store(self, on: bool) -> None:
        """Cluster mode: buffer capacity and credits counted by the store in each admitting
        transaction, over every replica's messages, instead of in this replica's memory
        alone (docs/cluster.md, "Buffers and credits")."""
        self._credits.in_store = on
        self._batches.bounds_in_store = on

    @property
    def counts_in_store(self) -> bool:
        """Whether the store counts buffers, credits and the queued_messages quota in each
        admitting transaction (`count_in_store`)."""
        return self._batches.bounds_in_store

    def hold_queued(self, tenant: str, allowed: int | None) -> None:
        """Hold admissions to `tenant`'s `queued_messages` quota (None: unlimited) in the
        store, while it counts (`count_in_store`): every replica's messages admitted and
        not yet read, counted in the admitting transaction; outside cluster mode the
        quota is checked before the call, on this coordinator's memory (`server.quotas`)."""
        self._batches.queued_quota = None if allowed is None else (tenant, allowed)

    def credit_window(self, recipient: str) -> int | None:
        """The recipient's current credit window (None without credit-based flow control)."""
        return self._credits.window(recipient)

    def attach(
        self, endpoint_id: str, handler: LocalEndpoint, check: EndpointCheck | None = None
    ) -> None:
        """Make `endpoint_id` a coordinator-internal participant (the Scheduler): envelopes
        addressed to it, the ACKs of the messages it produced and the NACKs it is owed are
        handed to `handler` instead of an inbox. A handler that raises rejects the envelope
        with its error, as admission would. `check` is the part of the handler's decision
        that needs none of its state (the handler makes it too): a replica that relays the
        envelope to the cluster's leader makes it first (docs/cluster.md, "The leader")."""
        self._endpoints[endpoint_id] = handler
        if check is None:
            self._checks.pop(endpoint_id, None)
        else:
            self._checks[endpoint_id] = check

    def endpoint(self, endpoint_id: str) -> LocalEndpoint | None:
        """The handler attached as `endpoint_id`, if any: what the cluster's leader hands
        the envelopes other replicas relayed to (docs/cluster.md, "The leader")."""
        return self._endpoints.get(endpoint_id)

    def endpoint_check(self, endpoint_id: str) -> EndpointCheck | None:
        """The check attached with `endpoint_id`'s handler, if any."""
        return self._checks.get(endpoint_id)

    def join_acks(self, endpoint_id: str, join: AckJoin) -> None:
        """Let the attached endpoint `endpoint_id` commit writes of its own with the ACKs of
        its messages that a stream's frame brings (engine/router/ack_joins.py): `join` is
        asked for them before the router's commit of the frame."""
        self._joins[endpoint_id] = join

    async def last_sequence(self, producer_id: str) -> int:
        """The highest sequence number of `producer_id`'s stored messages (0: none), which a
        coordinator endpoint's numbering continues after at start-up (`NoticeFactory.resume`)."""
        return await self._messages.max_sequence(producer_id)

    def clock_now(self) -> float:
        return self._clock.now()

    def check_flow_id(self, field: str, value: str) -> str:
        """`value`, an id that becomes the correlation_id of a flow's messages, unchanged;
        a ValidationError naming `field` when strict correlation ids are on and it is not a
        UUIDv4 (`core.envelope_ids.check_flow_id`)."""
        settings = self.settings
        return check_flow_id(
            field, value, strict=settings.strict_correlation_ids, limits=settings.fields
        )

    # ------------------------------------------------------------------ sending

    async def send(self, item: Outbound) -> SendOutcome:
        """Admit one envelope; malformed input raises, soft rejections answer accepted=False."""
        (outcome,) = await self.send_many([item])
        if outcome.error is not None and outcome.error.code not in SOFT_REJECTIONS:
            raise outcome.error
        return outcome

    async def send_many(self, items: Sequence[Outbound]) -> list[SendOutcome]:
        """Admit many envelopes with one durable write; every member has its own outcome."""
        batches = self._batches
        return await batches.complete(await batches.prepare(items))

    async def prepare(self, items: Sequence[Outbound]) -> PreparedSend:
        """The first half of `send_many`: validate, apply ACKs, deduplicate and reserve buffer
        space, without the durable write. `complete` must follow (a stream pipelines the two:
        it prepares the next frame while this one's write commits)."""
        return await self._batches.prepare(items)

    async def complete(self, batch: PreparedSend) -> list[SendOutcome]:
        """The second half of `send_many`: one durable write for the admitted members, then
        their inboxes and events, then the rejections' NACKs."""
        return await self._batches.complete(batch)

    async def notify(self, recipient: str, env: Envelope) -> SendOutcome:
        """Deliver a coordinator notice (join/leave, heartbeat) to one agent."""
        (outcome,) = await self.send_many([Outbound(env, recipient)])
        return outcome

    # ------------------------------------------------------------------ the lifecycle

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
        return await self.lifecycle.apply(
            message, event, now, ack=ack, error_code=error_code, note=note
        )

    async def stored_ack(self, message_id: str) -> Ack | None:
        """The agent's ACK that the message as stored records: its stage by the message's
        state (READ, or an end: FULFILLED, REJECTED, FAILED, TIMED_OUT), its error code, and
        its note as the token's record cached it with the outcome; None when the message is
        not stored or records no such ACK. What an ACK committed and never applied by its
        producer's endpoint (the Scheduler) would have told it."""
        message = await self._messages.get(message_id)
        stage = None if message is None else _STORED_ACKS.get(message.state)
        if message is None or stage is None:
            return None
        record = await self.dedup.outcome_of(message)
        if record is None:
            return Ack(message_id, stage, message.error_code)
        return Ack(message_id, stage, record.error_code, record.result)

    def refresh(self, message: StoredMessage) -> None:
        """Keep the live copy of an unfinished message in step with the store."""
        self.live.refresh(message)

    async def fire_due(self) -> int:
        """Apply every deadline that has passed (ack timeouts, TTL expiry, maximum age,
        transfers)."""
        return await self.lifecycle.fire_due()

    async def flush_deliveries(self) -> None:
        """Store every hand-out count not yet written (at close)."""
        await self.live.flush_deliveries()

    async def recover(self) -> int:
        """Rebuild inboxes and re-arm deadlines from the store after a (re)start: TTLs and
        maximum ages as they were; no ACK deadline until the next hand-out starts a whole
        one (`LiveMessages.recover`)."""
        agent_ids = [agent.agent_id for agent in await self._registry.list()]
        return await self.live.recover(agent_ids, self._clock.now())
