"""The in-memory backend: tests, and `--store memory://` for throwaway runs.

Nothing survives the process. It keeps the same contract as the durable backends, down to
refusing what they refuse (details that are not JSON, sequence numbers that are not uint64:
it runs their row encoders), so that a test passing against it means something. Each
aggregate's store is a module of this package; this one assembles them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from apiary.store.memory.agents import MemoryAgentStore
from apiary.store.memory.dlq import MemoryDlqStore
from apiary.store.memory.events import MemoryEventLog
from apiary.store.memory.handoffs import MemoryHandoffStore
from apiary.store.memory.hitl import MemoryHitlStore
from apiary.store.memory.idempotency import MemoryIdempotencyStore
from apiary.store.memory.messages import MemoryMessageStore
from apiary.store.memory.negotiations import MemoryArtifactStore, MemoryNegotiationStore
from apiary.store.memory.rooms import MemoryRoomStore
from apiary.store.memory.runtime import MemoryRuntimeStore
from apiary.store.memory.swarm import MemorySwarmStore
from apiary.store.memory.tasks import MemoryTaskStore
from apiary.store.memory.tools import MemoryToolStore
from apiary.store.memory.workflows import MemoryWorkflowStore
from apiary.store.memory.worktrees import MemoryWorktreeStore


class MemoryStore:
    """Every aggregate in process memory. Needs no closing; `open_memory_store` exists so
    that every backend is opened the same way."""

    backend = "memory"

    async def ping(self) -> None:
        """Process memory is always there (see Store.ping)."""

    def __init__(self) -> None:
        self.events = MemoryEventLog()
        self.agents = MemoryAgentStore(self.events)
        self.idempotency = MemoryIdempotencyStore()
        self.tasks = MemoryTaskStore(self.events)
        self.dlq = MemoryDlqStore()
        self.messages = MemoryMessageStore(self.events, self.idempotency, self.tasks, self.dlq)
        self.hitl = MemoryHitlStore(self.events)
        self.workflows = MemoryWorkflowStore(self.events)
        self.handoffs = MemoryHandoffStore(self.events)
        self.worktrees = MemoryWorktreeStore(self.events)
        self.rooms = MemoryRoomStore(self.events)
        self.tools = MemoryToolStore()
        self.artifacts = MemoryArtifactStore(self.events)
        self.negotiations = MemoryNegotiationStore(self.artifacts, self.events)
        self.swarm = MemorySwarmStore()
        self.runtime = MemoryRuntimeStore(self.events)


@asynccontextmanager
async def open_memory_store() -> AsyncIterator[MemoryStore]:
    """A fresh, empty in-memory store."""
    yield MemoryStore()
