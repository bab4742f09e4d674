"""The negotiation and artifact stores: `negotiations`, `negotiation_rounds`,
`negotiation_policies` and `artifacts` (RFC 17, 17.2-17.4).

JSON fields are JSON text (SQLite) or JSONB (PostgreSQL), payloads and artifact contents
BLOB or BYTEA. The rows are shared with the memory backend, which runs them so that it
refuses and coerces what the SQL backends do. Every write commits with the events it is
given; an artifact's event only with the artifact it is about, when that is added.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

from apiary.core.events import EventDraft
from apiary.core.negotiation.records import ArtifactRecord, NegotiationRecord, RoundRecord
from apiary.store.json_codec import dump_json, dump_json_list, json_list_of, json_object_of
from apiary.store.sql.checks import check_limit, checked_strings
from apiary.store.sql.columns import Columns, Json
from apiary.store.sql.database import SqlDatabase
from apiary.store.sql.dialect import Dialect, by_dialect
from apiary.store.sql.events import SqlEventLog, append_events, event_rows
from apiary.store.sql.statements import Execute, ExecuteMany, Query, QueryOne, Transaction
from apiary.store.sql.where import Where

T = TypeVar("T")
_INT64_MAX = (1 << 63) - 1


class NegotiationRow(NamedTuple):
    """A row of `negotiations`."""

    negotiation_id: str
    correlation_id: str
    topic: str
    participants: Json
    intensity: str
    state: str
    created_at: float
    updated_at: float
    deadline: float
    opened_by: str
    profile: str
    policy: Json
    validation: Json
    round_number: int
    round_deadline: float
    tokens_spent: int
    oscillations: int
    invocation_id: str
    stop_reason: str
    decision: Json


class RoundRow(NamedTuple):
    """A row of `negotiation_rounds`."""

    negotiation_id: str
    round_number: int
    kind: str
    from_agent: str
    content_type: str
    payload: bytes
    submitted_at: float
    tokens: int
    checks: Json
    delta: Json
    evaluations: Json
    llm_confidence: float | None
    score: float | None


class ArtifactRow(NamedTuple):
    """A row of `artifacts` (but `seq`, which keeps the append order)."""

    negotiation_id: str
    kind: str
    version: str
    content_type: str
    content: bytes
    created_at: float


class PolicyRow(NamedTuple):
    """A row of `negotiation_policies`: name '' is the base policy, any other a profile."""

    name: str
    policy: Json
    updated_at: float


NEGOTIATIONS = Columns(NegotiationRow, json=("participants", "policy", "validation", "decision"))
ROUNDS = Columns(RoundRow, json=("checks", "delta", "evaluations"))
ARTIFACTS = Columns(ArtifactRow)
POLICIES = Columns(PolicyRow, json=("policy",))


def negotiation_row(record: NegotiationRecord) -> NegotiationRow:
    """The record's row; ValueError for non-JSON values or out-of-range integers (every
    backend refuses them alike)."""
    return NegotiationRow(
        negotiation_id=record.negotiation_id,
        correlation_id=record.correlation_id,
        topic=record.topic,
        participants=dump_json_list(checked_strings("participants", record.participants)),
        intensity=record.intensity,
        state=record.state,
        created_at=float(record.created_at),
        updated_at=float(record.updated_at),
        deadline=float(record.deadline),
        opened_by=record.opened_by,
        profile=record.profile,
        policy=dump_json(record.policy),
        validation=dump_json(record.validation),
        round_number=_count("round", record.round),
        round_deadline=float(record.round_deadline),
        tokens_spent=_count("tokens_spent", record.tokens_spent),
        oscillations=_count("oscillations", record.oscillations),
        invocation_id=record.invocation_id,
        stop_reason=record.stop_reason,
        decision=dump_json(record.decision),
    )


def negotiation_from_row(row: NegotiationRow) -> NegotiationRecord:
    """The record of a row."""
    return NegotiationRecord(
        negotiation_id=row.negotiation_id,
        correlation_id=row.correlation_id,
        topic=row.topic,
        participants=tuple(str(p) for p in json_list_of(row.participants)),
        intensity=row.intensity,
        state=row.state,
        created_at=row.created_at,
        updated_at=row.updated_at,
        deadline=row.deadline,
        opened_by=row.opened_by,
        profile=row.profile,
        policy=json_object_of(row.policy),
        validation=json_object_of(row.validation),
        round=row.round_number,
        round_deadline=row.round_deadline,
        tokens_spent=row.tokens_spent,
        oscillations=row.oscillations,
        invocation_id=row.invocation_id,
        stop_reason=row.stop_reason,
        decision=json_object_of(row.decision),
    )


def round_row(record: RoundRecord) -> RoundRow:
    """The round's row; ValueError as `negotiation_row`."""
    return RoundRow(
        negotiation_id=record.negotiation_id,
        round_number=_count("round", record.round),
        kind=record.kind,
        from_agent=record.from_agent,
        content_type=record.content_type,
        payload=bytes(record.payload),
        submitted_at=float(record.submitted_at),
        tokens=_count("tokens", record.tokens),
        checks=dump_json(record.checks),
        delta=dump_json(record.delta),
        evaluations=dump_json(record.evaluations),
        llm_confidence=None if record.llm_confidence is None else float(record.llm_confidence),
        score=None if record.score is None else float(record.score),
    )


