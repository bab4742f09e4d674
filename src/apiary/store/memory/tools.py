"""The in-memory tool providers (part of `MemoryStore`)."""

from __future__ import annotations

import dataclasses

from apiary.core.tools.descriptor import ToolProviderRecord
from apiary.store.memory.copies import json_copy
from apiary.store.sql.tools import provider_from_rows, provider_row, tool_rows


class MemoryToolStore:
    """`ToolStore` over a dict keyed by provider_id."""

    def __init__(self) -> None:
        self._records: dict[str, ToolProviderRecord] = {}

    async def put(self, record: ToolProviderRecord) -> None:
        """Insert or replace the provider and all of its tools."""
        # Through the SQL rows and back: refuses and coerces as the SQL backends do.
        stored = provider_from_rows(provider_row(record), tool_rows(record))
        self._records[stored.provider_id] = stored

    async def get(self, provider_id: str) -> ToolProviderRecord | None:
        found = self._records.get(provider_id)
        return None if found is None else self._copy(found)

    async def list(self) -> list[ToolProviderRecord]:
        """Every provider, ordered by provider_id."""
        return [self._copy(self._records[k]) for k in sorted(self._records)]

    async def delete(self, provider_id: str) -> bool:
        return self._records.pop(provider_id, None) is not None

    @staticmethod
    def _copy(record: ToolProviderRecord) -> ToolProviderRecord:
        return dataclasses.replace(record, config=json_copy(record.config))
