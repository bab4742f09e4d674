"""The in-memory swarm inbox and outbox (`SwarmStore`)."""

from __future__ import annotations

from dataclasses import replace

from apiary.core.swarm_mail import (
    INBOX_STATUSES,
    OUTBOX_STATUSES,
    PENDING_STATUSES,
    InboxEntry,
    OutboxEntry,
    capped,
)
from apiary.store.sql.swarm import (
    check_inbox_status,
    inbox_from_row,
    inbox_row,
    outbox_from_row,
    outbox_row,
    status_filter,
)


class MemorySwarmStore:
    """Dicts keyed by message_id (inbox) and (message_id, destination) (outbox)."""

    def __init__(self) -> None:
        self._inbox: dict[str, InboxEntry] = {}
        self._outbox: dict[tuple[str, str], OutboxEntry] = {}

    async def receive(self, entry: InboxEntry) -> bool:
        stored = inbox_from_row(inbox_row(entry))  # refuses and coerces as the SQL backends do
        if stored.mail.message_id in self._inbox:
            return False
        self._inbox[stored.mail.message_id] = stored
        return True

    async def inbox_get(self, message_id: str) -> InboxEntry | None:
        return self._inbox.get(message_id)

    async def list_recent(
        self,
        swarm_id: str | None = None,
        limit: int = 50,
        statuses: frozenset[str] | None = None,
    ) -> list[InboxEntry]:
        limit = capped(limit)
        if status_filter(statuses, INBOX_STATUSES).impossible:
            return []
        wanted = statuses if statuses is not None else frozenset(INBOX_STATUSES) - {"deleted"}
        found = [
            e for e in self._inbox.values()
            if e.status in wanted and (swarm_id is None or e.mail.swarm_id == swarm_id)
        ]  # fmt: skip
        found.sort(key=lambda e: (e.received_at, e.mail.message_id), reverse=True)
        return found[:limit]

    async def set_status(self, message_id: str, status: str, at: float) -> InboxEntry | None:
        entry = self._inbox.get(message_id)
        if entry is None:
            check_inbox_status(status)
            return None
        updated = replace(
            entry,
            status=status,
            read_at=entry.read_at if entry.read_at is not None or status != "read" else at,
            deleted_at=at if status == "deleted" else entry.deleted_at,
        )
        updated = inbox_from_row(inbox_row(updated))
        self._inbox[message_id] = updated
        return updated

    async def thread_latest(self, key: str) -> InboxEntry | None:
        found = [e for e in self._inbox.values() if key in (e.mail.message_id, e.mail.thread_id)]
        return max(found, key=lambda e: (e.received_at, e.mail.message_id), default=None)

    async def outbox_put(self, entry: OutboxEntry) -> None:
        stored = outbox_from_row(outbox_row(entry))
        self._outbox[(stored.mail.message_id, stored.destination)] = stored

    async def outbox_get(self, message_id: str) -> list[OutboxEntry]:
        return sorted(
            (e for (m, _), e in self._outbox.items() if m == message_id),
            key=lambda e: e.destination,
        )

    async def outbox_recent(
        self,
        swarm_id: str | None = None,
        limit: int = 50,
        statuses: frozenset[str] | None = None,
    ) -> list[OutboxEntry]:
        limit = capped(limit)
        if status_filter(statuses, OUTBOX_STATUSES).impossible:
            return []
        found = [
            e for e in self._outbox.values()
            if (statuses is None or e.status in statuses)
            and (swarm_id is None or e.mail.swarm_id == swarm_id)
        ]  # fmt: skip
        found.sort(key=lambda e: (e.created_at, e.mail.message_id, e.destination), reverse=True)
        return found[:limit]

    async def outbox_pending(self, limit: int = 100) -> list[OutboxEntry]:
        found = [e for e in self._outbox.values() if e.status in PENDING_STATUSES]
        found.sort(
            key=lambda e: (e.next_attempt_at, e.created_at, e.mail.message_id, e.destination)
        )
        return found[: capped(limit)]
