"""The idempotency decision (RFC 11.2) and late-ACK reconciliation of the cache (RFC 11.1).

One `IdempotencyRecord` per token tracks every attempt (message_id) of one logical operation.
`decide` answers what to do with a new arrival carrying the token; `start`, `attempt` and
`progress` return updated records (records are immutable; the caller persists them);
`advance` is `progress` as the store applies it, in the transaction of the attempt's own
state change (core/records.py `TokenProgress`).

Reconciliation (RFC 11.1 rule 4, "reflect the earliest successful completion"): a terminal
outcome (FULFILLED, REJECTED, FAILED) of *any* attempt, late or not, is cached when none is.
A cached outcome is replaced only by an earlier successful completion: FULFILLED replaces
REJECTED or FAILED, and between two FULFILLED the earlier attempt (by its position in
`attempts`) wins. A replacement re-stamps `outcome_at`, the time the cache last changed.

TIMED_OUT is terminal for a message but not an outcome of the operation: it only makes a
retry admissible, which `decide` reports as RETRY.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Final

from apiary.core.idempotency import DEFAULT_DEDUP_WINDOW_S, is_within_window
from apiary.core.records import IdempotencyRecord, MessageState, TokenProgress

OUTCOMES: Final = frozenset({MessageState.FULFILLED, MessageState.REJECTED, MessageState.FAILED})
"""The terminal states that are outcomes of the operation and get cached."""
IN_PROGRESS_STATES: Final = frozenset(
    {MessageState.SENT, MessageState.RECEIVED, MessageState.READ, MessageState.RETRYING}
)
_PROGRESS_RANK: Final = {MessageState.SENT: 0, MessageState.RECEIVED: 1, MessageState.READ: 2}
DUPLICATE_DETECTED: Final = "DUPLICATE_DETECTED"


class DedupKind(StrEnum):
    """What to do with an arrival whose token has (or has no) record."""

    NEW = "NEW"
    """No live record: record RECEIVED and proceed (start a new record)."""
    IN_PROGRESS = "IN_PROGRESS"
    """An attempt is still running: do not execute; answer ALREADY_IN_PROGRESS."""
    DUPLICATE = "DUPLICATE"
    """A terminal outcome is cached: answer it (DUPLICATE_DETECTED) without executing."""
    RETRY = "RETRY"
    """The last attempt timed out without an outcome: admit this one as a new attempt."""


@dataclass(frozen=True, slots=True)
class DedupDecision:
    """The decision for one arrival; the outcome fields are set for DUPLICATE only."""

    kind: DedupKind
    original_message_id: str = ""
    status: str = ""
    result: str = ""
    error_code: str = ""
    cached_at: float = 0.0


def decide(
    record: IdempotencyRecord | None, now: float, window_s: float = DEFAULT_DEDUP_WINDOW_S
) -> DedupDecision:
    """RFC 11.2: NEW, IN_PROGRESS, DUPLICATE (with the cached outcome) or RETRY.

    A record is stale, and the arrival NEW, once `now` is past its window: counted from
    `outcome_at` when an outcome is cached (the RFC keeps outcomes for at least the window),
    else from `updated_at` (an operation silent for a whole window is abandoned). A record
    whose status is not a MessageState, or that caches an outcome under a non-outcome
    status, raises ValueError.
    """
    if record is None:
        return DedupDecision(DedupKind.NEW)
    status = _state(record.status)
    cached = record.outcome_at > 0
    if cached and status not in OUTCOMES:
        raise ValueError(f"record {record.token!r} caches an outcome under status {status}")
    reference = record.outcome_at if cached else record.updated_at
    if not is_within_window(reference, now, window_s):
        return DedupDecision(DedupKind.NEW)
    if cached:
        return DedupDecision(
            DedupKind.DUPLICATE,
            original_message_id=record.original_message_id,
            status=status.value,
            result=record.result,
            error_code=record.error_code,
            cached_at=record.outcome_at,
        )
    if status is MessageState.TIMED_OUT:
        return DedupDecision(DedupKind.RETRY)
    if status in IN_PROGRESS_STATES:
        return DedupDecision(DedupKind.IN_PROGRESS)
    # An outcome status without outcome_at: written by something that is not this module.
    raise ValueError(f"record {record.token!r} has status {status} but no cached outcome")


def start(token: str, producer: str, message_id: str, now: float) -> IdempotencyRecord:
    """The record of a NEW operation whose first attempt `message_id` was just RECEIVED."""
    for name, value in (("token", token), ("producer", producer), ("message_id", message_id)):
        if not value:
            raise ValueError(f"{name} must not be empty")
    _check_time(now)
    return IdempotencyRecord(
        token=token,
        producer_id=producer,
        original_message_id=message_id,
        current_message_id=message_id,
        status=MessageState.RECEIVED.value,
        created_at=now,
        updated_at=now,
        attempts=(message_id,),
    )


def attempt(record: IdempotencyRecord, message_id: str, now: float) -> IdempotencyRecord:
    """Add a retry attempt (RETRY decision): it becomes current, status RECEIVED.

    Only after the current attempt TIMED_OUT or is RETRYING, with no outcome cached; a
    message_id already among the attempts, or any other state, raises ValueError.
    """
    _check_time(now)
    if not message_id:
        raise ValueError("message_id must not be empty")
    if message_id in record.attempts:
        raise ValueError(f"{message_id} is already an attempt of {record.token!r}")
    status = _state(record.status)
    if record.outcome_at > 0 or status not in (MessageState.TIMED_OUT, MessageState.RETRYING):
        raise ValueError(
            f"no retry of {record.token!r} is admissible in status {status}"
            + (" with a cached outcome" if record.outcome_at > 0 else "")
        )
    return replace(
        record,
        current_message_id=message_id,
        status=MessageState.RECEIVED.value,
        updated_at=now,
        attempts=(*record.attempts, message_id),
    )


def requeue_attempt(record: IdempotencyRecord, message_id: str, now: float) -> IdempotencyRecord:
    """Add an operator's requeue of a dead letter (RFC 21.1) as an attempt: it becomes current.

    Unlike `attempt`, this is allowed after an outcome is cached, because an operator asked
    for the operation to run again. The cached outcome stays until the new attempt reaches
    its own, which `progress` reconciles (a FULFILLED replaces a REJECTED or FAILED). A
    message_id already among the attempts raises ValueError.
    """
    _check_time(now)
    if not message_id:
        raise ValueError("message_id must not be empty")
    if message_id in record.attempts:
        raise ValueError(f"{message_id} is already an attempt of {record.token!r}")
    return replace(
        record,
        current_message_id=message_id,
        updated_at=now,
        attempts=(*record.attempts, message_id),
    )


def progress(
    record: IdempotencyRecord,
    message_id: str,
    state: MessageState,
    now: float,
    *,
    error_code: str = "",
    result: str = "",
) -> IdempotencyRecord:
    """The record after attempt `message_id` reached `state` (an ACK, a timeout, a retry).

    - an outcome (FULFILLED, REJECTED, FAILED) of any attempt is cached per the module's
      reconciliation rule; `error_code` and `result` are cached with it;
    - TIMED_OUT of the current attempt, with nothing cached, sets status TIMED_OUT;
    - SENT, RECEIVED, READ of the current attempt move its status forward, never back, and
      never out of TIMED_OUT (RFC 11.1: a late ACK does not change a terminal state);
      RETRYING may follow any non-outcome status.
    Anything else (a stale attempt's progress, progress after an outcome) returns the record
    unchanged. A `message_id` that is not an attempt raises ValueError.
    """
    _check_time(now)
    if message_id not in record.attempts:
        raise ValueError(f"{message_id} is not an attempt of {record.token!r}")
    state = MessageState(state)
    if state in OUTCOMES:
        return _reconcile(record, message_id, state, now, error_code=error_code, result=result)
    if record.outcome_at > 0 or message_id != record.current_message_id:
        return record
    current = _state(record.status)
    if state is MessageState.TIMED_OUT or state is MessageState.RETRYING:
        return replace(record, status=state.value, updated_at=now)
    if current in _PROGRESS_RANK and _PROGRESS_RANK[state] > _PROGRESS_RANK[current]:
        return replace(record, status=state.value, updated_at=now)
    return record


def advance(
    record: IdempotencyRecord | None, step: TokenProgress
) -> tuple[IdempotencyRecord | None, bool]:
    """`progress` of `record` (as stored; None: no record) by `step`: the record to write
    (None: nothing changes, or `step`'s attempt is not one of the record's) and whether its
    cached outcome changed (`step.cached` is logged then). With no record, an outcome of a
    step that names its `producer` starts one, with that outcome cached."""
    if record is None and step.producer and step.state in OUTCOMES:
        record = start(step.key, step.producer, step.message_id, step.at)
    if record is None or step.message_id not in record.attempts:
        return None, False
    updated = progress(
        record, step.message_id, step.state, step.at,
        error_code=step.error_code, result=step.result,
    )  # fmt: skip
    if updated == record:
        return None, False
    return updated, updated.outcome_at != record.outcome_at


def unchanged(stored: IdempotencyRecord | None, found: IdempotencyRecord | None) -> bool:
    """Whether an admission that found a token's record as `found` (None: none) may write
    its own over `stored`, the record as its transaction reads it: none is stored (a record
    found then is gone: purged), or the one stored is still the one found (the same current
    attempt, status and last change). Otherwise another admission of the token came first
    (on another replica: one replica reserves its tokens in memory)."""
    if stored is None:
        return True
    return found is not None and (
        stored.current_message_id == found.current_message_id
        and stored.status == found.status
        and stored.updated_at == found.updated_at
    )


def duplicate_payload(record: IdempotencyRecord) -> dict[str, Any]:
    """The DUPLICATE_DETECTED JSON object of RFC 21 and Appendix C.2 for a cached outcome.

    Keys: status, original_message_id, original_status, cached_at (ISO-8601 UTC with "Z",
    whole seconds as in the RFC's example, milliseconds when the time has a fraction),
    result (the cached result text, "" when none) and error_code. Raises ValueError when the
    record has no cached outcome.
    """
    if record.outcome_at <= 0:
        raise ValueError(f"record {record.token!r} has no cached outcome")
    return {
        "status": DUPLICATE_DETECTED,
        "original_message_id": record.original_message_id,
        "original_status": record.status,
        "cached_at": iso_utc(record.outcome_at),
        "result": record.result,
        "error_code": record.error_code,
    }


def iso_utc(seconds: float) -> str:
    """UTC seconds as ISO-8601 with "Z": "2025-08-08T14:03:22Z" or "...T14:03:22.250Z".

    Non-finite or negative seconds raise ValueError.
    """
    _check_time(seconds)
    # Rounded to the nearest millisecond: 1.001 is 1.000999... as a float.
    whole, millis = divmod(round(seconds * 1000), 1000)
    text = datetime.fromtimestamp(whole, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{text}.{millis:03d}Z" if millis else f"{text}Z"


def _reconcile(
    record: IdempotencyRecord,
    message_id: str,
    state: MessageState,
    now: float,
    *,
    error_code: str,
    result: str,
) -> IdempotencyRecord:
    if record.outcome_at > 0 and not _earlier_success(record, message_id, state):
        return record
    return replace(
        record,
        original_message_id=message_id,
        status=state.value,
        outcome_at=now,
        updated_at=now,
        error_code=error_code,
        result=result,
    )


def _earlier_success(record: IdempotencyRecord, message_id: str, state: MessageState) -> bool:
    if state is not MessageState.FULFILLED:
        return False
    if record.status != MessageState.FULFILLED.value:
        return True
    cached = record.original_message_id
    cached_index = (
        record.attempts.index(cached) if cached in record.attempts else len(record.attempts)
    )
    return record.attempts.index(message_id) < cached_index


def _state(status: str) -> MessageState:
    try:
        return MessageState(status)
    except ValueError:
        raise ValueError(f"{status!r} is not a message state") from None


def _check_time(now: float) -> None:
    if not math.isfinite(now) or now < 0:
        raise ValueError(f"time must be finite, non-negative seconds, got {now!r}")
