"""Rows of the `tool_providers` and `tools` tables, shared by the SQL backends (and run by the
memory backend, so that it refuses what they refuse)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from apiary.core.tools.descriptor import ToolDescriptor, ToolProviderRecord
from apiary.store.json_codec import dump_json, load_json_object

PROVIDER_COLUMNS: Final = "provider_id, kind, registered_at, updated_at, registered_by, config"
PROVIDER_COLUMN_COUNT: Final = 6
TOOL_COLUMNS: Final = (
    "provider_id, position, tool_name, input_schema, output_schema, idempotent,"
    " needs_worktree, default_timeout_s, max_concurrency, side_effects, description"
)
TOOL_COLUMN_COUNT: Final = 11
_INT64_MAX: Final = (1 << 63) - 1


def _count(name: str, value: int) -> int:
    number = int(value)
    if not 0 <= number <= _INT64_MAX:
        raise ValueError(f"{name} must be a non-negative 64-bit integer: {value}")
    return number


def provider_row(record: ToolProviderRecord) -> tuple[Any, ...]:
    """The values of PROVIDER_COLUMNS; ValueError when `config` is not a JSON object."""
    return (
        record.provider_id,
        str(record.kind),
        float(record.registered_at),
        float(record.updated_at),
        record.registered_by,
        dump_json(record.config),
    )


def tool_rows(record: ToolProviderRecord) -> list[tuple[Any, ...]]:
    """The values of TOOL_COLUMNS for each tool, `position` keeping the provider's order;
    ValueError when two tools share a name (the tables' unique key)."""
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
            _count("default_timeout_s", tool.default_timeout_s),
            _count("max_concurrency", tool.max_concurrency),
            tool.side_effects,
            tool.description,
        )
        for position, tool in enumerate(record.tools)
    ]


def tool_from_row(row: Sequence[Any]) -> ToolDescriptor:
    """A descriptor from a row of TOOL_COLUMNS (the first two columns are ignored)."""
    _, _, name, input_schema, output_schema, idempotent, needs_worktree = row[:7]
    default_timeout_s, max_concurrency, side_effects, description = row[7:]
    return ToolDescriptor(
        tool_name=name,
        input_schema=input_schema,
        output_schema=output_schema,
        idempotent=bool(idempotent),
        needs_worktree=bool(needs_worktree),
        default_timeout_s=int(default_timeout_s),
        max_concurrency=int(max_concurrency),
        side_effects=side_effects,
        description=description,
    )


def provider_from_rows(row: Sequence[Any], tools: Sequence[Sequence[Any]]) -> ToolProviderRecord:
    """A record from its PROVIDER_COLUMNS row and its tools' rows in position order."""
    provider_id, kind, registered_at, updated_at, registered_by, config = row
    return ToolProviderRecord(
        provider_id=provider_id,
        kind=kind,
        registered_at=float(registered_at),
        updated_at=float(updated_at),
        tools=tuple(tool_from_row(t) for t in tools),
        registered_by=registered_by,
        config=dict(config) if isinstance(config, Mapping) else load_json_object(config),
    )


def group_tools(rows: Sequence[Sequence[Any]]) -> dict[str, list[Sequence[Any]]]:
    """Tool rows (ordered by provider_id, position) grouped by provider."""
    grouped: dict[str, list[Sequence[Any]]] = {}
    for row in rows:
        grouped.setdefault(row[0], []).append(row)
    return grouped
