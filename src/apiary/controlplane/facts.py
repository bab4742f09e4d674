"""Writing runtime state with its events: each change of the control plane's records is one
store transaction that appends its contract events to the event log (core/runtime/log.py),
so that a committed state always has its events and a failed write has neither."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from apiary.core.events import EventDraft
from apiary.core.ids import IdGenerator
from apiary.core.runtime.log import Fact, details, log_type
from apiary.core.runtime.records import RuntimeWrite
from apiary.engine.eventlog import EventRecorder
from apiary.store.protocols import RuntimeStore

RUNTIME_ACTOR = "runtime"
"""The actor of the facts the runtime records on its own (a task's progress)."""


class FactWriter:
    """Commits runtime records with their facts (`commit`)."""

    def __init__(
        self, store: RuntimeStore, events: EventRecorder, ids: IdGenerator, runtime_id: str
    ) -> None:
        self.store = store
        self.events = events
        self._ids = ids
        self.runtime_id = runtime_id

    def drafts(self, facts: Sequence[Fact], actor: str) -> list[EventDraft]:
        return [self._draft(fact, actor) for fact in facts]

    def _draft(self, fact: Fact, actor: str) -> EventDraft:
        return self.events.draft(
            log_type(fact.type), actor, correlation_id=fact.session_id,
            agent_id=fact.agent_id, **details(fact, self._ids.new_id(), self.runtime_id),
        )  # fmt: skip

    async def commit(self, write: RuntimeWrite, facts: Sequence[Fact], actor: str) -> None:
        """Store `write` with the events of `facts`, in one transaction."""
        await self.events.commit(self.drafts(facts, actor), partial(self.store.save, write))
