"""The agent registry, HITL invocations and handoffs commit the events of a change in the
change's own transaction, on every backend: a committed change always has its events, and a
write that fails (a record the store refuses, a malformed event, an event log that refuses
the append, an agent that is not there to remove) stores neither."""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from apiary.core.events import Event, EventDraft
from apiary.store.errors import StoreError
from apiary.store.protocols import Store
from apiary.testing.store_suite import StoreFactory
from apiary.testing.store_suite.base import T0, agent, draft, hitl_record
from apiary.testing.store_suite.handoffs import handoff_record

_INT64_OVERFLOW = 1 << 63


@dataclass(frozen=True)
class Aggregate:
    """One aggregate's write with events, told apart by a version stored in the record."""

    name: str
    put: Callable[[Store, int, Sequence[EventDraft]], Awaitable[None]]
    """Store version `n` of the one record, with the events."""
    version: Callable[[Store], Awaitable[int | None]]
    """The stored version (None: no record)."""
    refused: Callable[[Store, Sequence[EventDraft]], Awaitable[None]]
    """A write of a record every backend refuses (ValueError), with the events."""


async def _put_agent(store: Store, n: int, events: Sequence[EventDraft]) -> None:
    await store.agents.put(agent("a-1", last_heartbeat_at=T0 + n), events)


async def _agent_version(store: Store) -> int | None:
    found = await store.agents.get("a-1")
    return None if found is None else round(found.last_heartbeat_at - T0)


async def _refused_agent(store: Store, events: Sequence[EventDraft]) -> None:
    await store.agents.put(agent("a-1", descriptor={"key": object()}), events)


async def _put_hitl(store: Store, n: int, events: Sequence[EventDraft]) -> None:
    await store.hitl.put(hitl_record("h-1", updated_at=T0 + n), events)


async def _hitl_version(store: Store) -> int | None:
    found = await store.hitl.get("h-1")
    return None if found is None else round(found.updated_at - T0)


async def _refused_hitl(store: Store, events: Sequence[EventDraft]) -> None:
    await store.hitl.put(hitl_record("h-1", priority=_INT64_OVERFLOW), events)


async def _put_handoff(store: Store, n: int, events: Sequence[EventDraft]) -> None:
    await store.handoffs.put(handoff_record("r-1", updated_at=T0 + n), events)


async def _handoff_version(store: Store) -> int | None:
    found = await store.handoffs.get("r-1")
    return None if found is None else round(found.updated_at - T0)


async def _refused_handoff(store: Store, events: Sequence[EventDraft]) -> None:
    await store.handoffs.put(handoff_record("r-1", state="NOT_A_STATE"), events)


AGGREGATES = [
    Aggregate("agents", _put_agent, _agent_version, _refused_agent),
    Aggregate("hitl", _put_hitl, _hitl_version, _refused_hitl),
    Aggregate("handoffs", _put_handoff, _handoff_version, _refused_handoff),
]
by_name = pytest.mark.parametrize("aggregate", AGGREGATES, ids=[a.name for a in AGGREGATES])


def _malformed(n: int) -> EventDraft:
    """A draft whose details are not JSON: no event log can store it."""
    return draft(n, details={"n": n, "what": object()})


def _numbers(events: Sequence[Event]) -> list[int]:
    return [e.details["n"] for e in events]


@by_name
async def test_a_write_commits_its_events_with_the_change(
    store_factory: StoreFactory, aggregate: Aggregate
) -> None:
    async with store_factory.open() as store:
        told: list[Event] = []
        store.events.listen(told.extend)
        await aggregate.put(store, 1, [draft(1), draft(2)])
        await aggregate.put(store, 2, [draft(3)])
        await aggregate.put(store, 3, [])
        assert await aggregate.version(store) == 3
        stored = await store.events.read()
        assert _numbers(stored) == [1, 2, 3]
        assert [e.sequence for e in stored] == [1, 2, 3]
        # The recorder learns of them from the store, as of any append (log lines, readers).
        assert told == stored


