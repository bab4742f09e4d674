"""The negotiation-room store (RFC 17.5): `room_policies`, `room_proposals`, `room_votes` and
`room_decisions`.

JSON fields are JSON text (SQLite) or JSONB (PostgreSQL), the artifact a BLOB or BYTEA. The
rows are shared with the memory backend, which runs them so that it refuses and coerces
what the SQL backends do. Duplicate votes and decisions are refused by the primary keys.
A proposal, a vote or a decision commits with the events it is given
(`SqlEventLog.write_with`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from apiary.core.events import EventDraft
from apiary.core.rooms.records import (
    DecisionRecord,
    PolicyVersionRecord,
    ProposalRecord,
    RoomState,
    VoteRecord,
)
from apiary.core.vote_aggregation import AggregatedScore
from apiary.store.errors import StoreError
from apiary.store.json_codec import (
    dump_json,
    dump_json_list,
    json_list_of,
    json_object_of,
    load_json_object,
)
from apiary.store.sql.checks import check_limit, checked_strings
from apiary.store.sql.columns import Columns, Json
from apiary.store.sql.database import SqlDatabase
from apiary.store.sql.dialect import Dialect, Sql, by_dialect
from apiary.store.sql.events import SqlEventLog
from apiary.store.sql.statements import Execute, Query, QueryOne, Transaction
from apiary.store.sql.where import Where


class PolicyRow(NamedTuple):
    """A row of `room_policies`: one version of the room policy."""

    version: str
    settings: Json
    created_at: float


class ProposalRow(NamedTuple):
    """A row of `room_proposals`."""

    artifact_id: str
    negotiation_room_id: str
    artifact_type: str
    producer_id: str
    artifact: bytes
    artifact_content_type: str
    requested_critics: Json
    created_at: float
    state: str
    updated_at: float
    policy_version: str
    vote_deadline: float
    invocation_id: str


class VoteRow(NamedTuple):
    """A row of `room_votes`."""

    artifact_id: str
    critic_id: str
    score: float
    confidence: float
    passed: bool
    strengths: Json
    weaknesses: Json
    recommendations: Json
    negotiation_room_id: str
    voted_at: float


class DecisionRow(NamedTuple):
    """A row of `room_decisions`; the votes it was based on are kept with it as JSON."""

    artifact_id: str
    sequence: int
    negotiation_room_id: str
    outcome: str
    votes: Json
    aggregated_score: Json
    policy_version: str
    reason: str
    decided_at: float
    decided_by: str
    via: str
    triggers: Json
    invocation_id: str
    details: Json


POLICIES = Columns(PolicyRow, json=("settings",))
PROPOSALS = Columns(ProposalRow, json=("requested_critics",))
VOTES = Columns(VoteRow, json=("strengths", "weaknesses", "recommendations"))
DECISIONS = Columns(DecisionRow, json=("votes", "aggregated_score", "triggers", "details"))


def policy_row(record: PolicyVersionRecord) -> PolicyRow:
    """The policy version's row; ValueError for a version without a name."""
    if not record.version:
        raise ValueError("a policy version needs a name")
    return PolicyRow(record.version, dump_json(record.settings), float(record.created_at))


def policy_from_row(row: PolicyRow) -> PolicyVersionRecord:
    """The policy version of a row."""
    return PolicyVersionRecord(row.version, json_object_of(row.settings), row.created_at)


def proposal_row(record: ProposalRecord) -> ProposalRow:
    """The proposal's row; ValueError for a state that is not a RoomState."""
    return ProposalRow(
        artifact_id=record.artifact_id,
        negotiation_room_id=record.negotiation_room_id,
        artifact_type=record.artifact_type,
        producer_id=record.producer_id,
        artifact=bytes(record.artifact),
        artifact_content_type=record.artifact_content_type,
        requested_critics=dump_json_list(
            checked_strings("requested_critics", record.requested_critics)
        ),
        created_at=float(record.created_at),
        state=RoomState(record.state).value,
        updated_at=float(record.updated_at),
        policy_version=record.policy_version,
        vote_deadline=float(record.vote_deadline),
        invocation_id=record.invocation_id,
    )


