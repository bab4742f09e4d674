"""The agent registry: the `agents` table, descriptors as JSON text (SQLite) or JSONB
(PostgreSQL)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from apiary.core.events import EventDraft
from apiary.core.records import AgentRecord
from apiary.store.json_codec import dump_json, json_object_of
from apiary.store.sql.columns import Columns, Json
from apiary.store.sql.database import SqlDatabase
from apiary.store.sql.dialect import Dialect, by_dialect
from apiary.store.sql.events import SqlEventLog
from apiary.store.sql.statements import Execute, Query, QueryOne, Row, Transaction


class AgentRow(NamedTuple):
    """A row of `agents`."""

    agent_id: str
    name: str
    state: str
    registered_at: float
    last_heartbeat_at: float
    descriptor: Json


AGENTS = Columns(AgentRow, json=("descriptor",))


def agent_row(agent: AgentRecord) -> AgentRow:
    """The agent's row, its descriptor as JSON text; ValueError when the descriptor is not
    a JSON object."""
    return AgentRow(
        agent_id=agent.agent_id,
        name=agent.name,
        state=agent.state,
        registered_at=agent.registered_at,
        last_heartbeat_at=agent.last_heartbeat_at,
        descriptor=dump_json(agent.descriptor),
    )


def agent_from_row(fetched: Row) -> AgentRecord:
    """An `AgentRecord` from a fetched row of `AGENTS`."""
    row = AGENTS.of(fetched)
    return AgentRecord(
        agent_id=row.agent_id,
        name=row.name,
        state=row.state,
        registered_at=row.registered_at,
        last_heartbeat_at=row.last_heartbeat_at,
        descriptor=json_object_of(row.descriptor),
    )


_PUT = by_dialect(lambda d: d.upsert("agents", AGENTS, "agent_id"))
_GET = f"SELECT {AGENTS.sql} FROM agents WHERE agent_id = ?"
# Code point order in both: PostgreSQL's agent_id is COLLATE "C".
_LIST = f"SELECT {AGENTS.sql} FROM agents ORDER BY agent_id"
_DELETE = "DELETE FROM agents WHERE agent_id = ?"


def put_agent(d: Dialect, row: AgentRow) -> Transaction[None]:
    """Insert or replace one agent (`agent_row`)."""
    yield from Execute(_PUT, row)


def remove_agent(d: Dialect, agent_id: str) -> Transaction[None]:
    """Delete one agent; LookupError when it is not there (the transaction then rolls back,
    with the events it was to commit)."""
    if (yield from Execute(_DELETE, (agent_id,))) == 0:
        raise LookupError(f"no agent {agent_id!r}")


class SqlAgentStore:
    """`AgentStore` in the `agents` table; events that commit with a change go through
    `log`."""

    def __init__(self, database: SqlDatabase, log: SqlEventLog) -> None:
        self._db = database
        self._log = log

    async def put(self, agent: AgentRecord, events: Sequence[EventDraft] = ()) -> None:
        """Insert or replace the agent with this agent_id, with `events` appended in the
        same transaction."""
        if events:
            await self._log.write_with(events, put_agent, agent_row(agent))
        else:
            await self._db.write(Execute(_PUT, agent_row(agent)))

    async def get(self, agent_id: str) -> AgentRecord | None:
        """The agent, or None."""
        row = await self._db.read(QueryOne(_GET, (agent_id,)))
        return None if row is None else agent_from_row(row)

    async def list(self) -> list[AgentRecord]:
        """All agents, ordered by agent_id."""
        return [agent_from_row(row) for row in await self._db.read(Query(_LIST))]

    async def delete(self, agent_id: str, events: Sequence[EventDraft] = ()) -> bool:
        """Remove the agent; False when it was not there. `events` are appended in the
        removal's transaction: with events, an agent that is not there raises LookupError
        instead (nothing appended)."""
        if events:
            await self._log.write_with(events, remove_agent, agent_id)
            return True
        return await self._db.write(Execute(_DELETE, (agent_id,))) > 0
