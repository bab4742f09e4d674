"""The SQLite room store: tables room_policies, room_proposals, room_votes, room_decisions."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from apiary.core.rooms.records import (
    DecisionRecord,
    PolicyVersionRecord,
    ProposalRecord,
    VoteRecord,
)
from apiary.store.errors import StoreError
from apiary.store.json_codec import load_json_object
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
from apiary.store.sqlite.database import SqliteDatabase

_PUT_PROPOSAL = (
    f"INSERT OR REPLACE INTO room_proposals ({PROPOSAL_COLUMNS})"
    f" VALUES ({markers(PROPOSAL_COLUMNS, '?')})"
)
_ADD_VOTE = f"INSERT INTO room_votes ({VOTE_COLUMNS}) VALUES ({markers(VOTE_COLUMNS, '?')})"
_ADD_DECISION = (
    f"INSERT INTO room_decisions ({DECISION_COLUMNS}) VALUES ({markers(DECISION_COLUMNS, '?')})"
)


class SqliteRoomStore:
    """`RoomStore` in four tables; JSON fields are JSON text, the artifact a BLOB.

    Duplicate votes and decisions are refused by the primary keys (StoreError).
    """

    def __init__(self, database: SqliteDatabase) -> None:
        self._db = database

    async def put_policy(self, record: PolicyVersionRecord) -> bool:
        return await self._db.call(_put_policy, policy_row(record))

    async def get_policy(self, version: str) -> PolicyVersionRecord | None:
        sql = f"SELECT {POLICY_COLUMNS} FROM room_policies WHERE version = ?"
        row = await self._db.read(lambda conn: conn.execute(sql, (version,)).fetchone())
        return None if row is None else policy_from_row(row)

    async def list_policies(self) -> list[PolicyVersionRecord]:
        sql = f"SELECT {POLICY_COLUMNS} FROM room_policies ORDER BY created_at, version"
        rows = await self._db.read(lambda conn: conn.execute(sql).fetchall())
        return [policy_from_row(row) for row in rows]

    async def put_proposal(self, record: ProposalRecord) -> None:
        row = proposal_row(record)
        await self._db.execute(_PUT_PROPOSAL, row)

    async def get_proposal(self, artifact_id: str) -> ProposalRecord | None:
        sql = f"SELECT {PROPOSAL_COLUMNS} FROM room_proposals WHERE artifact_id = ?"
        row = await self._db.read(lambda conn: conn.execute(sql, (artifact_id,)).fetchone())
        return None if row is None else proposal_from_row(row)

    async def list_proposals(
        self,
        states: frozenset[str] | None = None,
        room_id: str | None = None,
        after_created: float = 0.0,
        limit: int = 100,
    ) -> list[ProposalRecord]:
        check_limit(limit)
        terms = proposal_list_clauses(states, room_id, after_created, "?")
        if terms is None:
            return []
        clauses, params = terms
        sql = (
            f"SELECT {PROPOSAL_COLUMNS} FROM room_proposals WHERE {' AND '.join(clauses)}"
            " ORDER BY created_at, artifact_id LIMIT ?"
        )
        params.append(limit)
        rows = await self._db.read(lambda conn: conn.execute(sql, params).fetchall())
        return [proposal_from_row(row) for row in rows]

    async def add_vote(self, vote: VoteRecord) -> None:
        row = vote_row(vote)
        await self._db.call(_insert, _ADD_VOTE, row, "vote")

    async def votes(self, artifact_id: str) -> list[VoteRecord]:
        sql = (
            f"SELECT {VOTE_COLUMNS} FROM room_votes WHERE artifact_id = ?"
            " ORDER BY voted_at, critic_id"
        )
        rows = await self._db.read(lambda conn: conn.execute(sql, (artifact_id,)).fetchall())
        return [vote_from_row(row) for row in rows]

    async def decide(self, proposal: ProposalRecord, decision: DecisionRecord) -> None:
        proposal_values = proposal_row(proposal)
        decision_values = decision_row(decision)
        await self._db.call(_decide, proposal_values, decision_values)

    async def decisions(self, artifact_id: str) -> list[DecisionRecord]:
        sql = (
            f"SELECT {DECISION_COLUMNS} FROM room_decisions WHERE artifact_id = ? ORDER BY sequence"
        )
        rows = await self._db.read(lambda conn: conn.execute(sql, (artifact_id,)).fetchall())
        return [decision_from_row(row) for row in rows]


def _put_policy(conn: sqlite3.Connection, row: Sequence[Any]) -> bool:
    found = conn.execute(
        "SELECT settings FROM room_policies WHERE version = ?", (row[0],)
    ).fetchone()
    if found is None:
        conn.execute(f"INSERT INTO room_policies ({POLICY_COLUMNS}) VALUES (?, ?, ?)", row)
        return True
    if load_json_object(found[0]) != load_json_object(row[1]):
        raise StoreError(f"policy version {row[0]!r} names other settings")
    return False


def _decide(
    conn: sqlite3.Connection, proposal_values: Sequence[Any], decision_values: Sequence[Any]
) -> None:
    # One job is one savepoint: the refused decision undoes the proposal's change.
    _insert(conn, _ADD_DECISION, decision_values, "decision")
    conn.execute(_PUT_PROPOSAL, proposal_values)


def _insert(conn: sqlite3.Connection, sql: str, row: Sequence[Any], what: str) -> int:
    try:
        return conn.execute(sql, row).rowcount
    except sqlite3.IntegrityError as exc:
        raise StoreError(f"this {what} is already recorded ({row[0]!r}, {row[1]!r})") from exc
