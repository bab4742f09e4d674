"""Deduplication at admission (RFC 11.2): by idempotency token when present, else by
(producer_id, sequence_number); and the cache updates that follow a message's fate.

RFC 19 (cache decisions are logged, linked to the original attempt): every decision on a
token, and every decision by sequence number other than "new", is an `idempotency.decision`
event naming the arrival and the original attempt; every change of a token's cached outcome
is an `idempotency.cached` event. Rejections are also logged by the router.

A token is reserved in memory while it is admitted on this replica (a second attempt then is
answered already_in_progress without asking the store); across replicas the store decides:
the admission's record is written only over the record its check found (or none), in the
admitting transaction, so that of two attempts of one token admitted at once on two
replicas one is admitted and the other answered from the first's record (`taken`).

A token's record follows its attempts' fate in the transaction that stores their state
changes (`progress_of`, applied by the message store): read and written there, so that the
record, the state it records and the `idempotency.cached` event commit together, and no
other write of the token comes between the record's read and its write.

The tokens of producers that keep them unique by records of their own (engine/notices.py
`SELF_KEPT_TOKENS`: the Scheduler's `task:<id>:<attempt>`, whose attempt the task record
counts) are claimed without a record, a reservation or a decision event: the producer's own
event of the admission names the token (`task.dispatched`). Their record is started only by
an outcome that no write of the producer's records (an end ACK the Scheduler did not join:
the outcome's note, the task's result, must outlive a crash before the Scheduler hears of
it, engine/router/router.py `stored_ack`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from apiary.core import dedup
from apiary.core.envelope import Envelope
from apiary.core.idempotency import is_within_window
from apiary.core.records import AdmissionWrites, IdempotencyRecord, StoredMessage, TokenProgress
from apiary.engine.eventlog import EventRecorder
from apiary.engine.notices import SELF_KEPT_TOKENS
from apiary.engine.router.admission import SendOutcome
from apiary.errors import AlreadyInProgressError, DuplicateDetectedError
from apiary.store.errors import StoreError
from apiary.store.protocols import IdempotencyStore, MessageStore


@dataclass(frozen=True, slots=True)
class _Plan:
    token: str
    record: IdempotencyRecord | None
    """The record a RETRY continues; None for a NEW operation."""
    requeue: bool = False
    found: IdempotencyRecord | None = None
    """The record as `check` found it (None: none): the store writes the admission's own
    only over that one (`AdmissionWrites.idempotency_found`)."""


_REFUSED = frozenset({dedup.DedupKind.DUPLICATE, dedup.DedupKind.IN_PROGRESS})


def _refusal(env: Envelope, record: IdempotencyRecord, kind: dedup.DedupKind) -> SendOutcome:
    """The refusal of `env` under `record`, its token's: duplicate_detected with the cached
    outcome (`kind` DUPLICATE), else already_in_progress naming the current attempt."""
    token = env.idempotency_token
    if kind is dedup.DedupKind.DUPLICATE:
        payload = {k: str(v) for k, v in dedup.duplicate_payload(record).items()}
        error = DuplicateDetectedError(
            f"token {token} already completed as {record.original_message_id} "
            f"({record.status}) at {payload.get('cached_at', '')}",
            payload,
        )
        return SendOutcome.refusal(env.message_id, error, payload)
    running = AlreadyInProgressError(
        f"token {token} is in progress as {record.current_message_id} ({record.status})",
        {"original_message_id": record.current_message_id, "status": record.status},
    )
    return SendOutcome.refusal(env.message_id, running, {})


def cache_key(producer_id: str, token: str) -> str:
    """The cache key of a token: scoped by its producer, so that no other producer can read
    a cached outcome or block an operation by reusing the token (RFC 23: no poisoning)."""
    return f"{producer_id}\x1f{token}"


class DedupGate:
    def __init__(
        self,
        cache: IdempotencyStore,
        messages: MessageStore,
        window_s: float,
        events: EventRecorder,
    ) -> None:
        self._cache = cache
        self._messages = messages
        self._window = window_s
        self._events = events
        self._reserved: set[str] = set()
        # Per producer, the highest sequence number known to be in the store or admitted
        # since: a number above it cannot be a duplicate (sequence numbers are monotonic per
        # producer), so only numbers at or below it need a lookup.
        self._high: dict[str, int] = {}
        self._plans: dict[str, _Plan] = {}

    async def check(
        self, env: Envelope, now: float, *, requeue: bool = False
    ) -> SendOutcome | None:
        """None when `env` may be admitted (the token is then reserved until `admitted`).

        A `requeue` (an operator's, from the DLQ) is always admitted; it joins its token's
        record as a new attempt, so that its outcome is what later retries are answered.
        """
        token = env.idempotency_token
        if requeue:
            await self._requeue(env, cache_key(env.producer_id, token) if token else "")
            return None
        if token:
            return await self._by_token(env, cache_key(env.producer_id, token), now)
        if env.sequence_number > 0:
            return await self._by_sequence(env, now)
        return None

    def waits(self, env: Envelope) -> bool:
        """Whether `check` of `env` always asks the store (it carries an idempotency token):
        worth overlapping with the store work of other envelopes."""
        return bool(env.idempotency_token)

    def cached(self, message: StoredMessage) -> bool:
        """Whether the cache follows `message`'s fate by its token (`progress` has a record
        to update; a notice with one keeps its stored row, see `Enqueuer`): a token its
        producer keeps unique (`kept_by_producer`) only by an outcome."""
        if not message.idempotency_token:
            return False
        return message.producer_id not in SELF_KEPT_TOKENS or message.state in dedup.OUTCOMES

    async def outcome_of(self, message: StoredMessage) -> IdempotencyRecord | None:
        """`message`'s token's record when it caches `message`'s own outcome (its error
        code and result: the terminal ACK's note); None otherwise."""
        if not message.idempotency_token:
            return None
        record = await self._cache.get(cache_key(message.producer_id, message.idempotency_token))
        if record is None or record.outcome_at <= 0:
            return None
        return record if record.original_message_id == message.message_id else None

    def holding(self) -> bool:
        """Whether any admission awaits `admitted` (a token reserved by `check`)."""
        return bool(self._plans)

    def holds(self, message_id: str) -> bool:
        """Whether the admission of `message_id` awaits `admitted` to record its token."""
        return message_id in self._plans

    def fresh(self, env: Envelope) -> bool:
        """Whether `check` would admit `env` without asking the store, counting it in if so:
        no token, and no sequence number or one above the producer's known high-water mark
        (the common case of a stream). False means `check` must decide."""
        if env.idempotency_token:
            return False
        number = env.sequence_number
        if number <= 0:
            return True
        high = self._high.get(env.producer_id)
        if high is None or number <= high:
            return False
        self._high[env.producer_id] = number
        return True

    def claim(self, env: Envelope) -> bool:
        """Reserve `env`'s token for a NEW operation without asking the store: for a token
        its producer vouches is new (`Outbound.new_token`); one its producer keeps unique
        itself (`SELF_KEPT_TOKENS`) with nothing reserved and no record started. False
        (nothing reserved) when it has no token or the token is being admitted right now:
        `check` decides then."""
        token = env.idempotency_token
        if not token:
            return False
        if env.producer_id in SELF_KEPT_TOKENS:
            return True  # (no record, nothing reserved: see the module's docstring)
        key = cache_key(env.producer_id, token)
        if key in self._reserved:
            return False
        self._events.note(
            "idempotency.decision", env.producer_id, correlation_id=env.correlation_id,
            message_id=env.message_id, decision=dedup.DedupKind.NEW,
            original_message_id=env.message_id, token=token,
        )  # fmt: skip
        self._reserved.add(key)
        self._plans[env.message_id] = _Plan(key, None)
        return True

    async def _log(self, env: Envelope, decision: str, original: str, **details: str) -> None:
        await self._events.record(
            "idempotency.decision", env.producer_id, correlation_id=env.correlation_id,
            message_id=env.message_id, decision=decision, original_message_id=original,
            **details,
        )  # fmt: skip

    async def _by_token(self, env: Envelope, key: str, now: float) -> SendOutcome | None:
        token = env.idempotency_token
        if key in self._reserved:
            busy = AlreadyInProgressError(f"token {token} is being admitted right now")
            await self._log(env, dedup.DedupKind.IN_PROGRESS, "", token=token)
            return SendOutcome.refusal(env.message_id, busy, {"token": token})
        record = await self._cache.get(key)
        decision = dedup.decide(record, now, self._window)
        original = record.original_message_id if record else env.message_id
        await self._log(env, decision.kind, original, token=token)
        if record is not None and decision.kind in _REFUSED:
            return _refusal(env, record, decision.kind)
        self._reserved.add(key)
        keep = record if decision.kind is dedup.DedupKind.RETRY else None
        self._plans[env.message_id] = _Plan(key, keep, found=record)
        return None

    def taken(self, env: Envelope, record: IdempotencyRecord, now: float) -> SendOutcome:
        """The answer to `env`, which the store did not admit because another admission of
        its token came first (on another replica: `TokenTakenError`), from `record`, the
        token's record as the store found it: duplicate_detected with the cached outcome
        once there is one, else already_in_progress naming the attempt it records."""
        cached = dedup.decide(record, now, self._window).kind is dedup.DedupKind.DUPLICATE
        kind = dedup.DedupKind.DUPLICATE if cached else dedup.DedupKind.IN_PROGRESS
        self._events.note(
            "idempotency.decision", env.producer_id, correlation_id=env.correlation_id,
            message_id=env.message_id, decision=kind,
            original_message_id=record.original_message_id, token=env.idempotency_token,
        )  # fmt: skip
        return _refusal(env, record, kind)

    async def settle(self, env: Envelope, now: float) -> SendOutcome | None:
        """The answer to `env`, which an admission the store lost in doubt did not admit,
        when its token's record refuses it now (another attempt holds the token: `taken`'s
        answer); None when it has no token, the record does not refuse it (none, stale, or
        a retry may proceed) or cannot be read: whether it was refused is not known."""
        token = env.idempotency_token
        if not token:
            return None
        try:
            record = await self._cache.get(cache_key(env.producer_id, token))
        except StoreError:
            return None
        if record is None or record.current_message_id == env.message_id:
            return None
        if dedup.decide(record, now, self._window).kind not in _REFUSED:
            return None
        return self.taken(env, record, now)

    async def _requeue(self, env: Envelope, key: str) -> None:
        record = await self._cache.get(key) if key else None
        original = record.original_message_id if record else env.message_id
        await self._log(env, "REQUEUE", original, token=env.idempotency_token)
        if record is not None:
            self._reserved.add(key)
            self._plans[env.message_id] = _Plan(key, record, requeue=True, found=record)

    async def _by_sequence(self, env: Envelope, now: float) -> SendOutcome | None:
        high = self._high.get(env.producer_id)
        if high is None:
            high = await self._messages.max_sequence(env.producer_id)
        if env.sequence_number > high:
            self._high[env.producer_id] = env.sequence_number
            return None
        self._high[env.producer_id] = high
        prior = await self._messages.by_sequence(env.producer_id, env.sequence_number)
        if prior is None or prior.message_id == env.message_id:
            return None
        if not is_within_window(prior.created_at, now, self._window):
            return None
        if prior.state.value == "TIMED_OUT":
            return None  # a retry of an attempt that got no answer may proceed
        where = f"({env.producer_id}, {env.sequence_number})"
        kind = dedup.DedupKind.DUPLICATE if prior.state.terminal else dedup.DedupKind.IN_PROGRESS
        await self._log(env, kind, prior.message_id, sequence_number=str(env.sequence_number))
        if prior.state.terminal:
            details = {
                "status": dedup.DUPLICATE_DETECTED,
                "original_message_id": prior.message_id,
                "original_status": prior.state.value,
                "cached_at": dedup.iso_utc(prior.updated_at),
            }
            error = DuplicateDetectedError(
                f"{where} already completed as {prior.message_id} ({prior.state})", details
            )
            return SendOutcome.refusal(env.message_id, error, details)
        running = AlreadyInProgressError(
            f"{where} is in progress as {prior.message_id} ({prior.state})",
            {"original_message_id": prior.message_id, "status": prior.state.value},
        )
        return SendOutcome.refusal(env.message_id, running, {})

    async def record_for(self, message: StoredMessage, now: float) -> AdmissionWrites | None:
        """The token's record that commits with the admission of `message`, as the store is
        to write it (the `AdmissionWrites` token fields; None: it was admitted under no
        token); `release` follows the write."""
        plan = self._plans.get(message.message_id)
        if plan is None:
            return None
        if plan.record is None:
            record = dedup.start(plan.token, message.producer_id, message.message_id, now)
        elif plan.requeue:  # an operator's: written over whatever is stored
            current = await self._cache.get(plan.token) or plan.record
            record = dedup.requeue_attempt(current, message.message_id, now)
        else:
            record = dedup.attempt(plan.record, message.message_id, now)
        return AdmissionWrites(
            idempotency=record, idempotency_found=plan.found, idempotency_forced=plan.requeue
        )

    def release(self, message_id: str) -> None:
        """The admission of `message_id` ended after `check` passed (committed with its
        token's record, or failed): the token's reservation ends."""
        plan = self._plans.pop(message_id, None)
        if plan is not None:
            self._reserved.discard(plan.token)

    def progress_of(
        self, message: StoredMessage, message_id: str, now: float, code: str, note: str
    ) -> TokenProgress | None:
        """The progress that reflects `message`'s new state (as it is once stored) in its
        token's record (RFC 11.1 rule 4), for the store to apply in the transaction that
        stores that state (`MessageStore.record`'s `tokens`); None when it has no token.
        `message_id` is the attempt's id (`message` may be a late ACK's view of it)."""
        token = message.idempotency_token
        if not token:
            return None
        state = message.state
        producer = ""
        if self.kept_by_producer(message):
            if state not in dedup.OUTCOMES:
                return None  # (no record to follow an attempt's progress: only its outcome)
            producer = message.producer_id
        cached = None
        if state in dedup.OUTCOMES:  # (only an outcome can change the cached one)
            cached = self._events.draft(
                "idempotency.cached", message.producer_id,
                correlation_id=message.correlation_id, token=token, message_id=message_id,
                original_message_id=message_id, status=state.value,
            )  # fmt: skip
        key = cache_key(message.producer_id, token)
        return TokenProgress(key, message_id, state, now, code, note, cached, producer)

    def kept_by_producer(self, message: StoredMessage) -> bool:
        """Whether `message`'s token is one its producer keeps unique by its own records
        (`SELF_KEPT_TOKENS`): no record follows its progress, and an outcome its producer's
        writes record (a joined ACK, engine/router/ack_joins.py) needs none either."""
        return message.producer_id in SELF_KEPT_TOKENS and bool(message.idempotency_token)

    async def progress(
        self, message: StoredMessage, message_id: str, now: float, code: str, note: str
    ) -> None:
        """`progress_of` committed on its own: for a step that stores no state change of
        its message (a late ACK)."""
        step = self.progress_of(message, message_id, now, code, note)
        if step is not None:
            await self._events.commit([], partial(self._messages.record, [], tokens=[step]))