def proposal_from_row(row: ProposalRow) -> ProposalRecord:
    """The proposal of a row."""
    return ProposalRecord(
        artifact_id=row.artifact_id,
        negotiation_room_id=row.negotiation_room_id,
        artifact_type=row.artifact_type,
        producer_id=row.producer_id,
        artifact=bytes(row.artifact),
        artifact_content_type=row.artifact_content_type,
        requested_critics=tuple(str(c) for c in json_list_of(row.requested_critics)),
        created_at=row.created_at,
        state=row.state,
        updated_at=row.updated_at,
        policy_version=row.policy_version,
        vote_deadline=row.vote_deadline,
        invocation_id=row.invocation_id,
    )


def vote_row(vote: VoteRecord) -> VoteRow:
    """The vote's row; ValueError when a list holds anything but str."""
    return VoteRow(
        artifact_id=vote.artifact_id,
        critic_id=vote.critic_id,
        score=float(vote.score),
        confidence=float(vote.confidence),
        passed=bool(vote.passed),
        strengths=dump_json_list(checked_strings("strengths", vote.strengths)),
        weaknesses=dump_json_list(checked_strings("weaknesses", vote.weaknesses)),
        recommendations=dump_json_list(checked_strings("recommendations", vote.recommendations)),
        negotiation_room_id=vote.negotiation_room_id,
        voted_at=float(vote.voted_at),
    )


def vote_from_row(row: VoteRow) -> VoteRecord:
    """The vote of a row."""
    return VoteRecord(
        artifact_id=row.artifact_id,
        critic_id=row.critic_id,
        score=row.score,
        confidence=row.confidence,
        passed=bool(row.passed),
        strengths=tuple(str(s) for s in json_list_of(row.strengths)),
        weaknesses=tuple(str(s) for s in json_list_of(row.weaknesses)),
        recommendations=tuple(str(s) for s in json_list_of(row.recommendations)),
        negotiation_room_id=row.negotiation_room_id,
        voted_at=row.voted_at,
    )


def decision_row(decision: DecisionRecord) -> DecisionRow:
    """The decision's row, the votes it was based on as JSON; ValueError for a sequence
    below 1."""
    if decision.sequence < 1:
        raise ValueError(f"a decision's sequence starts at 1, got {decision.sequence}")
    scores = decision.aggregated_score
    return DecisionRow(
        artifact_id=decision.artifact_id,
        sequence=int(decision.sequence),
        negotiation_room_id=decision.negotiation_room_id,
        outcome=decision.outcome,
        votes=dump_json_list([_vote_json(v) for v in decision.votes]),
        aggregated_score=dump_json(scores.as_dict() if scores else {}),
        policy_version=decision.policy_version,
        reason=decision.reason,
        decided_at=float(decision.decided_at),
        decided_by=decision.decided_by,
        via=decision.via,
        triggers=dump_json_list(checked_strings("triggers", decision.triggers)),
        invocation_id=decision.invocation_id,
        details=dump_json(decision.details),
    )


def decision_from_row(row: DecisionRow) -> DecisionRecord:
    """The decision of a row."""
    scores = json_object_of(row.aggregated_score)
    return DecisionRecord(
        artifact_id=row.artifact_id,
        sequence=row.sequence,
        negotiation_room_id=row.negotiation_room_id,
        outcome=row.outcome,
        votes=tuple(_vote_from_json(v) for v in json_list_of(row.votes)),
        aggregated_score=_scores(scores) if scores else None,
        policy_version=row.policy_version,
        reason=row.reason,
        decided_at=row.decided_at,
        decided_by=row.decided_by,
        via=row.via,
        triggers=tuple(str(t) for t in json_list_of(row.triggers)),
        invocation_id=row.invocation_id,
        details=json_object_of(row.details),
    )


