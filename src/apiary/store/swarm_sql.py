"""The SQL of the swarm inbox and outbox, for both dialects: only the parameter marker and
PostgreSQL's JSONB casts differ, so the statements are built once per marker."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from apiary.core.swarm_mail import INBOX_STATUSES, OUTBOX_STATUSES
from apiary.store.swarm_rows import (
    INBOX_COLUMNS,
    OUTBOX_COLUMNS,
    placeholders_for,
    status_filter,
)

_OUTBOX_KEY = ("message_id", "destination")


@dataclass(frozen=True, slots=True)
class SwarmQueries:
    """Statements for one dialect; `p` is its parameter marker ('?' or '%s')."""

    p: str

    @property
    def receive(self) -> str:
        return (
            f"INSERT INTO swarm_inbox ({INBOX_COLUMNS})"
            f" VALUES ({placeholders_for(INBOX_COLUMNS, self.p)})"
            " ON CONFLICT (message_id) DO NOTHING"
        )

    @property
    def inbox_get(self) -> str:
        return f"SELECT {INBOX_COLUMNS} FROM swarm_inbox WHERE message_id = {self.p}"

    @property
    def set_status(self) -> str:
        """Parameters: status, status, at, status, at, message_id."""
        p = self.p
        return (
            f"UPDATE swarm_inbox SET status = {p},"
            f" read_at = CASE WHEN {p} = 'read' AND read_at IS NULL THEN {p} ELSE read_at END,"
            f" deleted_at = CASE WHEN {p} = 'deleted' THEN {p} ELSE deleted_at END"
            f" WHERE message_id = {p}"
        )

    @property
    def thread_latest(self) -> str:
        p = self.p
        return (
            f"SELECT {INBOX_COLUMNS} FROM swarm_inbox WHERE message_id = {p} OR thread_id = {p}"
            " ORDER BY received_at DESC, message_id DESC LIMIT 1"
        )

    @property
    def outbox_put(self) -> str:
        names = OUTBOX_COLUMNS.split(", ")
        return (
            f"INSERT INTO swarm_outbox ({OUTBOX_COLUMNS})"
            f" VALUES ({placeholders_for(OUTBOX_COLUMNS, self.p)})"
            f" ON CONFLICT ({', '.join(_OUTBOX_KEY)}) DO UPDATE SET "
            + ", ".join(f"{c} = excluded.{c}" for c in names if c not in _OUTBOX_KEY)
        )

    @property
    def outbox_get(self) -> str:
        return (
            f"SELECT {OUTBOX_COLUMNS} FROM swarm_outbox WHERE message_id = {self.p}"
            " ORDER BY destination"
        )

    @property
    def outbox_pending(self) -> str:
        """Parameters: limit."""
        return (
            f"SELECT {OUTBOX_COLUMNS} FROM swarm_outbox WHERE status IN ('sent', 'retrying')"
            " ORDER BY next_attempt_at, created_at, message_id, destination"
            f" LIMIT {self.p}"
        )

    def recent(
        self, table: str, swarm_id: str | None, limit: int, statuses: frozenset[str] | None
    ) -> tuple[str, list[Any]] | None:
        """A newest-first listing of `table` (swarm_inbox or swarm_outbox); None when nothing
        can match."""
        inbox = table == "swarm_inbox"
        term = status_filter(
            statuses, INBOX_STATUSES if inbox else OUTBOX_STATUSES, self.p,
            hidden="deleted" if inbox else "",
        )  # fmt: skip
        if term is None:
            return None
        clauses: list[str] = [term[0]] if term[0] else []
        params: list[Any] = list(term[1])
        if swarm_id is not None:
            clauses.append(f"swarm_id = {self.p}")
            params.append(swarm_id)
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        columns = INBOX_COLUMNS if inbox else OUTBOX_COLUMNS
        order = (
            "received_at DESC, message_id DESC" if inbox
            else "created_at DESC, message_id DESC, destination DESC"
        )  # fmt: skip
        params.append(limit)
        return f"SELECT {columns} FROM {table}{where} ORDER BY {order} LIMIT {self.p}", params
