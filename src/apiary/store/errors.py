"""Errors the storage layer raises to the engine."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

from apiary.core.records import IdempotencyRecord
from apiary.errors import UnavailableError


class StoreError(Exception):
    """Base class of storage failures."""


class DuplicateMessageError(StoreError):
    """A message with this message_id is already recorded."""


class TaskExistsError(StoreError):
    """A new task was not stored: a task with its task_id already is (`TaskStore.create`;
    nothing of the write was stored)."""

    def __init__(self, task_id: str) -> None:
        super().__init__(f"task {task_id!r} is stored already")
        self.task_id = task_id

    def __reduce__(self) -> tuple[type[TaskExistsError], tuple[str]]:
        return (TaskExistsError, (self.task_id,))  # (from the SQLite writer's process, too)


class TokenTakenError(StoreError):
    """A message was not admitted: its idempotency token's record changed since its
    deduplication read it (another admission of the token, on another replica, came first;
    `AdmissionWrites.idempotency_found`). `record` is the token's record as stored now."""

    def __init__(self, message_id: str, record: IdempotencyRecord) -> None:
        super().__init__(f"{message_id}: token {record.token!r} was taken by another admission")
        self.record = record


class RequeuedError(StoreError):
    """A requeue of a dead letter was not admitted: another requeue marked the entry first
    (or the entry is gone; `AdmissionWrites.requeues`)."""

    def __init__(self, message_id: str, entry_id: int) -> None:
        super().__init__(f"{message_id}: DLQ entry {entry_id} was requeued by another requeue")
        self.entry_id = entry_id


class BoundExceededError(StoreError):
    """A message was not admitted: its recipient's buffer, or the credits its producer may
    hold there, are full in the store (cluster mode's `AdmissionWrites.bound`; `limit` names
    which: `core.admission_bounds`)."""

    def __init__(self, message_id: str, limit: str, count: int, bound: int) -> None:
        super().__init__(f"{message_id}: {limit} ({count}/{bound})")
        self.limit = limit
        self.count = count
        self.bound = bound


class StaleStateError(StoreError):
    """State changes were not applied (none of the call): the message of one was no longer
    in the state the change expected (`StateChange.expected`: another replica changed it
    since it was read). The caller reads it again and decides anew."""

    def __init__(self, message_ids: Sequence[str]) -> None:
        super().__init__(f"changed meanwhile: {', '.join(message_ids)}")
        self.message_ids = tuple(message_ids)
        """The messages whose changes may have been refused (at least the stale one)."""


AdmissionRefusal: TypeAlias = (
    DuplicateMessageError | TokenTakenError | RequeuedError | BoundExceededError | TaskExistsError
)
"""Why a member of `MessageStore.admit_many` was not admitted (it alone)."""


class StoreUnavailableError(StoreError, UnavailableError):
    """The database cannot be reached now (connection refused, lost, or the server shut it
    down): the operation did not happen, or its outcome is unknown, and a retry is the
    answer (callers see `unavailable`; idempotency tokens make the retry safe)."""


class StoreOpenError(StoreError):
    """The store could not be opened: which file, why, and what to do about it."""

    def __init__(self, path: object, cause: str, fix: str) -> None:
        super().__init__(f"cannot open the store {path}: {cause}; {fix}")
        self.path = path
        self.cause = cause
        self.fix = fix


class SchemaVersionError(StoreError):
    """The database schema is newer than this code knows how to use."""


class VersionConflictError(StoreError):
    """A write named a version that is not the one after the stored record's: someone else
    changed the record first (optimistic concurrency). Nothing was written."""


class DuplicateWorkflowError(StoreError):
    """A workflow with this workflow_id is already stored."""
