"""The life of an admitted message (RFC 11, 21; DESIGN.md sections 4-5).

The pure MessageMachine (core/message_machine.py) decides every transition; this module
performs the effects: state writes, NACKs to the producer, DLQ entries, idempotency cache
updates (committed with the state change they follow: engine/router/dedup_gate.py
`progress_of`), credit release and events; a frame's ACKs commit with the writes of the
endpoint they would be forwarded to (engine/router/ack_joins.py: the Scheduler's task
transitions). Its inputs are agents' ACKs (one at a time, or a
frame's together), the deadlines (ACK timeouts, TTL expiry, maximum age) and delivery's
hand-outs and lost streams, which start and stop the ACK deadlines.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import replace
from functools import partial

from apiary.core.clock import Clock
from apiary.core.dedup import iso_utc
from apiary.core.envelope import ACK_STAGE_NAMES, Ack, AckStage, Envelope
from apiary.core.events import EventDraft
from apiary.core.message_machine import ACK_INPUTS, Effect, MessageInput, MessageMachine, Step
from apiary.core.records import (
    MessageState,
    StateChange,
    StoredMessage,
    TokenProgress,
    changed,
    merged,
    state_text,
)
from apiary.engine.codec import EnvelopeCodec
from apiary.engine.dead_letters import DeadLetters
from apiary.engine.deadlines import Deadlines
from apiary.engine.eventlog import EventRecorder
from apiary.engine.notices import COORDINATOR
from apiary.engine.router.ack_groups import AckGroups
from apiary.engine.router.ack_joins import AckedMessage, AckJoin, JoinedAcks, MessageMove
from apiary.engine.router.admission import is_notice
from apiary.engine.router.coalesce import Coalescer
from apiary.engine.router.credit_control import CreditControl
from apiary.engine.router.dedup_gate import DedupGate
from apiary.engine.router.live import LiveMessages
from apiary.engine.router.stats import RouterStats
from apiary.engine.transfers import Transfers
from apiary.errors import ApiaryError, PermissionDeniedError
from apiary.store.cluster import FencedError
from apiary.store.errors import StaleStateError, StoreUnavailableError
from apiary.store.protocols import MessageStore

Nack = Callable[[str, str, str, AckStage, str, str, str], Awaitable[None]]
"""Tells a producer its message failed: (producer, message_id, correlation_id, stage, code,
note, failed_stage), as `Rejections.nack`."""
Plan = tuple[Step, StateChange | None]
"""A machine step and the state change to store for it (None: nothing to write)."""
Write = tuple[StateChange, EventDraft | None, TokenProgress | None]
"""A state change, the event that commits with it and its token's progress (if any)."""

_STAGE_ORDER = {s.name: i for i, s in enumerate(AckStage)}
_ACKED_STATE = {stage: MessageState[stage.name] for stage in ACK_INPUTS}
"""The message state an ACK stage reports."""
_ACK_EVENTS = frozenset(ACK_INPUTS.values())
_END_STAGES = frozenset({AckStage.FULFILLED, AckStage.REJECTED, AckStage.FAILED})
STALE_TRIES = 4
"""How often a state change is decided again from the message as stored, when the store
refused it because the message changed meanwhile (cluster mode), before giving up."""
_AWAITED_EFFECTS = frozenset({Effect.NACK, Effect.DEAD_LETTER, Effect.UPDATE_IDEMPOTENCY})
"""The effects `_perform` carries out (they may wait on the store); `_settle` does
RELEASE_CREDIT itself, and the rest need nothing after the step."""