def _scores(found: Mapping[str, Any]) -> AggregatedScore:
    return AggregatedScore(
        mean=float(found["mean"]),
        min_score=float(found["min_score"]),
        max_score=float(found["max_score"]),
        std_dev=float(found["std_dev"]),
        weighted_mean=float(found["weighted_mean"]),
        vote_count=int(found["vote_count"]),
    )


def _vote_json(vote: VoteRecord) -> dict[str, Any]:
    return {
        "artifact_id": vote.artifact_id,
        "critic_id": vote.critic_id,
        "score": float(vote.score),
        "confidence": float(vote.confidence),
        "passed": bool(vote.passed),
        "strengths": list(checked_strings("strengths", vote.strengths)),
        "weaknesses": list(checked_strings("weaknesses", vote.weaknesses)),
        "recommendations": list(checked_strings("recommendations", vote.recommendations)),
        "negotiation_room_id": vote.negotiation_room_id,
        "voted_at": float(vote.voted_at),
    }


def _vote_from_json(value: Any) -> VoteRecord:
    if not isinstance(value, dict):
        raise StoreError(f"a stored decision's vote is not a JSON object: {type(value).__name__}")
    return VoteRecord(
        artifact_id=str(value["artifact_id"]),
        critic_id=str(value["critic_id"]),
        score=float(value["score"]),
        confidence=float(value["confidence"]),
        passed=bool(value["passed"]),
        strengths=tuple(str(s) for s in value["strengths"]),
        weaknesses=tuple(str(s) for s in value["weaknesses"]),
        recommendations=tuple(str(s) for s in value["recommendations"]),
        negotiation_room_id=str(value["negotiation_room_id"]),
        voted_at=float(value["voted_at"]),
    )


_ADD_POLICY = by_dialect(
    lambda d: d.insert("room_policies", POLICIES, " ON CONFLICT (version) DO NOTHING")
)
_PUT_PROPOSAL = by_dialect(lambda d: d.upsert("room_proposals", PROPOSALS, "artifact_id"))
# DO NOTHING, then the row count: a duplicate is told apart from any other failure
# without the database's error (which would abort a PostgreSQL transaction).
_ADD_VOTE = by_dialect(lambda d: d.insert("room_votes", VOTES, " ON CONFLICT DO NOTHING"))
_ADD_DECISION = by_dialect(
    lambda d: d.insert("room_decisions", DECISIONS, " ON CONFLICT DO NOTHING")
)
_SETTINGS = "SELECT settings FROM room_policies WHERE version = ?"
_POLICY = f"SELECT {POLICIES.sql} FROM room_policies WHERE version = ?"
_POLICIES = f"SELECT {POLICIES.sql} FROM room_policies ORDER BY created_at, version"
_PROPOSAL = f"SELECT {PROPOSALS.sql} FROM room_proposals WHERE artifact_id = ?"
_VOTES = f"SELECT {VOTES.sql} FROM room_votes WHERE artifact_id = ? ORDER BY voted_at, critic_id"
_DECISIONS = f"SELECT {DECISIONS.sql} FROM room_decisions WHERE artifact_id = ? ORDER BY sequence"


