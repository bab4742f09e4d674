"""How records map to table rows, for both SQL backends (the column lists and tuples).

Both schemas use the same column names and order; only the placeholders and the JSON types
differ (SQLite keeps JSON as text, PostgreSQL as JSONB, which psycopg hands back parsed).
Values are coerced to the column's Python type here (an int given for a REAL column becomes
a float), so that what a store returns does not depend on what the caller happened to pass.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from apiary.core.events import Event, EventFilter
from apiary.core.records import (
    AgentRecord,
    DlqEntry,
    DlqFilter,
    HitlRecord,
    IdempotencyRecord,
    MessageState,
    StoredMessage,
    TaskRecord,
    TaskState,
    state_text,
)
from apiary.core.worktree_binding import BindingState, WorktreeBinding
from apiary.store.errors import StoreError
from apiary.store.json_codec import (
    dump_json,
    dump_json_list,
    json_list_of,
    json_object_of,
)

EVENT_COLUMNS = "sequence, event_type, actor, ts, correlation_id, agent_id, details, hlc"
AGENT_COLUMNS = "agent_id, name, state, registered_at, last_heartbeat_at, descriptor"
MESSAGE_COLUMNS = (
    "message_id, recipient, producer_id, correlation_id, message_type, envelope, state,"
    " created_at, updated_at, error_code, idempotency_token, sequence_number, lane,"
    " ack_deadline, expires_at, deliveries, last_delivered_at, acked_stage, signature,"
    " inbox_offset"
)
"""Every stored column of `messages`; inbox_offset comes last (the store assigns it)."""
MESSAGE_COLUMN_COUNT = 20
IDEMPOTENCY_COLUMNS = (
    "token, producer_id, original_message_id, current_message_id, status, created_at,"
    " updated_at, outcome_at, error_code, result, attempts"
)
IDEMPOTENCY_COLUMN_COUNT = 11
DLQ_COLUMNS = (
    "entry_id, message_id, producer_id, recipient, correlation_id, message_type, error_code,"
    " reason, created_at, failed_at, content_type, payload_size, envelope, attempts, route,"
    " requeued_at, requeued_as, signature"
)
"""Every column of `dlq`; entry_id comes first (the store assigns it)."""
DLQ_INSERT_COLUMNS = DLQ_COLUMNS.removeprefix("entry_id, ")
DLQ_INSERT_COLUMN_COUNT = 17
HITL_COLUMNS = (
    "invocation_id, reason_type, state, created_at, updated_at, deadline, requested_by,"
    " correlation_id, subject, context, suggested_action, proposed_actions, approver_roles,"
    " timeout_action, priority, extensions, decision"
)
HITL_COLUMN_COUNT = 17
HITL_JSON_COLUMNS = frozenset(
    {"subject", "context", "proposed_actions", "approver_roles", "decision"}
)
"""The columns of `hitl` that hold JSON (text in SQLite, JSONB in PostgreSQL)."""
TASK_COLUMNS = (
    "task_id, agent_id, priority, submitted_at, seq, state, updated_at, scope, job_key,"
    " params, content_type, agent_type, message_id, attempts, error_code, note, lane,"
    " correlation_id"
)
TASK_COLUMN_COUNT = 18
WORKTREE_COLUMNS = (
    "agent_id, state, repo_id, worktree_id, branch, commit_sha, current_repo_id,"
    " current_worktree_id,"
    " target_repo_id, target_worktree_id, reason, note, attempts, retry_at, recovery_at,"
    " expires_at, ttl_s, invocation_id, entered_at, updated_at, version"
)
"""Every column of `worktrees`; agent_id first and version last (the write's key and guard)."""
WORKTREE_COLUMN_COUNT = 21

_UINT64 = 1 << 64
_INT64_MAX = (1 << 63) - 1
_INT64_MIN = -(1 << 63)


def check_limit(limit: int) -> None:
    """Refuse a negative LIMIT (SQLite would read it as "no limit", PostgreSQL fails)."""
    if limit < 0:
        raise ValueError(f"limit must not be negative: {limit}")


def sequence_to_sql(sequence_number: int) -> int:
    """A uint64 sequence number as the signed 64-bit integer both databases store.

    Numbers from 2^63 on wrap around to negative values: a bijection, and sequence numbers
    are only compared for equality. Raises ValueError outside 0..2^64-1 (the envelope's
    uint64), which every backend refuses alike.
    """
    if not 0 <= sequence_number < _UINT64:
        raise ValueError(f"sequence_number must be a uint64: {sequence_number}")
    return sequence_number - _UINT64 if sequence_number > _INT64_MAX else sequence_number


def sequence_from_sql(stored: int) -> int:
    """The inverse of `sequence_to_sql`."""
    return stored + _UINT64 if stored < 0 else stored


# Sequence numbers at or above 2**63 are stored negative (sequence_to_sql), so the largest
# one is the largest negative value if any is stored, else the largest non-negative value.
MAX_SEQUENCE_SQL = (
    "SELECT MAX(CASE WHEN sequence_number < 0 THEN sequence_number END),"
    " MAX(CASE WHEN sequence_number >= 0 THEN sequence_number END)"
    " FROM messages WHERE producer_id = {p}"
)


def max_sequence_from_row(row: Sequence[Any] | None) -> int:
    """The producer's highest sequence number from a row of MAX_SEQUENCE_SQL."""
    if row is None:
        return 0
    negative, positive = row
    if negative is not None:
        return sequence_from_sql(int(negative))
    return int(positive or 0)


def event_from_row(row: Sequence[Any]) -> Event:
    """An `Event` from a row of EVENT_COLUMNS."""
    sequence, event_type, actor, ts, correlation_id, agent_id, details, hlc = row
    return Event(
        sequence=sequence,
        event_type=event_type,
        actor=actor,
        ts=ts,
        correlation_id=correlation_id,
        agent_id=agent_id,
        details=json_object_of(details),
        hlc=hlc,
    )


def agent_row(agent: AgentRecord) -> tuple[Any, ...]:
    """The values of AGENT_COLUMNS for `agent`, its descriptor as JSON text."""
    return (
        agent.agent_id,
        agent.name,
        agent.state,
        agent.registered_at,
        agent.last_heartbeat_at,
        dump_json(agent.descriptor),
    )


def agent_from_row(row: Sequence[Any]) -> AgentRecord:
    """An `AgentRecord` from a row of AGENT_COLUMNS."""
    agent_id, name, state, registered_at, last_heartbeat_at, descriptor = row
    return AgentRecord(
        agent_id=agent_id,
        name=name,
        state=state,
        registered_at=registered_at,
        last_heartbeat_at=last_heartbeat_at,
        descriptor=json_object_of(descriptor),
    )


def message_values(message: StoredMessage) -> tuple[Any, ...]:
    """The values of MESSAGE_COLUMNS for `message` but the last, inbox_offset.

    Raises ValueError for a sequence number that is not a uint64.
    """
    return (
        message.message_id,
        message.recipient,
        message.producer_id,
        message.correlation_id,
        int(message.message_type),
        bytes(message.envelope),
        state_text(message.state),
        float(message.created_at),
        float(message.updated_at),
        message.error_code,
        message.idempotency_token,
        sequence_to_sql(message.sequence_number),
        message.lane,
        float(message.ack_deadline),
        float(message.expires_at),
        int(message.deliveries),
        float(message.last_delivered_at),
        message.acked_stage,
        bytes(message.signature),
    )


def latest_deliveries(counts: Sequence[tuple[str, int, float]]) -> dict[str, tuple[int, float]]:
    """By message id, the larger count and the later time of `counts` (an id may repeat)."""
    latest: dict[str, tuple[int, float]] = {}
    for message_id, n, at in counts:
        seen = latest.get(message_id)
        latest[message_id] = (
            (int(n), float(at)) if seen is None else (max(seen[0], int(n)), max(seen[1], at))
        )
    return latest


def message_row(message: StoredMessage, offset: int) -> tuple[Any, ...]:
    """The values of MESSAGE_COLUMNS for `message` admitted at `offset`."""
    return (*message_values(message), offset)


def message_from_row(row: Sequence[Any]) -> StoredMessage:
    """A `StoredMessage` from a row of MESSAGE_COLUMNS."""
    (
        message_id,
        recipient,
        producer_id,
        correlation_id,
        message_type,
        envelope,
        state,
        created_at,
        updated_at,
        error_code,
        idempotency_token,
        sequence_number,
        lane,
        ack_deadline,
        expires_at,
        deliveries,
        last_delivered_at,
        acked_stage,
        signature,
        offset,
    ) = row
    return StoredMessage(
        message_id=message_id,
        recipient=recipient,
        producer_id=producer_id,
        correlation_id=correlation_id,
        message_type=message_type,
        envelope=bytes(envelope),
        state=MessageState(state),
        created_at=created_at,
        updated_at=updated_at,
        offset=offset,
        error_code=error_code,
        idempotency_token=idempotency_token,
        sequence_number=sequence_from_sql(sequence_number),
        lane=lane,
        ack_deadline=ack_deadline,
        expires_at=expires_at,
        deliveries=deliveries,
        last_delivered_at=last_delivered_at,
        acked_stage=acked_stage,
        signature=bytes(signature),
    )


def idempotency_row(record: IdempotencyRecord) -> tuple[Any, ...]:
    """The values of IDEMPOTENCY_COLUMNS for `record`, its attempts as a JSON array."""
    return (
        record.token,
        record.producer_id,
        record.original_message_id,
        record.current_message_id,
        record.status,
        float(record.created_at),
        float(record.updated_at),
        float(record.outcome_at),
        record.error_code,
        record.result,
        dump_json_list(_attempt_ids(record.attempts)),
    )


def idempotency_from_row(row: Sequence[Any]) -> IdempotencyRecord:
    """An `IdempotencyRecord` from a row of IDEMPOTENCY_COLUMNS."""
    token, producer_id, original, current, status, created_at, updated_at = row[:7]
    outcome_at, error_code, result, attempts = row[7:]
    return IdempotencyRecord(
        token=token,
        producer_id=producer_id,
        original_message_id=original,
        current_message_id=current,
        status=status,
        created_at=created_at,
        updated_at=updated_at,
        outcome_at=outcome_at,
        error_code=error_code,
        result=result,
        attempts=tuple(str(a) for a in json_list_of(attempts)),
    )


def dlq_insert_row(entry: DlqEntry) -> tuple[Any, ...]:
    """The values of DLQ_INSERT_COLUMNS (every column but entry_id) for `entry`.

    Raises ValueError when an attempt is not a JSON object of JSON values.
    """
    return (
        entry.message_id,
        entry.producer_id,
        entry.recipient,
        entry.correlation_id,
        int(entry.message_type),
        entry.error_code,
        entry.reason,
        float(entry.created_at),
        float(entry.failed_at),
        entry.content_type,
        int(entry.payload_size),
        bytes(entry.envelope),
        dump_json_list(_attempt_objects(entry.attempts)),
        entry.route,
        float(entry.requeued_at),
        entry.requeued_as,
        bytes(entry.signature),
    )


def dlq_from_row(row: Sequence[Any]) -> DlqEntry:
    """A `DlqEntry` from a row of DLQ_COLUMNS."""
    entry_id, message_id, producer_id, recipient, correlation_id, message_type = row[:6]
    error_code, reason, created_at, failed_at, content_type, payload_size = row[6:12]
    envelope, attempts, route, requeued_at, requeued_as, signature = row[12:]
    return DlqEntry(
        entry_id=entry_id,
        message_id=message_id,
        producer_id=producer_id,
        recipient=recipient,
        correlation_id=correlation_id,
        message_type=message_type,
        error_code=error_code,
        reason=reason,
        created_at=created_at,
        failed_at=failed_at,
        content_type=content_type,
        payload_size=payload_size,
        envelope=bytes(envelope),
        attempts=tuple(_attempt_object(a) for a in json_list_of(attempts)),
        route=route,
        requeued_at=requeued_at,
        requeued_as=requeued_as,
        signature=bytes(signature),
    )


def hitl_row(record: HitlRecord) -> tuple[Any, ...]:
    """The values of HITL_COLUMNS for `record`, its JSON fields as JSON text.

    Raises ValueError when subject, context or decision is not a JSON object of JSON
    values, when an action or role is not a str, or when priority or extensions does not
    fit the 64-bit integer both databases store.
    """
    return (
        record.invocation_id,
        record.reason_type,
        record.state,
        float(record.created_at),
        float(record.updated_at),
        float(record.deadline),
        record.requested_by,
        record.correlation_id,
        dump_json(record.subject),
        dump_json(record.context),
        record.suggested_action,
        dump_json_list(checked_strings("proposed_actions", record.proposed_actions)),
        dump_json_list(checked_strings("approver_roles", record.approver_roles)),
        record.timeout_action,
        checked_int64("priority", record.priority),
        checked_int64("extensions", record.extensions),
        dump_json(record.decision),
    )


def hitl_from_row(row: Sequence[Any]) -> HitlRecord:
    """A `HitlRecord` from a row of HITL_COLUMNS."""
    invocation_id, reason_type, state, created_at, updated_at, deadline, requested_by = row[:7]
    correlation_id, subject, context, suggested_action, proposed, roles = row[7:13]
    timeout_action, priority, extensions, decision = row[13:]
    return HitlRecord(
        invocation_id=invocation_id,
        reason_type=reason_type,
        state=state,
        created_at=created_at,
        updated_at=updated_at,
        deadline=deadline,
        requested_by=requested_by,
        correlation_id=correlation_id,
        subject=json_object_of(subject),
        context=json_object_of(context),
        suggested_action=suggested_action,
        proposed_actions=tuple(str(a) for a in json_list_of(proposed)),
        approver_roles=tuple(str(r) for r in json_list_of(roles)),
        timeout_action=timeout_action,
        priority=priority,
        extensions=extensions,
        decision=json_object_of(decision),
    )


def hitl_list_clauses(
    states: frozenset[str] | None, after_created: float, placeholder: str
) -> tuple[list[str], list[Any]] | None:
    """The WHERE terms and parameters of a HITL listing; None when nothing can match (an
    empty set of states)."""
    clauses = [f"created_at > {placeholder}"]
    params: list[Any] = [float(after_created)]
    if states is not None:
        if not states:
            return None
        values = sorted(states)
        clauses.append(_in_list("state", values, placeholder))
        params.extend(values)
    return clauses, params


def task_row(record: TaskRecord) -> tuple[Any, ...]:
    """The values of TASK_COLUMNS for `record`.

    Raises ValueError when state is not a TaskState value (every backend refuses it alike,
    rather than a scheduler reading back a state it cannot act on), or when priority, seq
    or attempts does not fit the 64-bit integer both databases store.
    """
    return (
        record.task_id,
        record.agent_id,
        checked_int64("priority", record.priority),
        float(record.submitted_at),
        checked_int64("seq", record.seq),
        TaskState(record.state).value,
        float(record.updated_at),
        record.scope,
        record.job_key,
        bytes(record.params),
        record.content_type,
        record.agent_type,
        record.message_id,
        checked_int64("attempts", record.attempts),
        record.error_code,
        record.note,
        record.lane,
        record.correlation_id,
    )


def task_from_row(row: Sequence[Any]) -> TaskRecord:
    """A `TaskRecord` from a row of TASK_COLUMNS."""
    task_id, agent_id, priority, submitted_at, seq, state, updated_at, scope = row[:8]
    job_key, params, content_type, agent_type, message_id, attempts, error_code, note = row[8:16]
    return TaskRecord(
        task_id=task_id,
        agent_id=agent_id,
        priority=priority,
        submitted_at=submitted_at,
        seq=seq,
        state=state,
        updated_at=updated_at,
        scope=scope,
        job_key=job_key,
        params=bytes(params),
        content_type=content_type,
        agent_type=agent_type,
        message_id=message_id,
        attempts=attempts,
        error_code=error_code,
        note=note,
        lane=row[16],
        correlation_id=row[17],
    )


def task_list_clauses(
    states: frozenset[str] | None, agent_id: str | None, after_seq: int, placeholder: str
) -> tuple[list[str], list[Any]] | None:
    """The WHERE terms and parameters of a task listing; None when nothing can match (an
    empty set of states)."""
    clauses = [f"seq > {placeholder}"]
    params: list[Any] = [int(after_seq)]
    if agent_id is not None:
        clauses.append(f"agent_id = {placeholder}")
        params.append(agent_id)
    if states is not None:
        if not states:
            return None
        values = sorted(states)
        clauses.append(_in_list("state", values, placeholder))
        params.extend(values)
    return clauses, params


def worktree_row(binding: WorktreeBinding) -> tuple[Any, ...]:
    """The values of WORKTREE_COLUMNS for `binding`.

    Raises ValueError when state is not a BindingState value, when version is below 1 (a
    stored record has been written at least once), or when attempts or version does not fit
    the 64-bit integer both databases store.
    """
    if int(binding.version) < 1:
        raise ValueError(f"a stored binding has version 1 or more, not {binding.version}")
    return (
        binding.agent_id,
        BindingState(binding.state).value,
        binding.repo_id,
        binding.worktree_id,
        binding.branch,
        binding.commit_sha,
        binding.current_repo_id,
        binding.current_worktree_id,
        binding.target_repo_id,
        binding.target_worktree_id,
        binding.reason,
        binding.note,
        checked_int64("attempts", binding.attempts),
        float(binding.retry_at),
        float(binding.recovery_at),
        float(binding.expires_at),
        float(binding.ttl_s),
        binding.invocation_id,
        float(binding.entered_at),
        float(binding.updated_at),
        checked_int64("version", binding.version),
    )


def worktree_from_row(row: Sequence[Any]) -> WorktreeBinding:
    """A `WorktreeBinding` from a row of WORKTREE_COLUMNS."""
    agent_id, state, repo_id, worktree_id, branch, commit_sha, current_repo_id = row[:7]
    current_worktree_id, target_repo_id, target_worktree_id, reason, note, attempts = row[7:13]
    retry_at, recovery_at, expires_at, ttl_s, invocation_id, entered_at, updated_at = row[13:20]
    version = row[20]
    return WorktreeBinding(
        agent_id=agent_id,
        state=state,
        repo_id=repo_id,
        worktree_id=worktree_id,
        branch=branch,
        commit_sha=commit_sha,
        current_repo_id=current_repo_id,
        current_worktree_id=current_worktree_id,
        target_repo_id=target_repo_id,
        target_worktree_id=target_worktree_id,
        reason=reason,
        note=note,
        attempts=attempts,
        retry_at=retry_at,
        recovery_at=recovery_at,
        expires_at=expires_at,
        ttl_s=ttl_s,
        invocation_id=invocation_id,
        entered_at=entered_at,
        updated_at=updated_at,
        version=version,
    )


def worktree_list_clauses(
    states: frozenset[str] | None, repo_id: str | None, placeholder: str
) -> tuple[list[str], list[Any]] | None:
    """The WHERE terms and parameters of a binding listing; None when nothing can match (an
    empty set of states). `repo_id` matches the home or the current repository."""
    clauses = ["1 = 1"]
    params: list[Any] = []
    if repo_id is not None:
        clauses.append(f"(repo_id = {placeholder} OR current_repo_id = {placeholder})")
        params.extend([repo_id, repo_id])
    if states is not None:
        if not states:
            return None
        values = sorted(states)
        clauses.append(_in_list("state", values, placeholder))
        params.extend(values)
    return clauses, params


def worktree_write_sql(placeholder: str, version: int) -> str:
    """The statement that stores a binding row (WORKTREE_COLUMNS order, the stored version
    appended for an update): an insert that conflicts with nothing for version 1, else an
    update of the row holding `version - 1`. Either changes one row or none (a conflict)."""
    names = WORKTREE_COLUMNS.split(", ")
    if version == 1:
        return (
            f"INSERT INTO worktrees ({WORKTREE_COLUMNS})"
            f" VALUES ({', '.join([placeholder] * WORKTREE_COLUMN_COUNT)})"
            " ON CONFLICT (agent_id) DO NOTHING"
        )
    sets = ", ".join(f"{c} = {placeholder}" for c in names[1:])
    return f"UPDATE worktrees SET {sets} WHERE agent_id = {placeholder} AND version = {placeholder}"


def worktree_write_params(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """The parameters of `worktree_write_sql` for a row of `worktree_row`."""
    version = row[-1]
    if version == 1:
        return row
    return (*row[1:], row[0], version - 1)


def checked_strings(name: str, values: Sequence[str]) -> list[str]:
    """`values` as a list of str for a JSON column; ValueError naming `name` otherwise."""
    if (
        isinstance(values, str | bytes | bytearray)
        or not isinstance(values, Sequence)
        or not all(isinstance(v, str) for v in values)
    ):
        raise ValueError(f"{name} must be a sequence of str")
    return list(values)


def checked_int64(name: str, value: int) -> int:
    """`value` if it fits a signed 64-bit column; ValueError naming `name` otherwise."""
    number = int(value)
    if not _INT64_MIN <= number <= _INT64_MAX:
        raise ValueError(f"{name} must fit a signed 64-bit integer: {value}")
    return number


def _attempt_ids(attempts: Sequence[str]) -> list[str]:
    if isinstance(attempts, str) or not all(isinstance(a, str) for a in attempts):
        raise ValueError("attempts must be a sequence of message ids (str)")
    return list(attempts)


def _attempt_objects(attempts: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    if not all(isinstance(a, Mapping) for a in attempts):
        raise ValueError("attempts must be a sequence of JSON objects")
    return list(attempts)


def _attempt_object(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise StoreError(f"a stored DLQ attempt is not a JSON object: {type(value).__name__}")
    return value


def dlq_filter_clauses(
    where: DlqFilter | None, after_id: int, placeholder: str
) -> tuple[list[str], list[Any]]:
    """The WHERE terms (to be ANDed) and their parameters of a DLQ listing.

    `placeholder` is the dialect's parameter marker ('?' or '%s').
    """
    clauses = [f"entry_id > {placeholder}"]
    params: list[Any] = [after_id]
    if where is None:
        return clauses, params
    terms: list[tuple[str, Any]] = [
        ("failed_at >=", where.since),
        ("failed_at <=", where.until),
        ("error_code =", where.error_code),
        ("recipient =", where.recipient),
        ("producer_id =", where.producer_id),
    ]
    for term, value in terms:
        if value is not None:
            clauses.append(f"{term} {placeholder}")
            params.append(value)
    if not where.include_requeued:
        clauses.append("requeued_as = ''")
    return clauses, params


def _in_list(column: str, values: list[Any], placeholder: str) -> str:
    return f"{column} IN ({', '.join([placeholder] * len(values))})"


def event_filter_clauses(
    where: EventFilter | None, after: int, placeholder: str,
    correlation_key: Callable[[str], int] | None = None,
) -> tuple[list[str], list[Any]] | None:  # fmt: skip
    """The WHERE terms and parameters of an event-log read; None when nothing can match
    (an empty set of event types). `correlation_key`: the function a `correlation_key`
    column holds of correlation_id, for a schema that indexes that instead of the id."""
    clauses = [f"sequence > {placeholder}"]
    params: list[Any] = [after]
    if where is None:
        return clauses, params
    if correlation_key is not None and where.correlation_id is not None:
        clauses.append(f"correlation_key = {placeholder}")
        params.append(correlation_key(where.correlation_id))
    for column, value in (("correlation_id", where.correlation_id), ("agent_id", where.agent_id)):
        if value is not None:
            clauses.append(f"{column} = {placeholder}")
            params.append(value)
    if where.event_types is not None:
        if not where.event_types:
            return None
        exact = sorted(t for t in where.event_types if not t.endswith("."))
        families = sorted(t for t in where.event_types if t.endswith("."))
        alternatives = [_in_list("event_type", exact, placeholder)] if exact else []
        alternatives += [f"event_type LIKE {placeholder} ESCAPE '!'" for _ in families]
        clauses.append(f"({' OR '.join(alternatives)})")
        params.extend(exact)
        params.extend(_like_prefix(f) for f in families)
    return clauses, params


def _like_prefix(prefix: str) -> str:
    """A LIKE pattern for names starting with `prefix` (its own wildcards escaped)."""
    escaped = prefix.replace("!", "!!").replace("%", "!%").replace("_", "!_")
    return f"{escaped}%"


def inbox_clauses(
    recipient: str, after_offset: int, states: frozenset[MessageState] | None, placeholder: str
) -> tuple[list[str], list[Any]] | None:
    """The WHERE terms and parameters of an inbox read; None when nothing can match."""
    clauses = [f"recipient = {placeholder}", f"inbox_offset > {placeholder}"]
    params: list[Any] = [recipient, after_offset]
    if states is not None:
        if not states:
            return None
        values = sorted(s.value for s in states)
        clauses.append(_in_list("state", values, placeholder))
        params.extend(values)
    return clauses, params
