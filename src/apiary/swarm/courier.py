"""Outgoing messages: composed, signed, recorded in the outbox and POSTed to each
destination's `<endpoint>/message`.

A broadcast is one message (one message_id, recipient "broadcast") POSTed to every other
member, with one outbox row per destination. A destination that does not answer, answers
5xx or 429 is tried again after each of `retry_delays` (a 429's Retry-After is honoured when
it is shorter than `max_wait_s`); any other answer is final: 2xx delivered, else failed
with the peer's error kept in the row.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from apiary.core.clock import Clock
from apiary.core.ids import IdGenerator
from apiary.core.swarm_mail import OutboxEntry
from apiary.store.protocols import SwarmStore
from apiary.swarm.client import Reply, SwarmClient
from apiary.swarm.keys import Identity, sign_message
from apiary.swarm.mail import mail_of
from apiary.swarm.membership import Notice
from apiary.swarm.wire import BROADCAST, Sender, SwarmMessage, format_timestamp

log = logging.getLogger("apiary.swarm.courier")

Sleep = Callable[[float], Awaitable[None]]
_WIRE_FIELDS = frozenset({
    "protocol_version", "message_id", "timestamp", "sender", "recipient", "swarm_id", "type",
    "content", "signature",
})  # fmt: skip


class Courier:
    def __init__(
        self, identity: Identity, me: Sender, store: SwarmStore, client: SwarmClient,
        clock: Clock, ids: IdGenerator, retry_delays: Sequence[float] = (0.5, 2.0),
        sleep: Sleep = asyncio.sleep, max_wait_s: float = 30.0,
    ) -> None:  # fmt: skip
        self.identity = identity
        self.me = me
        self._store = store
        self._client = client
        self._clock = clock
        self._ids = ids
        self._delays = tuple(retry_delays)
        self._sleep = sleep
        self._max_wait = max_wait_s

    def compose(
        self, swarm_id: str, recipient: str, kind: str, content: str, **optional: Any
    ) -> SwarmMessage:
        """A signed message from this agent (optional: in_reply_to, thread_id, priority,
        expires_at, references, attachments, metadata, extra)."""
        message = SwarmMessage(
            message_id=self._ids.new_id(), timestamp=format_timestamp(self._clock.now()),
            sender=self.me, recipient=recipient, swarm_id=swarm_id, type=kind, content=content,
            **optional,
        )  # fmt: skip
        return sign_message(self.identity, message)

    def notice(self, notice: Notice) -> SwarmMessage:
        """A membership notice as a signed system message: the operation is the (signed)
        content, copied to the top level for implementations that read it there."""
        body = dict(notice.body)
        recipient = notice.recipients[0] if len(notice.recipients) == 1 else BROADCAST
        content = json.dumps(body, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
        extra = {k: v for k, v in body.items() if k not in _WIRE_FIELDS}
        return self.compose(notice.swarm_id, recipient, "system", content, extra=extra)

    async def deliver(
        self, message: SwarmMessage, destinations: Mapping[str, str]
    ) -> list[OutboxEntry]:
        """POST `message` to each destination (agent_id -> endpoint) at once; their final
        outbox rows, by destination."""
        now = self._clock.now()
        mail = mail_of(message)
        rows = [OutboxEntry(mail, agent, now, updated_at=now) for agent in sorted(destinations)]
        for row in rows:
            await self._store.outbox_put(row)
        return list(
            await asyncio.gather(
                *(self._attempt(row, destinations[row.destination]) for row in rows)
            )
        )

    async def _attempt(self, row: OutboxEntry, endpoint: str) -> OutboxEntry:
        url = endpoint.rstrip("/") + "/message"
        reply = Reply(0, error="not tried")
        for n, delay in enumerate((0.0, *self._delays)):
            if n:
                wait = max(delay, reply.retry_after_s)
                if wait > self._max_wait:
                    break
                await self._sleep(wait)
            reply = await self._client.post(url, row.mail.wire)
            row = replace(row, attempts=row.attempts + 1, updated_at=self._clock.now())
            if reply.ok or not _retryable(reply):
                break
        if reply.ok:
            row = replace(row, status="delivered", error="")
        else:
            row = replace(row, status="failed", error=reply.problem())
            log.warning("message %s to %s failed: %s", row.mail.message_id, row.destination,
                        row.error)  # fmt: skip
        await self._store.outbox_put(row)
        return row


def _retryable(reply: Reply) -> bool:
    return reply.status in {0, 429} or reply.status >= 500
