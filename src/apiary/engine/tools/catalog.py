"""The tool catalogue: every provider, its tools and the runtime object that runs them
(RFC 18.1). What is registered is stored (the `tools` aggregate) before it is served, so
DescribeTools lists the same providers after a restart."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from apiary.core.clock import Clock
from apiary.core.tools.descriptor import ToolDescriptor, ToolProviderRecord
from apiary.engine.eventlog import EventRecorder
from apiary.engine.tools.providers import ToolProvider
from apiary.errors import NotFoundError, ValidationError
from apiary.store.protocols import ToolStore


@dataclass(frozen=True, slots=True)
class ProviderEntry:
    record: ToolProviderRecord
    provider: ToolProvider

    def tool(self, name: str) -> ToolDescriptor | None:
        return next((t for t in self.record.tools if t.tool_name == name), None)


class ToolCatalog:
    def __init__(self, store: ToolStore, events: EventRecorder, clock: Clock) -> None:
        self._store = store
        self._events = events
        self._clock = clock
        self._entries: dict[str, ProviderEntry] = {}

    async def stored(self) -> list[ToolProviderRecord]:
        """What the store holds (at start-up, before any provider is live)."""
        return await self._store.list()

    def adopt(self, record: ToolProviderRecord, provider: ToolProvider) -> ProviderEntry:
        """Serve a stored provider again without writing it."""
        entry = self._entries[record.provider_id] = ProviderEntry(record, provider)
        return entry

    async def put(
        self,
        provider: ToolProvider,
        tools: tuple[ToolDescriptor, ...],
        *,
        registered_by: str,
        config: Mapping[str, Any] | None = None,
    ) -> ProviderEntry:
        """Store and serve `provider` with `tools` (already validated), replacing any
        earlier registration of its id."""
        now = self._clock.now()
        previous = self._entries.get(provider.provider_id)
        record = ToolProviderRecord(
            provider_id=provider.provider_id,
            kind=provider.kind.value,
            registered_at=previous.record.registered_at if previous else now,
            updated_at=now,
            tools=tools,
            registered_by=registered_by,
            config=dict(config if config is not None else previous.record.config if previous
                        else {}),
        )  # fmt: skip
        await self._store.put(record)
        entry = self._entries[record.provider_id] = ProviderEntry(record, provider)
        await self._events.record(
            "tool.provider_registered", registered_by or "coordinator",
            provider_id=record.provider_id, kind=record.kind,
            tools=[t.tool_name for t in tools],
        )  # fmt: skip
        return entry

    async def update_tools(self, provider_id: str, tools: tuple[ToolDescriptor, ...]) -> None:
        """A provider's tools changed (an MCP server listed them): store the new list."""
        entry = self._entries.get(provider_id)
        if entry is None or entry.record.tools == tools:
            return
        record = replace(entry.record, tools=tools, updated_at=self._clock.now())
        await self._store.put(record)
        self._entries[provider_id] = ProviderEntry(record, entry.provider)
        await self._events.record(
            "tool.provider_updated", "coordinator", provider_id=provider_id,
            tools=[t.tool_name for t in tools],
        )  # fmt: skip

    async def remove(self, provider_id: str) -> ProviderEntry | None:
        entry = self._entries.pop(provider_id, None)
        await self._store.delete(provider_id)
        if entry is not None:
            await self._events.record("tool.provider_removed", "coordinator",
                                      provider_id=provider_id)  # fmt: skip
        return entry

    def get(self, provider_id: str) -> ProviderEntry | None:
        return self._entries.get(provider_id)

    def entries(self) -> list[ProviderEntry]:
        return [self._entries[k] for k in sorted(self._entries)]

    def resolve(self, provider_id: str, tool_name: str) -> tuple[ProviderEntry, ToolDescriptor]:
        """The provider and descriptor a call names; an empty provider_id finds the only
        provider offering `tool_name`."""
        if not tool_name:
            raise ValidationError.for_field("tool_name", "is required")
        if provider_id:
            entry = self._entries.get(provider_id)
            if entry is None:
                raise NotFoundError(f"no tool provider {provider_id!r}",
                                    {"provider_id": provider_id})  # fmt: skip
            tool = entry.tool(tool_name)
            if tool is None:
                raise NotFoundError(
                    f"provider {provider_id!r} has no tool {tool_name!r}",
                    {"provider_id": provider_id, "tool_name": tool_name},
                )
            return entry, tool
        offering = [(e, t) for e in self.entries() if (t := e.tool(tool_name)) is not None]
        if not offering:
            raise NotFoundError(f"no provider offers a tool {tool_name!r}",
                                {"tool_name": tool_name})  # fmt: skip
        if len(offering) > 1:
            names = ", ".join(e.record.provider_id for e, _ in offering)
            raise ValidationError.for_field(
                "provider_id", f"{tool_name!r} is offered by several providers ({names}); name one"
            )
        return offering[0]