@by_name
async def test_a_malformed_event_stores_neither(
    store_factory: StoreFactory, aggregate: Aggregate
) -> None:
    async with store_factory.open() as store:
        await aggregate.put(store, 1, [draft(1)])
        with pytest.raises(ValueError):
            await aggregate.put(store, 2, [draft(2), _malformed(3)])
        assert await aggregate.version(store) == 1
        assert _numbers(await store.events.read()) == [1]


@by_name
async def test_a_refused_record_stores_neither(
    store_factory: StoreFactory, aggregate: Aggregate
) -> None:
    async with store_factory.open() as store:
        await aggregate.put(store, 1, [draft(1)])
        with pytest.raises(ValueError):
            await aggregate.refused(store, [draft(2)])
        assert await aggregate.version(store) == 1
        assert _numbers(await store.events.read()) == [1]


@by_name
async def test_a_log_that_refuses_the_append_rolls_the_change_back(
    store_factory: StoreFactory,
    aggregate: Aggregate,
    request: pytest.FixtureRequest,
    tmp_path: Path,
) -> None:
    """The database refuses the events' rows after the change's own statement ran in the
    transaction: the change must be undone with them."""
    if not store_factory.durable:
        pytest.skip("the memory backend checks every event before it changes anything")
    async with store_factory.open() as store:
        await aggregate.put(store, 1, [draft(1)])
    _refuse_events(store_factory, request, tmp_path)
    async with store_factory.open() as store:
        with pytest.raises(StoreError):
            await aggregate.put(store, 2, [draft(2)])
        assert await aggregate.version(store) == 1
        await aggregate.put(store, 3, [])  # a change with no events is not refused
        assert await aggregate.version(store) == 3
        assert _numbers(await store.events.read()) == [1]


async def test_a_removal_commits_its_events_only_when_the_agent_was_there(
    store_factory: StoreFactory,
) -> None:
    async with store_factory.open() as store:
        await store.agents.put(agent("a-1"), [draft(1)])
        assert await store.agents.delete("a-1", [draft(2)]) is True
        assert await store.agents.get("a-1") is None
        # Nothing to remove: the events have no change to commit with.
        with pytest.raises(LookupError):
            await store.agents.delete("a-1", [draft(3)])
        assert await store.agents.delete("a-1") is False
        assert _numbers(await store.events.read()) == [1, 2]


async def test_a_removal_with_a_malformed_event_removes_nothing(
    store_factory: StoreFactory,
) -> None:
    async with store_factory.open() as store:
        await store.agents.put(agent("a-1"))
        with pytest.raises(ValueError):
            await store.agents.delete("a-1", [draft(1), _malformed(2)])
        assert await store.agents.get("a-1") is not None
        assert await store.events.read() == []


async def test_a_removal_the_log_refuses_removes_nothing(
    store_factory: StoreFactory, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    if not store_factory.durable:
        pytest.skip("the memory backend checks every event before it changes anything")
    async with store_factory.open() as store:
        await store.agents.put(agent("a-1"))
    _refuse_events(store_factory, request, tmp_path)
    async with store_factory.open() as store:
        with pytest.raises(StoreError):
            await store.agents.delete("a-1", [draft(1)])
        assert await store.agents.get("a-1") == agent("a-1")


def _refuse_events(
    store_factory: StoreFactory, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Make the database refuse every insert into `events` (a trigger), behind the store's
    back: the store finds out inside its transaction, after the change's statement."""
    if store_factory.backend == "sqlite":
        with sqlite3.connect(tmp_path / "apiary.db") as raw:
            raw.execute(
                "CREATE TRIGGER refuse_events BEFORE INSERT ON events"
                " BEGIN SELECT RAISE(ABORT, 'events refused'); END"
            )
        return
    dsn: str = request.getfixturevalue("postgres_dsn")
    schema = sql.Identifier(request.getfixturevalue("postgres_schema"))
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "CREATE FUNCTION {}.refuse_events() RETURNS trigger LANGUAGE plpgsql"
                " AS $$ BEGIN RAISE EXCEPTION 'events refused'; END $$"
            ).format(schema)
        )
        conn.execute(
            sql.SQL(
                "CREATE TRIGGER refuse_events BEFORE INSERT ON {}.events"
                " FOR EACH ROW EXECUTE FUNCTION {}.refuse_events()"
            ).format(schema, schema)
        )