class SqlRoomStore:
    """`RoomStore` in four tables; a decision and its proposal's change are one
    transaction. Events that commit with a change go through `log`."""

    def __init__(self, database: SqlDatabase, log: SqlEventLog) -> None:
        self._db = database
        self._log = log

    async def put_policy(self, record: PolicyVersionRecord) -> bool:
        """Record a policy version; False when it was recorded with the same settings,
        StoreError when with other settings."""
        return await self._db.write(_put_policy, policy_row(record))

    async def get_policy(self, version: str) -> PolicyVersionRecord | None:
        """The policy version, or None."""
        row = await self._db.read(QueryOne(_POLICY, (version,)))
        return None if row is None else policy_from_row(POLICIES.of(row))

    async def list_policies(self) -> list[PolicyVersionRecord]:
        """Every policy version, oldest first."""
        rows = await self._db.read(Query(_POLICIES))
        return [policy_from_row(POLICIES.of(row)) for row in rows]

    async def put_proposal(self, record: ProposalRecord, events: Sequence[EventDraft] = ()) -> None:
        """Insert or replace the proposal with this artifact_id, with `events`."""
        await self._log.write_with(events, _put_proposal, proposal_row(record))

    async def get_proposal(self, artifact_id: str) -> ProposalRecord | None:
        """The proposal, or None."""
        row = await self._db.read(QueryOne(_PROPOSAL, (artifact_id,)))
        return None if row is None else proposal_from_row(PROPOSALS.of(row))

    async def list_proposals(
        self,
        states: frozenset[str] | None = None,
        room_id: str | None = None,
        after_created: float = 0.0,
        limit: int = 100,
    ) -> list[ProposalRecord]:
        """Proposals in `states` (all when None) of `room_id` (any when None) created after
        `after_created`, oldest first (by created_at, then artifact_id), at most `limit`."""
        check_limit(limit)
        where = (
            Where()
            .term("created_at > ?", float(after_created))
            .compare("negotiation_room_id =", room_id)
            .among("state", states)
        )
        if where.impossible:
            return []
        sql = (
            f"SELECT {PROPOSALS.sql} FROM room_proposals WHERE {where.sql}"
            " ORDER BY created_at, artifact_id LIMIT ?"
        )
        rows = await self._db.read(Query(sql, [*where.params, limit]))
        return [proposal_from_row(PROPOSALS.of(row)) for row in rows]

    async def add_vote(self, vote: VoteRecord, events: Sequence[EventDraft] = ()) -> None:
        """Record a critic's vote with `events`; StoreError when the critic already voted
        (nothing changes)."""
        row = vote_row(vote)
        what = f"vote ({row.artifact_id!r}, {row.critic_id!r})"
        await self._log.write_with(events, _add, _ADD_VOTE, row, what)

    async def votes(self, artifact_id: str) -> list[VoteRecord]:
        """The votes on the artifact, by voted_at, then critic_id."""
        rows = await self._db.read(Query(_VOTES, (artifact_id,)))
        return [vote_from_row(VOTES.of(row)) for row in rows]

    async def decide(
        self,
        proposal: ProposalRecord,
        decision: DecisionRecord,
        events: Sequence[EventDraft] = (),
    ) -> None:
        """Record the decision, the proposal's change and `events` together; StoreError (and
        nothing changed) when a decision with that sequence is recorded."""
        rows = proposal_row(proposal), decision_row(decision)
        await self._log.write_with(events, _decide, *rows)

    async def decisions(self, artifact_id: str) -> list[DecisionRecord]:
        """The artifact's decisions in sequence order."""
        rows = await self._db.read(Query(_DECISIONS, (artifact_id,)))
        return [decision_from_row(DECISIONS.of(row)) for row in rows]


def _put_policy(d: Dialect, row: PolicyRow) -> Transaction[bool]:
    if (yield from Execute(_ADD_POLICY, row)) == 1:
        return True
    found = yield from QueryOne(
        "SELECT settings FROM room_policies WHERE version = ?", (row.version,)
    )
    if found is None or json_object_of(found[0]) != load_json_object(row.settings):
        raise StoreError(f"policy version {row.version!r} names other settings")
    return False


def _put_proposal(d: Dialect, row: ProposalRow) -> Transaction[None]:
    yield from Execute(_PUT_PROPOSAL, row)


def _decide(d: Dialect, proposal: ProposalRow, decision: DecisionRow) -> Transaction[None]:
    # One transaction: the refused decision undoes the proposal's change.
    what = f"decision ({decision.artifact_id!r}, {decision.sequence!r})"
    yield from _add(d, _ADD_DECISION, decision, what)
    yield from Execute(_PUT_PROPOSAL, proposal)


def _add(d: Dialect, sql: Sql, row: tuple[Any, ...], what: str) -> Transaction[None]:
    """Insert `row` with `sql` (which does nothing on a conflict); StoreError when the
    primary key held it already."""
    if (yield from Execute(sql, row)) == 0:
        raise StoreError(f"this {what} is already recorded")
