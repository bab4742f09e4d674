"""The tool store: `tool_providers` and `tools`, one row per provider and per tool.

The rows are shared with the memory backend, which runs them so that it refuses what the
SQL backends refuse.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from apiary.core.tools.descriptor import ToolDescriptor, ToolProviderRecord
from apiary.store.json_codec import dump_json, json_object_of
from apiary.store.sql.checks import checked_count
from apiary.store.sql.columns import Columns, Json
from apiary.store.sql.database import SqlDatabase
from apiary.store.sql.dialect import Dialect, by_dialect
from apiary.store.sql.statements import Execute, ExecuteMany, Query, QueryOne, Transaction


class ProviderRow(NamedTuple):
    """A row of `tool_providers`."""

    provider_id: str
    kind: str
    registered_at: float
    updated_at: float
    registered_by: str
    config: Json


class ToolRow(NamedTuple):
    """A row of `tools`; `position` keeps the provider's order."""

    provider_id: str
    position: int
    tool_name: str
    input_schema: str
    output_schema: str
    idempotent: bool
    needs_worktree: bool
    default_timeout_s: int
    max_concurrency: int
    side_effects: str
    description: str


PROVIDERS = Columns(ProviderRow, json=("config",))
TOOLS = Columns(ToolRow)


def provider_row(record: ToolProviderRecord) -> tuple[Any, ...]:
    """The values of the PROVIDERS columns for `record`, in their order; ValueError when
    `config` is not a JSON object."""
    return (
        record.provider_id,
        str(record.kind),
        float(record.registered_at),
        float(record.updated_at),
        record.registered_by,
        dump_json(record.config),
    )


def tool_rows(record: ToolProviderRecord) -> list[tuple[Any, ...]]:
    """The values of the TOOLS columns of each of the provider's tools, in its order;
    ValueError when two tools share a name (the table's unique key) or a count does not fit
    a non-negative 64-bit integer."""
    names = [tool.tool_name for tool in record.tools]
    if len(set(names)) != len(names):
        raise ValueError(f"provider {record.provider_id!r} names a tool twice: {names}")
    return [
        (
            record.provider_id,
            position,
            tool.tool_name,
            tool.input_schema,
            tool.output_schema,
            bool(tool.idempotent),
            bool(tool.needs_worktree),
            checked_count("default_timeout_s", tool.default_timeout_s),
            checked_count("max_concurrency", tool.max_concurrency),
            tool.side_effects,
            tool.description,
        )
        for position, tool in enumerate(record.tools)
    ]


def tool_from_row(fetched: Sequence[Any]) -> ToolDescriptor:
    """A descriptor from its row."""
    row = TOOLS.of(fetched)
    return ToolDescriptor(
        tool_name=row.tool_name,
        input_schema=row.input_schema,
        output_schema=row.output_schema,
        idempotent=bool(row.idempotent),
        needs_worktree=bool(row.needs_worktree),
        default_timeout_s=int(row.default_timeout_s),
        max_concurrency=int(row.max_concurrency),
        side_effects=row.side_effects,
        description=row.description,
    )


def provider_from_rows(
    fetched: Sequence[Any], tools: Sequence[Sequence[Any]]
) -> ToolProviderRecord:
    """A record from its provider row and its tools' rows in position order."""
    row = PROVIDERS.of(fetched)
    return ToolProviderRecord(
        provider_id=row.provider_id,
        kind=row.kind,
        registered_at=float(row.registered_at),
        updated_at=float(row.updated_at),
        tools=tuple(tool_from_row(t) for t in tools),
        registered_by=row.registered_by,
        config=json_object_of(row.config),
    )


_PUT_PROVIDER = by_dialect(lambda d: d.upsert("tool_providers", PROVIDERS, "provider_id"))
_PUT_TOOL = by_dialect(lambda d: d.insert("tools", TOOLS))
_DELETE_TOOLS = "DELETE FROM tools WHERE provider_id = ?"
_DELETE_PROVIDER = "DELETE FROM tool_providers WHERE provider_id = ?"
_PROVIDER = f"SELECT {PROVIDERS.sql} FROM tool_providers WHERE provider_id = ?"
_TOOLS_OF = f"SELECT {TOOLS.sql} FROM tools WHERE provider_id = ? ORDER BY position"
_ALL_PROVIDERS = f"SELECT {PROVIDERS.sql} FROM tool_providers ORDER BY provider_id"
_ALL_TOOLS = f"SELECT {TOOLS.sql} FROM tools ORDER BY provider_id, position"


class SqlToolStore:
    """`ToolStore` in two tables; a put or delete is one transaction."""

    def __init__(self, database: SqlDatabase) -> None:
        self._db = database

    async def put(self, record: ToolProviderRecord) -> None:
        """Insert or replace the provider and all of its tools."""
        provider, tools = provider_row(record), tool_rows(record)
        await self._db.write(_put, record.provider_id, provider, tools)

    async def get(self, provider_id: str) -> ToolProviderRecord | None:
        """The provider with its tools in registration order, or None."""
        return await self._db.read(_get, provider_id)

    async def list(self) -> list[ToolProviderRecord]:
        """Every provider, ordered by provider_id."""
        return await self._db.read(_list)

    async def delete(self, provider_id: str) -> bool:
        """Remove the provider and its tools; False when it was not there."""
        return await self._db.write(_delete, provider_id)


def _put(
    d: Dialect, provider_id: str, provider: tuple[Any, ...], tools: list[tuple[Any, ...]]
) -> Transaction[None]:
    yield from Execute(_DELETE_TOOLS, (provider_id,))
    yield from Execute(_PUT_PROVIDER, provider)
    yield from ExecuteMany(_PUT_TOOL, tools)


def _get(d: Dialect, provider_id: str) -> Transaction[ToolProviderRecord | None]:
    row = yield from QueryOne(_PROVIDER, (provider_id,))
    if row is None:
        return None
    tools = yield from Query(_TOOLS_OF, (provider_id,))
    return provider_from_rows(row, tools)


def _list(d: Dialect) -> Transaction[list[ToolProviderRecord]]:
    providers = yield from Query(_ALL_PROVIDERS)
    tools = yield from Query(_ALL_TOOLS)
    grouped: dict[str, list[ToolRow]] = {}
    for tool in map(TOOLS.of, tools):
        grouped.setdefault(tool.provider_id, []).append(tool)
    rows = map(PROVIDERS.of, providers)
    return [provider_from_rows(p, grouped.get(p.provider_id, [])) for p in rows]


def _delete(d: Dialect, provider_id: str) -> Transaction[bool]:
    yield from Execute(_DELETE_TOOLS, (provider_id,))
    deleted = yield from Execute(_DELETE_PROVIDER, (provider_id,))
    return deleted > 0
