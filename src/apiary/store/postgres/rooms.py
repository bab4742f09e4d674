"""The PostgreSQL room store: tables room_policies, room_proposals, room_votes,
room_decisions (JSON fields JSONB, the artifact BYTEA)."""

from __future__ import annotations

from apiary.core.rooms.records import (
    DecisionRecord,
    PolicyVersionRecord,
    ProposalRecord,
    VoteRecord,
)
from apiary.store.errors import StoreError
from apiary.store.json_codec import load_json_object
from apiary.store.postgres.pool import PostgresPool, fetch_all, fetch_rows
from apiary.store.room_rows import (
    DECISION_COLUMNS,
    POLICY_COLUMNS,
    PROPOSAL_COLUMNS,
    VOTE_COLUMNS,
    decision_from_row,
    decision_row,
    markers,
    policy_from_row,
    policy_row,
    proposal_from_row,
    proposal_list_clauses,
    proposal_row,
    vote_from_row,
    vote_row,
)
from apiary.store.sql_rows import check_limit

_JSONB = "::jsonb"
_PROPOSAL_NAMES = PROPOSAL_COLUMNS.split(", ")
_PUT_PROPOSAL = (
    f"INSERT INTO room_proposals ({PROPOSAL_COLUMNS})"
    f" VALUES ({markers(PROPOSAL_COLUMNS, '%s', _JSONB)})"
    " ON CONFLICT (artifact_id) DO UPDATE SET "
    + ", ".join(f"{c} = EXCLUDED.{c}" for c in _PROPOSAL_NAMES if c != "artifact_id")
)
_ADD_POLICY = (
    f"INSERT INTO room_policies ({POLICY_COLUMNS}) VALUES ({markers(POLICY_COLUMNS, '%s', _JSONB)})"
    " ON CONFLICT (version) DO NOTHING RETURNING version"
)
_ADD_VOTE = (
    f"INSERT INTO room_votes ({VOTE_COLUMNS}) VALUES ({markers(VOTE_COLUMNS, '%s', _JSONB)})"
)
_ADD_DECISION = (
    f"INSERT INTO room_decisions ({DECISION_COLUMNS})"
    f" VALUES ({markers(DECISION_COLUMNS, '%s', _JSONB)})"
)


class PostgresRoomStore:
    """`RoomStore` in four tables; duplicates are refused by the primary keys (StoreError)."""

    def __init__(self, pool: PostgresPool) -> None:
        self._pool = pool

    async def put_policy(self, record: PolicyVersionRecord) -> bool:
        row = policy_row(record)
        async with self._pool.connection() as conn, conn.transaction():
            if await fetch_rows(conn, _ADD_POLICY, row):
                return True
            (found,) = await fetch_rows(
                conn, "SELECT settings FROM room_policies WHERE version = %s", [row[0]]
            )
        if dict(found[0]) != load_json_object(row[1]):
            raise StoreError(f"policy version {row[0]!r} names other settings")
        return False

    async def get_policy(self, version: str) -> PolicyVersionRecord | None:
        query = f"SELECT {POLICY_COLUMNS} FROM room_policies WHERE version = %s"
        rows = await fetch_all(self._pool, query, [version])
        return policy_from_row(rows[0]) if rows else None

    async def list_policies(self) -> list[PolicyVersionRecord]:
        query = f"SELECT {POLICY_COLUMNS} FROM room_policies ORDER BY created_at, version"
        return [policy_from_row(row) for row in await fetch_all(self._pool, query, [])]

    async def put_proposal(self, record: ProposalRecord) -> None:
        row = proposal_row(record)
        async with self._pool.connection() as conn:
            await conn.execute(_PUT_PROPOSAL, row)

    async def get_proposal(self, artifact_id: str) -> ProposalRecord | None:
        query = f"SELECT {PROPOSAL_COLUMNS} FROM room_proposals WHERE artifact_id = %s"
        rows = await fetch_all(self._pool, query, [artifact_id])
        return proposal_from_row(rows[0]) if rows else None

    async def list_proposals(
        self,
        states: frozenset[str] | None = None,
        room_id: str | None = None,
        after_created: float = 0.0,
        limit: int = 100,
    ) -> list[ProposalRecord]:
        check_limit(limit)
        terms = proposal_list_clauses(states, room_id, after_created, "%s")
        if terms is None:
            return []
        clauses, params = terms
        query = (
            f"SELECT {PROPOSAL_COLUMNS} FROM room_proposals WHERE {' AND '.join(clauses)}"
            " ORDER BY created_at, artifact_id LIMIT %s"
        )
        params.append(limit)
        return [proposal_from_row(row) for row in await fetch_all(self._pool, query, params)]

    async def add_vote(self, vote: VoteRecord) -> None:
        row = vote_row(vote)
        async with self._pool.connection() as conn:
            await conn.execute(_ADD_VOTE, row)

    async def votes(self, artifact_id: str) -> list[VoteRecord]:
        query = (
            f"SELECT {VOTE_COLUMNS} FROM room_votes WHERE artifact_id = %s"
            " ORDER BY voted_at, critic_id"
        )
        return [vote_from_row(row) for row in await fetch_all(self._pool, query, [artifact_id])]

    async def decide(self, proposal: ProposalRecord, decision: DecisionRecord) -> None:
        proposal_values = proposal_row(proposal)
        decision_values = decision_row(decision)
        async with self._pool.connection() as conn, conn.transaction():
            await conn.execute(_ADD_DECISION, decision_values)
            await conn.execute(_PUT_PROPOSAL, proposal_values)

    async def decisions(self, artifact_id: str) -> list[DecisionRecord]:
        query = (
            f"SELECT {DECISION_COLUMNS} FROM room_decisions WHERE artifact_id = %s"
            " ORDER BY sequence"
        )
        rows = await fetch_all(self._pool, query, [artifact_id])
        return [decision_from_row(row) for row in rows]
