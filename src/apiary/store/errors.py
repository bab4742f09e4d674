"""Errors the storage layer raises to the engine."""


class StoreError(Exception):
    """Base class of storage failures."""


class DuplicateMessageError(StoreError):
    """A message with this message_id is already recorded."""


class SchemaVersionError(StoreError):
    """The database schema is newer than this code knows how to use."""


class VersionConflictError(StoreError):
    """A write named a version that is not the one after the stored record's: someone else
    changed the record first (optimistic concurrency). Nothing was written."""


class DuplicateWorkflowError(StoreError):
    """A workflow with this workflow_id is already stored."""
