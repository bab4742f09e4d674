"""The PostgreSQL negotiation and artifact stores: `negotiations`, `negotiation_rounds`,
`negotiation_policies` and `artifacts`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from apiary.core.negotiation.records import ArtifactRecord, NegotiationRecord, RoundRecord
from apiary.store.negotiation_rows import (
    ARTIFACT_COLUMN_COUNT,
    ARTIFACT_COLUMNS,
    NEGOTIATION_COLUMNS,
    NEGOTIATION_JSON_COLUMNS,
    ROUND_COLUMNS,
    ROUND_JSON_COLUMNS,
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
from apiary.store.postgres.pool import PostgresPool, fetch_all
from apiary.store.sql_rows import check_limit


def _upsert(table: str, columns: str, json_columns: frozenset[str], key: str) -> str:
    names = columns.split(", ")
    markers = ["%s::jsonb" if c in json_columns else "%s" for c in names]
    keys = key.split(", ")
    return (
        f"INSERT INTO {table} ({columns}) VALUES ({', '.join(markers)})"
        f" ON CONFLICT ({key}) DO UPDATE SET "
        + ", ".join(f"{c} = EXCLUDED.{c}" for c in names if c not in keys)
    )


_PUT = _upsert("negotiations", NEGOTIATION_COLUMNS, NEGOTIATION_JSON_COLUMNS, "negotiation_id")
_PUT_ROUND = _upsert(
    "negotiation_rounds", ROUND_COLUMNS, ROUND_JSON_COLUMNS, "negotiation_id, round_number"
)
_PUT_POLICY = (
    "INSERT INTO negotiation_policies (name, policy, updated_at) VALUES (%s, %s::jsonb, %s)"
    " ON CONFLICT (name) DO UPDATE SET policy = EXCLUDED.policy, updated_at = EXCLUDED.updated_at"
)
_APPEND = (
    f"INSERT INTO artifacts ({ARTIFACT_COLUMNS})"
    f" VALUES ({', '.join(['%s'] * ARTIFACT_COLUMN_COUNT)})"
    " ON CONFLICT (negotiation_id, kind, version) DO NOTHING"
)


class PostgresNegotiationStore:
    """`NegotiationStore`; JSON fields are JSONB, payloads BYTEA."""

    def __init__(self, pool: PostgresPool) -> None:
        self._pool = pool

    async def save(
        self,
        record: NegotiationRecord,
        round_: RoundRecord | None = None,
        artifacts: Sequence[ArtifactRecord] = (),
    ) -> list[bool]:
        row = negotiation_row(record)
        extra = None if round_ is None else round_row(round_)
        added: list[bool] = []
        async with self._pool.connection() as conn, conn.transaction():
            await conn.execute(_PUT, row)
            if extra is not None:
                await conn.execute(_PUT_ROUND, extra)
            for artifact in artifacts:
                cursor = await conn.execute(_APPEND, artifact_row(artifact))
                added.append(cursor.rowcount == 1)
        return added

    async def get(self, negotiation_id: str) -> NegotiationRecord | None:
        query = f"SELECT {NEGOTIATION_COLUMNS} FROM negotiations WHERE negotiation_id = %s"
        rows = await fetch_all(self._pool, query, [negotiation_id])
        return negotiation_from_row(rows[0]) if rows else None

    async def rounds(self, negotiation_id: str) -> list[RoundRecord]:
        query = (
            f"SELECT {ROUND_COLUMNS} FROM negotiation_rounds WHERE negotiation_id = %s"
            " ORDER BY round_number"
        )
        return [round_from_row(r) for r in await fetch_all(self._pool, query, [negotiation_id])]

    async def list(
        self, states: frozenset[str] | None = None, after_created: float = 0.0, limit: int = 100
    ) -> list[NegotiationRecord]:
        check_limit(limit)
        terms = negotiation_list_clauses(states, after_created, "%s")
        if terms is None:
            return []
        clauses, params = terms
        query = (
            f"SELECT {NEGOTIATION_COLUMNS} FROM negotiations WHERE {' AND '.join(clauses)}"
            " ORDER BY created_at, negotiation_id LIMIT %s"
        )
        params.append(limit)
        return [negotiation_from_row(r) for r in await fetch_all(self._pool, query, params)]

    async def put_policy(self, name: str, policy: Mapping[str, Any], at: float) -> None:
        async with self._pool.connection() as conn:
            await conn.execute(_PUT_POLICY, (name, policy_text(policy), float(at)))

    async def replace_profiles(self, profiles: Mapping[str, Mapping[str, Any]], at: float) -> None:
        if "" in profiles:
            raise ValueError("a profile needs a name ('' is the base policy)")
        rows = [(name, policy_text(p), float(at)) for name, p in profiles.items()]
        async with self._pool.connection() as conn, conn.transaction():
            await conn.execute("DELETE FROM negotiation_policies WHERE name <> ''")
            for row in rows:
                await conn.execute(_PUT_POLICY, row)

    async def policies(self) -> dict[str, dict[str, Any]]:
        query = "SELECT name, policy FROM negotiation_policies ORDER BY name"
        return {name: policy_from_column(p) for name, p in await fetch_all(self._pool, query, [])}


class PostgresArtifactStore:
    """`ArtifactStore` in the `artifacts` table; contents are BYTEA."""

    def __init__(self, pool: PostgresPool) -> None:
        self._pool = pool

    async def append(self, artifact: ArtifactRecord) -> bool:
        async with self._pool.connection() as conn:
            cursor = await conn.execute(_APPEND, artifact_row(artifact))
            return cursor.rowcount == 1

    async def get(self, negotiation_id: str, kind: str, version: str) -> ArtifactRecord | None:
        query = (
            f"SELECT {ARTIFACT_COLUMNS} FROM artifacts"
            " WHERE negotiation_id = %s AND kind = %s AND version = %s"
        )
        rows = await fetch_all(self._pool, query, [negotiation_id, kind, version])
        return artifact_from_row(rows[0]) if rows else None

    async def list(self, negotiation_id: str, kind: str | None = None) -> list[ArtifactRecord]:
        query = f"SELECT {ARTIFACT_COLUMNS} FROM artifacts WHERE negotiation_id = %s"
        params: list[Any] = [negotiation_id]
        if kind is not None:
            query += " AND kind = %s"
            params.append(kind)
        query += " ORDER BY seq"
        return [artifact_from_row(r) for r in await fetch_all(self._pool, query, params)]