def round_from_row(row: RoundRow) -> RoundRecord:
    """The round of a row."""
    return RoundRecord(
        negotiation_id=row.negotiation_id,
        round=row.round_number,
        kind=row.kind,
        from_agent=row.from_agent,
        content_type=row.content_type,
        payload=bytes(row.payload),
        submitted_at=row.submitted_at,
        tokens=row.tokens,
        checks=json_object_of(row.checks),
        delta=json_object_of(row.delta),
        evaluations=json_object_of(row.evaluations),
        llm_confidence=row.llm_confidence,
        score=row.score,
    )


def artifact_row(record: ArtifactRecord) -> ArtifactRow:
    """The artifact's row."""
    return ArtifactRow(
        negotiation_id=record.negotiation_id,
        kind=record.kind,
        version=record.version,
        content_type=record.content_type,
        content=bytes(record.content),
        created_at=float(record.created_at),
    )


def artifact_from_row(row: ArtifactRow) -> ArtifactRecord:
    """The artifact of a row."""
    return ArtifactRecord(
        negotiation_id=row.negotiation_id,
        kind=row.kind,
        version=row.version,
        content_type=row.content_type,
        content=bytes(row.content),
        created_at=row.created_at,
    )


def _count(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _INT64_MAX:
        raise ValueError(f"{name} must be an integer in [0, 2**63), got {value!r}")
    return value


_PUT = by_dialect(lambda d: d.upsert("negotiations", NEGOTIATIONS, "negotiation_id"))
_PUT_ROUND = by_dialect(
    lambda d: d.upsert("negotiation_rounds", ROUNDS, ("negotiation_id", "round_number"))
)
_PUT_POLICY = by_dialect(lambda d: d.upsert("negotiation_policies", POLICIES, "name"))
_APPEND = by_dialect(
    lambda d: d.insert(
        "artifacts", ARTIFACTS, " ON CONFLICT (negotiation_id, kind, version) DO NOTHING"
    )
)
_GET = f"SELECT {NEGOTIATIONS.sql} FROM negotiations WHERE negotiation_id = ?"
_ROUNDS = (
    f"SELECT {ROUNDS.sql} FROM negotiation_rounds WHERE negotiation_id = ? ORDER BY round_number"
)
_POLICIES = f"SELECT {POLICIES.sql} FROM negotiation_policies ORDER BY name"
_ARTIFACT = (
    f"SELECT {ARTIFACTS.sql} FROM artifacts WHERE negotiation_id = ? AND kind = ? AND version = ?"
)
_ARTIFACTS = f"SELECT {ARTIFACTS.sql} FROM artifacts WHERE negotiation_id = ?"


class SqlNegotiationStore:
    """`NegotiationStore` in `negotiations`, `negotiation_rounds` and
    `negotiation_policies`; a save is one transaction. Events that commit with a change go
    through `log`."""

    def __init__(self, database: SqlDatabase, log: SqlEventLog) -> None:
        self._db = database
        self._log = log

    async def save(
        self,
        record: NegotiationRecord,
        round_: RoundRecord | None = None,
        artifacts: Sequence[ArtifactRecord] = (),
        events: Sequence[EventDraft] = (),
        artifact_events: Sequence[EventDraft] = (),
    ) -> list[bool]:
        """Insert or replace the record and, when given, the round, and append the
        artifacts, together with `events` and the `artifact_events` of the artifacts added;
        whether each artifact was new."""
        row = negotiation_row(record)
        extra = None if round_ is None else round_row(round_)
        rows = [artifact_row(a) for a in artifacts]
        check_artifact_events(artifacts, artifact_events)
        if not events and not artifact_events:
            return await self._db.write(_save, row, extra, rows)
        d = self._db.dialect
        written = event_rows(d, events), event_rows(d, artifact_events)
        added, first = await self._db.write(_save_with_events, row, extra, rows, *written)
        self._committed(first, [*events, *added_only(artifact_events, added)])
        return added

    async def get(self, negotiation_id: str) -> NegotiationRecord | None:
        """The record, or None."""
        row = await self._db.read(QueryOne(_GET, (negotiation_id,)))
        return None if row is None else negotiation_from_row(NEGOTIATIONS.of(row))

    async def rounds(self, negotiation_id: str) -> list[RoundRecord]:
        """The negotiation's rounds in round order."""
        rows = await self._db.read(Query(_ROUNDS, (negotiation_id,)))
        return [round_from_row(ROUNDS.of(row)) for row in rows]

    async def list(
        self, states: frozenset[str] | None = None, after_created: float = 0.0, limit: int = 100
    ) -> list[NegotiationRecord]:
        """Records in `states` (all when None) created after `after_created`, oldest first
        (by created_at, then negotiation_id), at most `limit`."""
        check_limit(limit)
        where = Where().term("created_at > ?", float(after_created)).among("state", states)
        if where.impossible:
            return []
        sql = (
            f"SELECT {NEGOTIATIONS.sql} FROM negotiations WHERE {where.sql}"
            " ORDER BY created_at, negotiation_id LIMIT ?"
        )
        rows = await self._db.read(Query(sql, [*where.params, limit]))
        return [negotiation_from_row(NEGOTIATIONS.of(row)) for row in rows]

    async def put_policy(
        self, name: str, policy: Mapping[str, Any], at: float, events: Sequence[EventDraft] = ()
    ) -> None:
        """Insert or replace the policy called `name` ('' is the base policy), with
        `events`."""
        row = PolicyRow(name, dump_json(policy), float(at))
        await self._log.write_with(events, _put_policy, row)

    async def replace_profiles(
        self,
        profiles: Mapping[str, Mapping[str, Any]],
        at: float,
        events: Sequence[EventDraft] = (),
    ) -> None:
        """Make `profiles` the only profiles, in one transaction with `events` (the base
        policy stays)."""
        if "" in profiles:
            raise ValueError("a profile needs a name ('' is the base policy)")
        rows = [PolicyRow(name, dump_json(p), float(at)) for name, p in profiles.items()]
        await self._log.write_with(events, _replace_profiles, rows)

    async def policies(self) -> dict[str, dict[str, Any]]:
        """Every policy by name, in name order."""
        rows = await self._db.read(Query(_POLICIES))
        return {r.name: json_object_of(r.policy) for r in map(POLICIES.of, rows)}

    def _committed(self, first: int, drafts: Sequence[EventDraft]) -> None:
        if drafts:
            self._log.committed(first, drafts)


class SqlArtifactStore:
    """`ArtifactStore` in the `artifacts` table, listed in append order; events that commit
    with an artifact go through `log`."""

    def __init__(self, database: SqlDatabase, log: SqlEventLog) -> None:
        self._db = database
        self._log = log

    async def append(self, artifact: ArtifactRecord, events: Sequence[EventDraft] = ()) -> bool:
        """Append the artifact with `events`; False (nothing changes, events included) when
        its (negotiation, kind, version) is held."""
        row = artifact_row(artifact)
        if not events:
            return await self._db.write(Execute(_APPEND, row)) == 1
        first = await self._db.write(_append, row, event_rows(self._db.dialect, events))
        if first:
            self._log.committed(first, events)
        return first > 0

    async def get(self, negotiation_id: str, kind: str, version: str) -> ArtifactRecord | None:
        """The artifact, or None."""
        row = await self._db.read(QueryOne(_ARTIFACT, (negotiation_id, kind, version)))
        return None if row is None else artifact_from_row(ARTIFACTS.of(row))

    async def list(self, negotiation_id: str, kind: str | None = None) -> list[ArtifactRecord]:
        """The negotiation's artifacts (of `kind`, when given) in append order."""
        sql, params = _ARTIFACTS, [negotiation_id]
        if kind is not None:
            sql, params = f"{sql} AND kind = ?", [negotiation_id, kind]
        rows = await self._db.read(Query(f"{sql} ORDER BY seq", params))
        return [artifact_from_row(ARTIFACTS.of(row)) for row in rows]


def _save(
    d: Dialect, row: NegotiationRow, extra: RoundRow | None, artifacts: list[ArtifactRow]
) -> Transaction[list[bool]]:
    yield from Execute(_PUT, row)
    if extra is not None:
        yield from Execute(_PUT_ROUND, extra)
    added: list[bool] = []
    for artifact in artifacts:
        added.append((yield from Execute(_APPEND, artifact)) == 1)
    return added


def _save_with_events(
    d: Dialect,
    row: NegotiationRow,
    extra: RoundRow | None,
    artifacts: list[ArtifactRow],
    events: list[tuple[Any, ...]],
    artifact_events: list[tuple[Any, ...]],
) -> Transaction[tuple[list[bool], int]]:
    """`_save`, then the append of `events` and of the `artifact_events` of the artifacts
    added (`event_rows`); whether each artifact was added, and the first event's sequence
    (0: none was appended)."""
    added = yield from _save(d, row, extra, artifacts)
    chosen = [*events, *added_only(artifact_events, added)]
    first = (yield from append_events(d, chosen)) if chosen else 0
    return added, first


def _append(d: Dialect, row: ArtifactRow, events: list[tuple[Any, ...]]) -> Transaction[int]:
    """Append the artifact and then `events` (`event_rows`); the first event's sequence, 0
    when the artifact was held (nothing appended)."""
    if (yield from Execute(_APPEND, row)) == 0:
        return 0
    return (yield from append_events(d, events))


def check_artifact_events(
    artifacts: Sequence[ArtifactRecord], artifact_events: Sequence[EventDraft]
) -> None:
    """ValueError unless `artifact_events` is empty or holds one event per artifact."""
    if artifact_events and len(artifact_events) != len(artifacts):
        raise ValueError(
            f"artifact_events: {len(artifact_events)} events for {len(artifacts)} artifacts"
            " (give one per artifact, or none)"
        )


def added_only(items: Sequence[T], added: Sequence[bool]) -> list[T]:
    """The `items` (one per artifact, or none) of the artifacts added."""
    return [item for item, new in zip(items, added, strict=False) if new]


def _put_policy(d: Dialect, row: PolicyRow) -> Transaction[None]:
    yield from Execute(_PUT_POLICY, row)


def _replace_profiles(d: Dialect, rows: list[PolicyRow]) -> Transaction[None]:
    yield from Execute("DELETE FROM negotiation_policies WHERE name <> ''")
    yield from ExecuteMany(_PUT_POLICY, rows)
