"""The SQLite negotiation and artifact stores: `negotiations`, `negotiation_rounds`,
`negotiation_policies` and `artifacts`."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

from apiary.core.negotiation.records import ArtifactRecord, NegotiationRecord, RoundRecord
from apiary.store.negotiation_rows import (
    ARTIFACT_COLUMN_COUNT,
    ARTIFACT_COLUMNS,
    NEGOTIATION_COLUMN_COUNT,
    NEGOTIATION_COLUMNS,
    ROUND_COLUMN_COUNT,
    ROUND_COLUMNS,
    artifact_from_row,
    artifact_row,
    negotiation_from_row,
    negotiation_list_clauses,
    negotiation_row,
    policy_from_column,
    policy_text,
    round_from_row,
    round_row,
)
from apiary.store.sql_rows import check_limit
from apiary.store.sqlite.database import SqliteDatabase, placeholders

_PUT = (
    f"INSERT OR REPLACE INTO negotiations ({NEGOTIATION_COLUMNS})"
    f" VALUES ({placeholders(NEGOTIATION_COLUMN_COUNT)})"
)
_PUT_ROUND = (
    f"INSERT OR REPLACE INTO negotiation_rounds ({ROUND_COLUMNS})"
    f" VALUES ({placeholders(ROUND_COLUMN_COUNT)})"
)
_PUT_POLICY = (
    "INSERT OR REPLACE INTO negotiation_policies (name, policy, updated_at) VALUES (?, ?, ?)"
)
_APPEND = (
    f"INSERT INTO artifacts ({ARTIFACT_COLUMNS}) VALUES ({placeholders(ARTIFACT_COLUMN_COUNT)})"
    " ON CONFLICT (negotiation_id, kind, version) DO NOTHING"
)


class SqliteNegotiationStore:
    """`NegotiationStore`; JSON fields are JSON text, payloads BLOBs."""

    def __init__(self, database: SqliteDatabase) -> None:
        self._db = database

    async def save(
        self,
        record: NegotiationRecord,
        round_: RoundRecord | None = None,
        artifacts: Sequence[ArtifactRecord] = (),
    ) -> list[bool]:
        row = negotiation_row(record)
        extra = None if round_ is None else round_row(round_)
        return await self._db.call(_save, row, extra, [artifact_row(a) for a in artifacts])

    async def get(self, negotiation_id: str) -> NegotiationRecord | None:
        sql = f"SELECT {NEGOTIATION_COLUMNS} FROM negotiations WHERE negotiation_id = ?"
        row = await self._db.read(lambda conn: conn.execute(sql, (negotiation_id,)).fetchone())
        return None if row is None else negotiation_from_row(row)

    async def rounds(self, negotiation_id: str) -> list[RoundRecord]:
        sql = (
            f"SELECT {ROUND_COLUMNS} FROM negotiation_rounds WHERE negotiation_id = ?"
            " ORDER BY round_number"
        )
        rows = await self._db.read(lambda conn: conn.execute(sql, (negotiation_id,)).fetchall())
        return [round_from_row(row) for row in rows]

    async def list(
        self, states: frozenset[str] | None = None, after_created: float = 0.0, limit: int = 100
    ) -> list[NegotiationRecord]:
        check_limit(limit)
        terms = negotiation_list_clauses(states, after_created, "?")
        if terms is None:
            return []
        clauses, params = terms
        sql = (
            f"SELECT {NEGOTIATION_COLUMNS} FROM negotiations WHERE {' AND '.join(clauses)}"
            " ORDER BY created_at, negotiation_id LIMIT ?"
        )
        params.append(limit)
        rows = await self._db.read(lambda conn: conn.execute(sql, params).fetchall())
        return [negotiation_from_row(row) for row in rows]

    async def put_policy(self, name: str, policy: Mapping[str, Any], at: float) -> None:
        values = (name, policy_text(policy), float(at))
        await self._db.execute(_PUT_POLICY, values)

    async def replace_profiles(self, profiles: Mapping[str, Mapping[str, Any]], at: float) -> None:
        if "" in profiles:
            raise ValueError("a profile needs a name ('' is the base policy)")
        rows = [(name, policy_text(p), float(at)) for name, p in profiles.items()]
        await self._db.call(_replace_profiles, rows)

    async def policies(self) -> dict[str, dict[str, Any]]:
        sql = "SELECT name, policy FROM negotiation_policies ORDER BY name"
        rows = await self._db.read(lambda conn: conn.execute(sql).fetchall())
        return {name: policy_from_column(text) for name, text in rows}


class SqliteArtifactStore:
    """`ArtifactStore` in the `artifacts` table; contents are BLOBs."""

    def __init__(self, database: SqliteDatabase) -> None:
        self._db = database

    async def append(self, artifact: ArtifactRecord) -> bool:
        row = artifact_row(artifact)
        added: int = await self._db.execute(_APPEND, row)
        return added == 1

    async def get(self, negotiation_id: str, kind: str, version: str) -> ArtifactRecord | None:
        sql = (
            f"SELECT {ARTIFACT_COLUMNS} FROM artifacts"
            " WHERE negotiation_id = ? AND kind = ? AND version = ?"
        )
        key = (negotiation_id, kind, version)
        row = await self._db.read(lambda conn: conn.execute(sql, key).fetchone())
        return None if row is None else artifact_from_row(row)

    async def list(self, negotiation_id: str, kind: str | None = None) -> list[ArtifactRecord]:
        sql = f"SELECT {ARTIFACT_COLUMNS} FROM artifacts WHERE negotiation_id = ?"
        params: list[Any] = [negotiation_id]
        if kind is not None:
            sql += " AND kind = ?"
            params.append(kind)
        sql += " ORDER BY seq"
        rows = await self._db.read(lambda conn: conn.execute(sql, params).fetchall())
        return [artifact_from_row(row) for row in rows]


def _save(
    conn: sqlite3.Connection,
    row: Sequence[Any],
    extra: Sequence[Any] | None,
    artifacts: list[tuple[Any, ...]],
) -> list[bool]:
    conn.execute(_PUT, row)
    if extra is not None:
        conn.execute(_PUT_ROUND, extra)
    return [conn.execute(_APPEND, artifact).rowcount == 1 for artifact in artifacts]


def _replace_profiles(conn: sqlite3.Connection, rows: list[tuple[str, str, float]]) -> None:
    conn.execute("DELETE FROM negotiation_policies WHERE name <> ''")
    conn.executemany(_PUT_POLICY, rows)
