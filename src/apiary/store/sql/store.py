"""`SqlStore`: every aggregate's SQL store over one `SqlDatabase`, what the SQLite and the
PostgreSQL backends share (each adds what is its own: the file's counters, the pool)."""

from __future__ import annotations

from apiary.store.sql.agents import SqlAgentStore
from apiary.store.sql.database import SqlDatabase
from apiary.store.sql.dlq import SqlDlqStore
from apiary.store.sql.events import SqlEventLog
from apiary.store.sql.handoffs import SqlHandoffStore
from apiary.store.sql.hitl import SqlHitlStore
from apiary.store.sql.idempotency import SqlIdempotencyStore
from apiary.store.sql.leader_writes import LeaderWrites
from apiary.store.sql.messages import SqlMessageStore
from apiary.store.sql.negotiations import SqlArtifactStore, SqlNegotiationStore
from apiary.store.sql.rooms import SqlRoomStore
from apiary.store.sql.runtime import SqlRuntimeStore
from apiary.store.sql.statements import QueryOne
from apiary.store.sql.swarm import SqlSwarmStore
from apiary.store.sql.tasks import SqlTaskStore
from apiary.store.sql.tools import SqlToolStore
from apiary.store.sql.workflows import SqlWorkflowStore
from apiary.store.sql.worktrees import SqlWorktreeStore


class SqlStore:
    """Every aggregate in one SQL database."""

    def __init__(self, database: SqlDatabase) -> None:
        self._db = database
        self.events = SqlEventLog(database)
        self.leader_writes = leader = LeaderWrites(database)
        """What the cluster leader's components write goes through (`leader_writes`)."""
        led = self.events.over(leader)
        self.agents = SqlAgentStore(database, self.events)
        self.messages = SqlMessageStore(database, self.events, leader)
        self.idempotency = SqlIdempotencyStore(database)
        self.dlq = SqlDlqStore(database)
        self.hitl = SqlHitlStore(leader, led)
        self.tasks = SqlTaskStore(leader, led)
        self.workflows = SqlWorkflowStore(leader, led)
        self.handoffs = SqlHandoffStore(leader, led)
        self.worktrees = SqlWorktreeStore(database, self.events)
        self.rooms = SqlRoomStore(leader, led)
        self.tools = SqlToolStore(database)
        self.negotiations = SqlNegotiationStore(leader, led)
        self.artifacts = SqlArtifactStore(database, self.events)
        self.swarm = SqlSwarmStore(database)
        self.runtime = SqlRuntimeStore(database, self.events)

    async def ping(self) -> None:
        """One trivial read (see Store.ping)."""
        await self._db.read(_PING)


_PING = QueryOne("SELECT 1")
