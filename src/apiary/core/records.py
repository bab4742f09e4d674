"""Stored records of the registry and the router, shared by the engine and every store."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class MessageState(StrEnum):
    """Message lifecycle states (RFC Appendix C; DESIGN.md section 2)."""

    SENT = "SENT"
    RECEIVED = "RECEIVED"
    READ = "READ"
    FULFILLED = "FULFILLED"
    REJECTED = "REJECTED"
    FAILED = "FAILED"
    TIMED_OUT = "TIMED_OUT"
    RETRYING = "RETRYING"

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL


_TERMINAL = frozenset(
    {MessageState.FULFILLED, MessageState.REJECTED, MessageState.FAILED, MessageState.TIMED_OUT}
)


@dataclass(frozen=True, slots=True)
class AgentRecord:
    """A registered agent. `descriptor` holds the AgentDescriptor fields as JSON values."""

    agent_id: str
    name: str
    state: str
    registered_at: float
    last_heartbeat_at: float
    descriptor: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """A durably admitted envelope addressed to one recipient.

    `offset` is the position in the recipient's inbox (assigned by the store on admission,
    strictly increasing per recipient from 1); stream resumption reads after an offset.
    `envelope` is the canonical Envelope's serialized bytes, kept verbatim.
    """

    message_id: str
    recipient: str
    producer_id: str
    correlation_id: str
    message_type: int
    envelope: bytes
    state: MessageState
    created_at: float
    updated_at: float
    offset: int = 0
    error_code: str = ""
