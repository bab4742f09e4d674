"""What every check of the suite shares: the factory it is given, and record builders."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

from apiary.core.events import EventDraft
from apiary.core.records import (
    AgentRecord,
    DlqEntry,
    HitlRecord,
    IdempotencyRecord,
    MessageState,
    StoredMessage,
)
from apiary.store.protocols import Store


@dataclass(frozen=True, slots=True)
class StoreFactory:
    """How the suite reaches one backend."""

    backend: str
    """The `Store.backend` the store must report."""
    open: Callable[[], AbstractAsyncContextManager[Store]]
    """Opens the store; every call reaches the same underlying storage."""
    durable: bool
    """Whether what was written survives closing and opening again."""


class CheckNotApplicable(Exception):  # noqa: N818 - reads as a reason, like pytest's Skipped
    """Raised by a check that does not apply to this backend (e.g. persistence in memory)."""


Check = Callable[[StoreFactory], Awaitable[None]]


def registry(checks: list[Check]) -> Callable[[Check], Check]:
    """A decorator that appends the function it decorates to `checks`."""

    def register(function: Check) -> Check:
        checks.append(function)
        return function

    return register


T0 = 1_700_000_000.125
"""A timestamp with a fractional part, to show that ts keeps every bit of its float."""


def draft(n: int = 0, **fields: Any) -> EventDraft:
    """An event draft whose details identify it by `n`."""
    values: dict[str, Any] = {
        "event_type": "test.event",
        "actor": "suite",
        "ts": T0 + n,
        "details": {"n": n},
    }
    values.update(fields)
    return EventDraft(**values)


def message(message_id: str, recipient: str = "agent-b", **fields: Any) -> StoredMessage:
    """A message in state RECEIVED with a recognisable envelope."""
    values: dict[str, Any] = {
        "message_id": message_id,
        "recipient": recipient,
        "producer_id": "agent-a",
        "correlation_id": f"corr-{message_id}",
        "message_type": 2,
        "envelope": f"envelope of {message_id}".encode(),
        "state": MessageState.RECEIVED,
        "created_at": T0,
        "updated_at": T0,
    }
    values.update(fields)
    return StoredMessage(**values)


def agent(agent_id: str, **fields: Any) -> AgentRecord:
    """An ACTIVE agent with a small descriptor."""
    values: dict[str, Any] = {
        "agent_id": agent_id,
        "name": f"name of {agent_id}",
        "state": "ACTIVE",
        "registered_at": T0,
        "last_heartbeat_at": T0 + 5,
        "descriptor": {"capabilities": ["code"], "modalities": ["text/plain"]},
    }
    values.update(fields)
    return AgentRecord(**values)


def idempotency_record(token: str, **fields: Any) -> IdempotencyRecord:
    """A cache entry of an operation with two attempts, the second one current."""
    values: dict[str, Any] = {
        "token": token,
        "producer_id": "agent-a",
        "original_message_id": f"{token}-try-1",
        "current_message_id": f"{token}-try-2",
        "status": "RECEIVED",
        "created_at": T0,
        "updated_at": T0 + 1,
        "attempts": (f"{token}-try-1", f"{token}-try-2"),
    }
    values.update(fields)
    return IdempotencyRecord(**values)


def dlq_entry(message_id: str, **fields: Any) -> DlqEntry:
    """A dead-lettered DATA message with a short attempt history; entry_id 0 (unassigned)."""
    envelope = f"envelope of {message_id}".encode()
    values: dict[str, Any] = {
        "entry_id": 0,
        "message_id": message_id,
        "producer_id": "agent-a",
        "recipient": "agent-b",
        "correlation_id": f"corr-{message_id}",
        "message_type": 2,
        "error_code": "ack_timeout",
        "reason": "no acknowledgement after 3 attempts",
        "created_at": T0,
        "failed_at": T0 + 30,
        "content_type": "application/json",
        "payload_size": len(envelope),
        "envelope": envelope,
        "attempts": (
            {"at": T0, "what": "sent", "reason": ""},
            {"at": T0 + 10, "what": "retried", "reason": "ack timeout"},
        ),
        "route": "agent-a -> coordinator -> agent-b",
    }
    values.update(fields)
    return DlqEntry(**values)


def hitl_record(invocation_id: str, **fields: Any) -> HitlRecord:
    """A PENDING security-approval invocation with a subject, context and two actions."""
    values: dict[str, Any] = {
        "invocation_id": invocation_id,
        "reason_type": "SECURITY_APPROVAL",
        "state": "PENDING",
        "created_at": T0,
        "updated_at": T0,
        "deadline": T0 + 300,
        "requested_by": "agent-a",
        "correlation_id": f"corr-{invocation_id}",
        "subject": {"repo_id": "repo-1", "task_id": f"task-{invocation_id}"},
        "context": {"risk": "writes outside the worktree", "files": ["a.py", "b.py"]},
        "suggested_action": "DENY",
        "proposed_actions": ("APPROVE", "DENY"),
        "approver_roles": ("security",),
    }
    values.update(fields)
    return HitlRecord(**values)


TERMINAL_STATES = frozenset(s for s in MessageState if s.terminal)
OPEN_STATES = frozenset(MessageState) - TERMINAL_STATES

UINT64_MAX = (1 << 64) - 1


# Accents, CJK, right-to-left scripts, astral-plane emoji, a combining mark and a ZWJ sequence.
UNICODE = (
    "héllo wörld · 你好 · こんにちは · مرحبا · עברית · 🐝🍯 · e\u0301 · "
    "\U0001f3f3\ufe0f\u200d\U0001f308"
)


def message_ids(found: list[StoredMessage]) -> list[str]:
    """The message ids of `found`, in order (for comparing query results)."""
    return [m.message_id for m in found]