class MessageLifecycle:
    def __init__(
        self, messages: MessageStore, live: LiveMessages, deadlines: Deadlines,
        codec: EnvelopeCodec, events: EventRecorder, clock: Clock, stats: RouterStats,
        credits: CreditControl, dedup: DedupGate, dead_letters: DeadLetters,
        transfers: Transfers, nack: Nack, endpoints: Collection[str] = (),
        joins: Mapping[str, AckJoin] | None = None,
    ) -> None:  # fmt: skip
        self._messages = messages
        self._endpoints = endpoints
        """The coordinator's own endpoints (the router's live view): see `_forward_target`."""
        self._joins: Mapping[str, AckJoin] = {} if joins is None else joins
        """The endpoints whose writes commit with the ACKs of their messages (`_join`)."""
        self._live = live
        self._copies = live.copies
        self._frames = AckGroups(self._acknowledge_frame)
        self._deadlines = deadlines
        self._codec = codec
        self._events = events
        self._clock = clock
        self._stats = stats
        self._credits = credits
        self._dedup = dedup
        self._dead_letters = dead_letters
        self._transfers = transfers
        self._nack = nack
        self._changes: Coalescer[Write, StoredMessage] = Coalescer(self._write)
        self._locks: dict[str, asyncio.Lock] = {}
        self.conditional = False
        """Cluster mode: each state change is stored only while its message is still in
        the state the change was decided from (`StateChange.expected`): another replica may
        have changed it since (an ACK there, a deadline fired by the partition's owner). A
        change refused so is decided again from the message as stored (`_carry_out`)."""

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
        plan = self._plan(message, event, now, ack, error_code)
        return await self._carry_out(message, event, plan, now, ack, error_code, note)

    async def _carry_out(
        self, message: StoredMessage, event: MessageInput, plan: Plan | None, now: float,
        ack: Ack | None, error_code: str, note: str, tries: int = STALE_TRIES,
    ) -> tuple[Effect, ...]:  # fmt: skip
        """`plan` for `message`: its state change stored, then what follows the step. A
        change the store refuses because the message changed meanwhile (`conditional`) is
        decided again from the message as stored, `tries` times at most."""
        if plan is None:
            return ()
        step, change = plan
        code = ack.error_code if ack else error_code
        token = None
        if change is None:
            updated = message
            self._event_of(plan, message, message, event, code, now)
        else:
            after = changed(message, change)
            draft = self._event_of(plan, message, after, event, code, now)
            token = self._token_of(step, message, after, code, ack.note if ack else note, now)
            try:
                updated = await self._changes.submit((change, draft, token))
            except StaleStateError:
                if tries <= 1:
                    raise
                stored = await self._reread(message.message_id)
                if stored is None:
                    return ()
                plan = self._plan(stored, event, now, ack, error_code)
                return await self._carry_out(
                    stored, event, plan, now, ack, error_code, note, tries - 1
                )
        awaited, updated = self._settle(
            message, updated, event, step, now, ack, cached=token is not None
        )
        if awaited:
            await self._perform_all(awaited, message, updated, ack, error_code, note, now)
        return step.effects

    async def _reread(self, message_id: str) -> StoredMessage | None:
        """The message as stored now, its live copy brought in step with it (another replica
        changed it: a change decided from the copy was refused)."""
        stored = await self._messages.get(message_id)
        if stored is not None and message_id in self._copies:
            self._live.changed(stored, acked=bool(stored.acked_stage))
        return stored

    # ------------------------------------------------------------------ acknowledgements

    async def acknowledge(self, env: Envelope, now: float) -> str:
        """Apply an agent's ACK to the acknowledged message, under that message's lock;
        returns where the ACK is forwarded (`_forward_target`)."""
        ack = self._codec.decode_ack(env)
        message_id = ack.ack_for_message_id
        async with self._lock(message_id):
            original = self._copies.get(message_id) or await self._messages.get(message_id)
            if original is None:
                await self._events.record(
                    "message.ack_unknown", env.producer_id, correlation_id=env.correlation_id,
                    ack_for_message_id=message_id, stage=ack.ack_stage.name,
                )  # fmt: skip
                return COORDINATOR
            plan = self._judge(env, ack, original, now)
            if isinstance(plan, ApiaryError):
                raise plan
            event = ACK_INPUTS[ack.ack_stage]
            effects = await self._carry_out(original, event, plan, now, ack, "", "")
        self._locks.pop(message_id, None)
        return self._forward_target(original, effects, ack)

    async def acknowledge_frame(
        self, acks: Sequence[tuple[int, Envelope]], now: float
    ) -> dict[int, str | ApiaryError]:
        """`_acknowledge_frame`, with the frames of other streams that arrive while one is
        being applied applied together after it (engine/router/ack_groups.py)."""
        return await self._frames.acknowledge(acks, now)

    async def _acknowledge_frame(
        self, acks: Sequence[tuple[int, Envelope]], now: float
    ) -> dict[int, str | ApiaryError]:
        """Apply a frame's agent ACKs (`acks`: by the caller's key) together: one batch of
        state changes (one writer job) instead of a task, a lock wait and a store round trip
        per ACK. The changes are recorded without reading the messages back: the live
        copies, changed as the store changes them, are the stored rows.

        Returns, by key, what `acknowledge` would have: where the ACK is forwarded, or the
        error that refuses it. ACKs left out must go through `acknowledge`: those of
        messages not live (the store must be asked), of a message acknowledged twice in the
        frame or being changed elsewhere right now (they wait for its lock).
        """
        early: dict[int, str | ApiaryError] = {}
        # One lock, held until the frame's changes are applied, stands for every message the
        # frame claims: a deadline or another stream's ACK of one of them waits for it, as it
        # would for `acknowledge`. A fresh lock's acquire returns at once.
        frame_lock = asyncio.Lock()
        await frame_lock.acquire()
        planned = self._claim(acks, now, frame_lock, early)
        copies = self._copies
        try:
            changes: dict[str, StateChange] = {}
            """Each message's change; one stepped twice (a READ and the end after it) is
            written once, as its last step leaves it."""
            stored: dict[str, StoredMessage] = {}
            """Each message as the frame's last step of it leaves it."""
            steps: dict[int, StoredMessage] = {}
            """The message as each ACK's step leaves it, by the ACK's key."""
            for key, original, _, plan in planned:
                if plan is None:
                    continue
                message_id, change = original.message_id, plan[1]
                # The stored row is the live copy (held under the lock) with the changes.
                current = stored.get(message_id) or copies.get(message_id, original)
                if change is not None:
                    current = changed(current, change)
                    earlier = changes.get(message_id)
                    changes[message_id] = change if earlier is None else merged(earlier, change)
                stored[message_id] = steps[key] = current
            joined, taken = await self._join(planned, steps)
            logged = joined.logged if joined is not None else ()
            drafts = self._frame_events(planned, steps, logged, now)
            tokens, folded = self._frame_tokens(planned, steps, taken, now)
            try:
                await self._commit_frame(list(changes.values()), drafts, tokens, joined)
            except (StaleStateError, FencedError):
                # One of the messages changed on another replica, or the endpoint's writes
                # were refused (cluster mode: this replica's term as leader is over, it no
                # longer leads): nothing was stored, and the frame's ACKs go one at a time
                # (`acknowledge`, which joins nothing), each decided anew from the message
                # as stored when its change is refused.
                return early
            try:
                await self._settle_frame(planned, steps, folded, taken, now, early)
            finally:
                if joined is not None:
                    await joined.committed()
        finally:
            frame_lock.release()
            locks = self._locks
            for _, original, _, _ in planned:
                if locks.get(original.message_id) is frame_lock:
                    del locks[original.message_id]
        return early

    def _frame_events(
        self, planned: list[tuple[int, StoredMessage, Ack, Plan | None]],
        steps: Mapping[int, StoredMessage], logged: Collection[str], now: float,
    ) -> list[EventDraft]:  # fmt: skip
        """The events of a frame's steps that commit with its state changes (those that
        change no stored state are queued), but for the moves of the messages in `logged`,
        which the joined endpoint's events carry (engine/router/ack_joins.py)."""
        drafts: list[EventDraft] = []
        for key, original, ack, plan in planned:
            if plan is None or original.message_id in logged:
                continue
            after = steps[key]
            event = ACK_INPUTS[ack.ack_stage]
            draft = self._event_of(plan, original, after, event, ack.error_code, now)
            if draft is not None:
                drafts.append(draft)
        return drafts

    def _frame_tokens(
        self, planned: list[tuple[int, StoredMessage, Ack, Plan | None]],
        steps: Mapping[int, StoredMessage], taken: Collection[str], now: float,
    ) -> tuple[list[TokenProgress], set[str]]:  # fmt: skip
        """The token progress that commits with a frame's state changes, and the messages it
        covers (their UPDATE_IDEMPOTENCY is done by it), those of a joined endpoint's own
        messages among them (`taken`, whose records keep their outcomes:
        `DedupGate.kept_by_producer`) without any."""
        tokens: list[TokenProgress] = []
        folded: set[str] = set()
        kept = self._dedup.kept_by_producer
        for key, original, ack, plan in planned:
            if plan is None or plan[1] is None:
                continue
            message_id = original.message_id
            after = steps[key]
            if message_id in taken and kept(after):
                folded.add(message_id)
                continue
            token = self._token_of(plan[0], original, after, ack.error_code, ack.note, now)
            if token is not None:
                tokens.append(token)
                folded.add(message_id)
        return tokens, folded

    async def _commit_frame(
        self, changes: list[StateChange], drafts: list[EventDraft], tokens: list[TokenProgress],
        joined: JoinedAcks | None,
    ) -> None:  # fmt: skip
        """One commit of a frame's state changes, events and token progress, with the
        writes its endpoint joined (told when the commit fails)."""
        tasks = () if joined is None else joined.tasks
        if not (changes or tasks):
            return
        record = partial(self._messages.record, changes, tokens=tokens, tasks=tasks)
        if joined is not None:
            drafts = [*drafts, *joined.events]
        try:
            await self._events.commit(drafts, record)
        except BaseException as exc:
            if joined is not None:
                doubt = isinstance(exc, StoreUnavailableError | asyncio.CancelledError)
                await joined.failed(exc, doubt)
            raise

    async def _settle_frame(
        self, planned: list[tuple[int, StoredMessage, Ack, Plan | None]],
        steps: Mapping[int, StoredMessage], folded: set[str], taken: set[str], now: float,
        early: dict[int, str | ApiaryError],
    ) -> None:  # fmt: skip
        """What follows a frame's commit for each of its ACKs (`_settle`), and where each
        goes on to (into `early`): nowhere for those its endpoint took with the commit."""
        for key, original, ack, plan in planned:
            effects: tuple[Effect, ...] = ()
            if plan is not None:
                step = plan[0]
                updated = steps[key]
                event = ACK_INPUTS[ack.ack_stage]
                awaited, updated = self._settle(
                    original, updated, event, step, now, ack,
                    cached=original.message_id in folded,
                )  # fmt: skip
                if awaited:
                    await self._perform_all(awaited, original, updated, ack, "", "", now)
                effects = step.effects
            if original.message_id in taken:
                early[key] = COORDINATOR
            else:
                early[key] = self._forward_target(original, effects, ack)

    async def _join(
        self, planned: list[tuple[int, StoredMessage, Ack, Plan | None]],
        steps: Mapping[int, StoredMessage],
    ) -> tuple[JoinedAcks | None, set[str]]:  # fmt: skip
        """The writes that commit with a frame's ACKs from the endpoint whose messages they
        acknowledge and would be forwarded to (engine/router/ack_joins.py), given each ACK
        with its message's move (from `steps`, the message as each ACK's step leaves it), and
        the ids of the messages whose ACKs it took; none when the frame's ACKs go to more
        than one endpoint, or one of its steps NACKs (a NACK goes to its endpoint while the
        frame is settled, and the endpoint is held until that is done)."""
        joins = self._joins
        if not joins:
            return None, set()
        endpoint = ""
        acks: list[AckedMessage] = []
        ids: set[str] = set()
        for key, original, ack, plan in planned:
            if plan is None:
                continue
            step = plan[0]
            if Effect.NACK in step.effects:
                return None, set()
            producer = original.producer_id
            if producer in joins and Effect.FORWARD_ACK in step.effects and not step.late:
                if endpoint and producer != endpoint:
                    return None, set()
                endpoint = producer
                after = steps[key].state
                move = None
                if after is not original.state:
                    move = MessageMove(
                        original.message_id, state_text(original.state), state_text(after),
                        ACK_INPUTS[ack.ack_stage].value, ack.error_code,
                    )  # fmt: skip
                acks.append(AckedMessage(original.recipient, ack, move))
                ids.add(original.message_id)
        if not acks:
            return None, set()
        joined = await joins[endpoint](acks)
        return (None, set()) if joined is None else (joined, ids)

    def _forward_target(
        self, original: StoredMessage, effects: tuple[Effect, ...], ack: Ack
    ) -> str:
        """Where an ACK of `original` goes once applied: its producer, or the coordinator
        (which ends it) when the step forwards nothing or `original` was the coordinator's
        notice.

        A repeated end ACK of a message one of the coordinator's endpoints produced (the
        Scheduler's dispatch) reaches that endpoint even though the message had already
        ended: the first one's state change may have committed while its writer reported
        the store unavailable (a cut connection), so the endpoint never heard of it, and the
        agent's repeat is the only way it can. Endpoints apply an ACK once by their own
        state (the Scheduler answers a second one as a stale ACK)."""
        if is_notice(original):
            return COORDINATOR
        if Effect.FORWARD_ACK in effects:
            return original.producer_id
        if (
            Effect.LOG_LATE_ACK in effects
            and ack.ack_stage in _END_STAGES
            and original.producer_id in self._endpoints
        ):
            return original.producer_id
        return COORDINATOR

    def _claim(
        self, acks: Sequence[tuple[int, Envelope]], now: float, frame_lock: asyncio.Lock,
        early: dict[int, str | ApiaryError],
    ) -> list[tuple[int, StoredMessage, Ack, Plan | None]]:  # fmt: skip
        """The ACKs of `acks` that the frame applies, with the message each acknowledges
        (claimed under `frame_lock`) and the step to take; refusals go into `early`."""
        planned: list[tuple[int, StoredMessage, Ack, Plan | None]] = []
        claimed: dict[str, StoredMessage] = {}
        """The messages claimed so far, as the frame's steps of them leave them."""
        copies, locks = self._copies, self._locks
        for key, env in acks:
            try:
                ack = self._codec.decode_ack(env)
            except ApiaryError as exc:
                early[key] = exc
                continue
            target = ack.ack_for_message_id
            original = copies.get(target)
            if original is None:
                continue
            if target in locks:
                if locks[target] is not frame_lock:
                    continue  # being changed elsewhere: it waits for that (`acknowledge`)
                # Acknowledged again in this frame (a READ and the end after it): its step
                # goes from the message as the frame's earlier step of it leaves it.
                original = claimed[target]
            plan = self._judge(env, ack, original, now)
            if isinstance(plan, ApiaryError):
                early[key] = plan
                continue
            locks[target] = frame_lock
            planned.append((key, original, ack, plan))
            change = plan[1] if plan is not None else None
            claimed[target] = original if change is None else changed(original, change)
        return planned

    def _judge(
        self, env: Envelope, ack: Ack, original: StoredMessage, now: float
    ) -> Plan | PermissionDeniedError | None:
        """What `env`, carrying `ack`, does to `original`: the error when it may not
        acknowledge it (only its recipient may), else the step to take (`_plan`)."""
        if env.producer_id != original.recipient:
            return PermissionDeniedError(
                f"{env.producer_id} may not acknowledge {original.message_id}: "
                f"only its recipient {original.recipient} may",
                {"ack_for_message_id": original.message_id},
            )
        return self._plan(original, ACK_INPUTS[ack.ack_stage], now, ack, "")

    def _lock(self, message_id: str) -> asyncio.Lock:
        lock = self._locks.get(message_id)
        if lock is None:
            lock = self._locks[message_id] = asyncio.Lock()
        return lock

    # ------------------------------------------------------------------ steps

    def _plan(
        self, message: StoredMessage, event: MessageInput, now: float, ack: Ack | None,
        error_code: str,
    ) -> Plan | None:  # fmt: skip
        """The machine step for `message` and the state change to persist (None: nothing to
        write), or None when the machine ignores `event` in the message's state."""
        step = MessageMachine.step_if_allowed(message.state, event)
        if step is None:
            return None
        effects = step.effects
        if Effect.PERSIST not in effects:
            return step, None  # a hand-out or a lost stream: timers only (`_settle`)
        code = ack.error_code if ack else error_code
        stage = ACK_STAGE_NAMES[ack.ack_stage] if ack else ""
        further = stage and _STAGE_ORDER[stage] > _STAGE_ORDER.get(message.acked_stage, 0)
        message_id, deliveries = message.message_id, message.deliveries
        change = StateChange(
            message_id, step.state, now, code, stage if further else "",
            Effect.CANCEL_ACK_TIMER in effects, deliveries, message.last_delivered_at,
            state_text(message.state) if self.conditional else "",
        )  # fmt: skip
        self._live.writes_count(message_id, deliveries)
        return step, change

    def _token_of(
        self, step: Step, before: StoredMessage, after: StoredMessage, code: str, note: str,
        now: float,
    ) -> TokenProgress | None:  # fmt: skip
        """The progress of `after`'s token record that commits with the step's state change
        (None: the step updates no record)."""
        if Effect.UPDATE_IDEMPOTENCY not in step.effects:
            return None
        return self._dedup.progress_of(after, before.message_id, now, code, note)

    def _settle(
        self, message: StoredMessage, updated: StoredMessage, event: MessageInput, step: Step,
        now: float, ack: Ack | None, *, cached: bool = False,
    ) -> tuple[list[Effect], StoredMessage]:  # fmt: skip
        """What follows a step once its state change and event (if any) are stored: the live
        copy and the effects that need no store; returns those that may wait on it (in
        order, for `_perform_all`) with the message they apply to. `cached`: the token's
        record committed with the state change (UPDATE_IDEMPOTENCY is done). An ACK frame
        awaits nothing for most ACKs."""
        finished = self._live.changed(updated, acked=ack is not None)
        if finished:
            self._finished(updated)
        if step.late and ack is not None:
            # RFC 11.1 rule 4: a late ACK leaves the message's state alone but counts for the
            # idempotency cache at the stage it reports (the only late effect reading it).
            updated = replace(updated, state=_ACKED_STATE[ack.ack_stage])
        awaited: list[Effect] = []
        for effect in step.effects:
            if effect is Effect.RELEASE_CREDIT:
                self._credits.release(message)
            elif effect is Effect.CANCEL_ACK_TIMER:
                if not finished:  # (a finished message's deadlines are all gone)
                    self._deadlines.stop_ack(message.message_id)
            elif effect is Effect.START_ACK_TIMER:
                self._deadlines.start_ack(updated, now)
            elif effect in _AWAITED_EFFECTS and (
                effect is not Effect.UPDATE_IDEMPOTENCY
                or (not cached and self._dedup.cached(updated))
            ):
                awaited.append(effect)
        return awaited, updated

    def _finished(self, message: StoredMessage) -> None:
        """Observe the service time of a message that reached a terminal state: the
        agent's work on it (a notice has none), which adaptive credits follow."""
        if message.last_delivered_at and not is_notice(message):
            latency = message.updated_at - message.last_delivered_at
            self._stats.timing(self._stats.process_time, message.recipient).observe(latency)
            if self._credits.adaptive:
                self._credits.observe(message.recipient, latency)

    async def _write(self, writes: Sequence[Write]) -> Sequence[StoredMessage]:
        """Store state changes with their events, in one transaction (the Coalescer's batch:
        each write alone when the batch fails)."""
        drafts = [draft for _, draft, _ in writes if draft is not None]
        changes = [change for change, _, _ in writes]
        tokens = [token for _, _, token in writes if token is not None]
        return await self._events.commit(
            drafts, partial(self._messages.apply, changes, tokens=tokens)
        )

    def _event_of(
        self, plan: Plan, before: StoredMessage, after: StoredMessage, event: MessageInput,
        code: str, now: float,
    ) -> EventDraft | None:  # fmt: skip
        """The event of `plan`'s step: returned when it commits with the step's state change,
        appended by the recorder's flusher when the step changes no stored state."""
        step, change = plan
        draft = self._step_event(before, after, event, step.late, code, now)
        if change is not None:
            return draft
        self._events.queue(draft)
        return None

    def _step_event(
        self, before: StoredMessage, after: StoredMessage, event: MessageInput,
        late: bool, code: str, now: float,
    ) -> EventDraft | None:  # fmt: skip
        """The event of a step from `before` to `after` (None: the step is not one)."""
        if late:
            return self._events.draft(
                "message.late_ack", before.recipient, correlation_id=before.correlation_id,
                agent_id=before.recipient, message_id=before.message_id, state=before.state,
                input=event, decided_at=before.updated_at, ack_at=now,
            )  # fmt: skip
        if before.state is not after.state:
            return self._events.draft(
                "message.state", before.recipient, correlation_id=before.correlation_id,
                agent_id=before.recipient, message_id=before.message_id,
                **{"from": state_text(before.state), "to": state_text(after.state)},
                input=event, error_code=code,
            )  # fmt: skip
        if event in _ACK_EVENTS:
            # An ACK that moves no state (RECEIVED while RECEIVED, a repeated READ) is still
            # an event of the message's life (RFC 19): its stage is recorded.
            return self._events.draft(
                "message.acknowledged", before.recipient, correlation_id=before.correlation_id,
                agent_id=before.recipient, message_id=before.message_id,
                state=state_text(after.state), input=event,
                acked_stage=after.acked_stage or before.acked_stage,
            )  # fmt: skip
        return None

    async def _perform_all(
        self, effects: list[Effect], before: StoredMessage, after: StoredMessage,
        ack: Ack | None, error_code: str, note: str, now: float,
    ) -> None:  # fmt: skip
        """Carry out the effects `_settle` left, in order (they may wait on the store)."""
        code = ack.error_code if ack else error_code
        note = ack.note if ack else note
        for effect in effects:
            await self._perform(effect, before, after, code, note, now)

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
            await self._dead_letters.failed(after, code, note, now)
            self._stats.dead_lettered[code] += 1
        elif effect is Effect.UPDATE_IDEMPOTENCY:
            await self._dedup.progress(after, before.message_id, now, code, note)

    # ------------------------------------------------------------------ hand-outs, streams

    def deliver(self, messages: Sequence[StoredMessage], now: float) -> None:
        """DELIVER for `messages`, handed out to a stream for the first time at `now`: their
        ACK deadlines start. The step changes no state and writes nothing (its row has timer
        effects only), so a batch takes it here, without the store or the messages' locks."""
        states = {message.state for message in messages}
        starting = {state for state in states if _starts_ack(state, MessageInput.DELIVER)}
        if starting == states:  # (nearly always: a batch of RECEIVED messages)
            self._deadlines.start_acks(messages, now)
        elif starting:
            self._deadlines.start_acks([m for m in messages if m.state in starting], now)

    def streams_ended(self, agent_id: str, now: float) -> None:
        """The last stream of `agent_id` ended at `now`: STREAM_LOST for every message it
        held unacknowledged (their ACK deadlines stop: nobody can acknowledge them now), and
        each message waiting for the agent is watched for its maximum age. The step has
        timer effects only, so it is taken here, as `deliver`'s."""
        deadlines, live = self._deadlines, self._live
        for message in live.awaiting(agent_id):
            if deadlines.ack_due(message.message_id):
                step = MessageMachine.step_if_allowed(message.state, MessageInput.STREAM_LOST)
                if step is not None and Effect.CANCEL_ACK_TIMER in step.effects:
                    deadlines.stop_ack(message.message_id)
            live.watch(message)

    # ------------------------------------------------------------------ deadlines

    async def fire_due(self) -> int:
        """Apply every deadline that has passed (ack timeouts, TTL expiry, maximum age,
        transfers)."""
        await self._transfers.expire(self._clock.now())
        fired = 0
        for message_id in self._deadlines.due(self._clock.now()):
            if message_id not in self._copies:
                continue
            async with self._lock(message_id):
                # Read under the lock: an ACK that held it may have changed or ended it.
                message = self._copies.get(message_id)
                if message is not None and not message.state.terminal:
                    await self._expire(message, self._clock.now())
                    fired += 1
            self._locks.pop(message_id, None)  # as `acknowledge`: no lock kept per message
        return fired

    async def fire(
        self, message_id: str, event: MessageInput, now: float, code: str, *, away: str = ""
    ) -> bool:
        """Apply a deadline's `event` read from the store (cluster mode: the partition's
        owner runs the deadlines of messages any replica holds; engine/cluster/timers.py),
        to the message as the store holds it now, under its lock as `fire_due` does; False
        when it has finished meanwhile or the machine takes no such input in its state.
        `away`: for AGE_EXPIRE, how long its recipient has had no stream, as the note says."""
        async with self._lock(message_id):
            message = await self._messages.get(message_id)
            effects: tuple[Effect, ...] = ()
            if message is not None and not message.state.terminal:
                note = self._age_note(message, away) if event is MessageInput.AGE_EXPIRE else ""
                effects = await self.apply(message, event, now, error_code=code, note=note)
        self._locks.pop(message_id, None)
        return bool(effects)

    async def _expire(self, message: StoredMessage, now: float) -> None:
        """The input of the deadline of `message` that passed at `now`: its TTL, its ACK
        deadline, or its maximum age while it waits; with none passed (the ACK came, the
        stream was lost, the recipient connected), the deadline it has left is watched."""
        deadlines = self._deadlines
        ack_due = deadlines.ack_due(message.message_id)
        if 0 < message.expires_at <= now:
            await self.apply(message, MessageInput.TTL_EXPIRE, now, error_code="ttl_expired")
        elif 0 < ack_due <= now:
            await self.apply(message, MessageInput.ACK_TIMEOUT, now, error_code="ack_timeout")
        elif 0 < deadlines.age_limit(message) <= now and self._live.waiting(message):
            await self.apply(
                message, MessageInput.AGE_EXPIRE, now, error_code="agent_unavailable",
                note=self._age_note(message),
            )  # fmt: skip
        else:
            self._live.watch(message)

    def _age_note(self, message: StoredMessage, away: str = "") -> str:
        """Why `message` aged out, for its DLQ entry and its producer's NACK; `away`: how
        long its recipient has had no stream (else since its last one here ended)."""
        limit = f"not acknowledged within max_age_s ({self._deadlines.max_age_s:g} s)"
        if message.deliveries:
            times = "time" if message.deliveries == 1 else "times"
            held = (
                f"handed out {message.deliveries} {times}, last at "
                f"{iso_utc(message.last_delivered_at)}"
            )
        else:
            held = "never handed out"
        if not away:
            since = self._live.offline_since(message.recipient)
            away = f"since {iso_utc(since)}" if since else "since the coordinator started"
        return f"{limit}: {held}; {message.recipient} has had no live stream {away}"


def _starts_ack(state: MessageState, event: MessageInput) -> bool:
    """Whether the machine's row for (state, event) starts the ACK deadline."""
    step = MessageMachine.step_if_allowed(state, event)
    return step is not None and Effect.START_ACK_TIMER in step.effects
