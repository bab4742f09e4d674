"""Errors the storage layer raises to the engine."""


class StoreError(Exception):
    """Base class of storage failures."""


class DuplicateMessageError(StoreError):
    """A message with this message_id is already recorded."""


class SchemaVersionError(StoreError):
    """The database schema is newer than this code knows how to use."""
