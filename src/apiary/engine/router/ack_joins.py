"""Writes of a coordinator endpoint that commit with the router's application of the ACKs
of the endpoint's messages (the Scheduler's task transitions: RUNNING on a READ of its
dispatch, COMPLETED or FAILED on its end), instead of a commit of their own after it.

The router, applying a frame's agent ACKs (engine/router/lifecycle.py `acknowledge_frame`),
asks the endpoint that produced the acknowledged messages to `join` the ACKs it would have
forwarded to it; the endpoint answers with the writes and events that commit with the
messages' new states, holding whatever keeps them valid (the Scheduler its lock), or None
(nothing joins: the ACKs are forwarded after the commit as before). Exactly one of
`committed` (then the endpoint's effects; the ACKs end there, none is forwarded) and
`failed` follows.

The router gives the endpoint each ACK with the state change it makes to its message
(`MessageMove`), and the endpoint's event of the ACK may carry it (`MessageMove.details`:
the Scheduler's task.running, task.completed, task.failed). The router logs no
`message.state` of its own for the messages whose moves the endpoint's events carry
(`JoinedAcks.logged`): one event records both transitions (RFC 19: every transition is
logged, in the event it shares with the other; docs/scheduler.md, "Events of a task's
messages").
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

from apiary.core.envelope import Ack
from apiary.core.events import EventDraft
from apiary.core.records import TaskRecord


@dataclass(frozen=True, slots=True)
class MessageMove:
    """The state change an ACK makes to the message it acknowledges: what its
    `message.state` event would say."""

    message_id: str
    before: str
    after: str
    input: str
    error_code: str = ""

    def details(self) -> dict[str, str]:
        """The move as the fields of an event that records it along with its own change:
        message_id, message_from, message_state, message_input (and message_error_code
        when the ACK gave one)."""
        fields = {
            "message_id": self.message_id, "message_from": self.before,
            "message_state": self.after, "message_input": self.input,
        }  # fmt: skip
        if self.error_code:
            fields["message_error_code"] = self.error_code
        return fields


@dataclass(frozen=True, slots=True)
class AckedMessage:
    """An ACK the router asks its message's producer to join."""

    producer: str
    """The ACK's sender (the message's recipient)."""
    ack: Ack
    move: MessageMove | None
    """The state change the ACK makes to its message (None: it makes none)."""


class JoinedAcks(Protocol):
    """An endpoint's part of the router's commit of some ACKs of its messages."""

    tasks: Sequence[TaskRecord]
    """The task records that commit with the ACKs' message states."""
    events: Sequence[EventDraft]
    """Their events, appended after the messages' own."""
    logged: Collection[str]
    """The messages (by id) whose `MessageMove` one of `events` carries: the router logs
    no `message.state` of its own for them."""

    async def committed(self) -> None:
        """The commit took the writes: the endpoint's effects follow (it must not call the
        router back for the messages the frame holds)."""
        ...

    async def failed(self, error: BaseException, in_doubt: bool) -> None:
        """The commit failed (`in_doubt`: without telling whether it took the writes):
        nothing of the endpoint's changed, or, in doubt, what it can tell committed takes
        effect. The router raises `error` after it."""
        ...


AckJoin = Callable[[Sequence[AckedMessage]], Awaitable[JoinedAcks | None]]
"""An endpoint's answer to ACKs of its messages that the router applies together: the
writes that commit with them, or None (they are forwarded as usual)."""
