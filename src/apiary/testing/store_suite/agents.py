"""Checks of the agent registry (`AgentStore`)."""

from __future__ import annotations

from dataclasses import replace

from apiary.testing.store_suite.base import T0, Check, StoreFactory, agent, registry

CHECKS: list[Check] = []
_check = registry(CHECKS)


@_check
async def agents_are_put_read_listed_and_deleted(factory: StoreFactory) -> None:
    async with factory.open() as store:
        assert await store.agents.list() == []
        assert await store.agents.get("a-1") is None
        first = agent("a-1", descriptor={"tools": [{"name": "grep", "args": {"x": 1}}]})
        await store.agents.put(first)
        assert await store.agents.get("a-1") == first
        await store.agents.put(agent("a-2"))
        assert [a.agent_id for a in await store.agents.list()] == ["a-1", "a-2"]
        assert await store.agents.delete("a-1") is True
        assert await store.agents.delete("a-1") is False
        assert await store.agents.delete("never-there") is False
        assert await store.agents.get("a-1") is None
        assert [a.agent_id for a in await store.agents.list()] == ["a-2"]


@_check
async def putting_an_agent_again_replaces_it(factory: StoreFactory) -> None:
    async with factory.open() as store:
        await store.agents.put(agent("a-1"))
        changed = agent("a-1", name="renamed", state="SUSPENDED", last_heartbeat_at=T0 + 60)
        await store.agents.put(replace(changed, descriptor={"v": 2}))
        assert await store.agents.get("a-1") == replace(changed, descriptor={"v": 2})
        assert len(await store.agents.list()) == 1


@_check
async def agents_are_listed_in_code_point_order(factory: StoreFactory) -> None:
    ids = ["b", "B", "a", "A", "ä", "z", "Z", "é", "10", "9", "a-b", "a_b", "ab", "你"]
    async with factory.open() as store:
        for agent_id in ids:
            await store.agents.put(agent(agent_id))
        assert [a.agent_id for a in await store.agents.list()] == sorted(ids)
