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
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from apiary.core.envelope import Ack
from apiary.core.events import EventDraft
from apiary.core.records import TaskRecord


class JoinedAcks(Protocol):
    """An endpoint's part of the router's commit of some ACKs of its messages."""

    tasks: Sequence[TaskRecord]
    """The task records that commit with the ACKs' message states."""
    events: Sequence[EventDraft]
    """Their events, appended after the messages' own."""

    async def committed(self) -> None:
        """The commit took the writes: the endpoint's effects follow (it must not call the
        router back for the messages the frame holds)."""
        ...

    async def failed(self, error: BaseException, in_doubt: bool) -> None:
        """The commit failed (`in_doubt`: without telling whether it took the writes):
        nothing of the endpoint's changed, or, in doubt, what it can tell committed takes
        effect. The router raises `error` after it."""
        ...


AckJoin = Callable[[Sequence[tuple[str, Ack]]], Awaitable[JoinedAcks | None]]
"""An endpoint's answer to ACKs (producer, ACK) of its messages that the router applies
together: the writes that commit with them, or None (they are forwarded as usual)."""
