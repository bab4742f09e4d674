"""Outgoing messages: composed, signed, recorded in the outbox and POSTed to each
destination's `<endpoint>/message`.

A broadcast is one message (one message_id, recipient "broadcast") POSTed to every other
member, with one outbox row per destination. A destination that does not answer, answers
5xx or 429 is tried again after each of `retry_delays` (a 429's Retry-After is honoured when
it is shorter than `max_wait_s`); any other answer is final: 2xx delivered, else failed
with the peer's error kept in the row.

A destination still unreachable after those is not given up: its row is `retrying` with a
`next_attempt_at`, and `retry_due` (run every few seconds by a serving peer, `run`) POSTs it
again, once per round, waiting twice as long after each failure (`RetryPolicy`), until it
answers, its member leaves the swarm, or `give_up_after_s` has passed since it was sent
(then failed, saying so). Rows left `sent` by a process that stopped mid-delivery are taken
up the same way once they are `orphan_after_s` old. Peers drop a message_id they already
have, so a repeated POST is harmless.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
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


EndpointOf = Callable[[str, str], "str | None"]
"""(swarm_id, agent_id) -> the member's endpoint now, None when it is no member."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Background retries of unreachable destinations (module docstring)."""

    interval_s: float = 5.0
    """How often a serving peer looks for rows that are due."""
    first_backoff_s: float = 5.0
    max_backoff_s: float = 300.0
    give_up_after_s: float = 24 * 3600.0
    orphan_after_s: float = 120.0

    def backoff(self, rounds: int) -> float:
        """The wait before background round `rounds + 1` (`rounds` already failed)."""
        return min(self.max_backoff_s, self.first_backoff_s * (1 << min(rounds, 32)))


class Courier:
    def __init__(
        self, identity: Identity, me: Sender, store: SwarmStore, client: SwarmClient,
        clock: Clock, ids: IdGenerator, retry_delays: Sequence[float] = (0.5, 2.0),
        sleep: Sleep = asyncio.sleep, max_wait_s: float = 30.0,
        retry: RetryPolicy | None = None,
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
        self.retry = retry or RetryPolicy()
        self._in_flight: set[tuple[str, str]] = set()

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
                *(self._attempt(row, destinations[row.destination], self._delays) for row in rows)
            )
        )

    async def retry_due(self, endpoint_of: EndpointOf) -> list[OutboxEntry]:
        """One background round: POST every pending row that is due again (once each); their
        rows as they end the round."""
        now = self._clock.now()
        due: list[OutboxEntry] = []
        for row in await self._store.outbox_pending():
            if (row.mail.message_id, row.destination) in self._in_flight:
                continue
            if row.status == "retrying" and row.next_attempt_at > now:
                break  # soonest first: the rest are later still
            if row.status == "sent" and now - row.updated_at < self.retry.orphan_after_s:
                continue  # a first delivery still under way, here or in another process
            due.append(row)
        return list(await asyncio.gather(*(self._once(row, endpoint_of) for row in due)))

    async def retry_now(
        self, rows: Sequence[OutboxEntry], endpoint_of: EndpointOf
    ) -> list[OutboxEntry]:
        """An operator's retry: POST each row not yet delivered once, now, whatever its
        status (a failed row included); delivered rows come back as they are."""
        return list(await asyncio.gather(*(self._retry_one(row, endpoint_of) for row in rows)))

    async def _retry_one(self, row: OutboxEntry, endpoint_of: EndpointOf) -> OutboxEntry:
        if row.status == "delivered" or (row.mail.message_id, row.destination) in self._in_flight:
            return row
        # Counted from now: a row that had given up gets a fresh give-up period.
        return await self._once(row, endpoint_of, fresh_period=True)

    async def _once(
        self, row: OutboxEntry, endpoint_of: EndpointOf, *, fresh_period: bool = False
    ) -> OutboxEntry:
        """One POST of `row` to its member's current endpoint; failed when it is no longer
        a member."""
        endpoint = endpoint_of(row.mail.swarm_id, row.destination)
        if endpoint is None:
            gone = replace(
                row, status="failed", updated_at=self._clock.now(), next_attempt_at=0.0,
                error=f"{row.destination} is no longer a member of {row.mail.swarm_id}",
            )  # fmt: skip
            await self._store.outbox_put(gone)
            return gone
        if fresh_period:
            row = replace(row, created_at=self._clock.now())
        return await self._attempt(row, endpoint, ())

    async def run(self, endpoint_of: EndpointOf, active: Callable[[], bool] | None = None) -> None:
        """`retry_due` every `retry.interval_s`, for as long as the peer serves, in the
        rounds when `active()` (the replicas of a cluster share one outbox: only the
        leader retries it; None: every round)."""
        while True:
            await self._sleep(self.retry.interval_s)
            if active is not None and not active():
                continue
            try:
                await self.retry_due(endpoint_of)
            except Exception:  # a store or network failure must not end the retries
                log.exception("swarm outbox retry round failed")

    async def _attempt(
        self, row: OutboxEntry, endpoint: str, delays: Sequence[float]
    ) -> OutboxEntry:
        key = (row.mail.message_id, row.destination)
        self._in_flight.add(key)
        try:
            return await self._attempts(row, endpoint, delays)
        finally:
            self._in_flight.discard(key)

    async def _attempts(
        self, row: OutboxEntry, endpoint: str, delays: Sequence[float]
    ) -> OutboxEntry:
        url = endpoint.rstrip("/") + "/message"
        reply = Reply(0, error="not tried")
        tried = 0
        for n, delay in enumerate((0.0, *delays)):
            if n:
                wait = max(delay, reply.retry_after_s)
                if wait > self._max_wait:
                    break
                await self._sleep(wait)
            reply = await self._client.post(url, row.mail.wire)
            tried += 1
            row = replace(row, attempts=row.attempts + 1, updated_at=self._clock.now())
            if reply.ok or not _retryable(reply):
                break
        now = self._clock.now()
        if reply.ok:
            row = replace(row, status="delivered", error="", next_attempt_at=0.0)
        elif _retryable(reply) and now - row.created_at < self.retry.give_up_after_s:
            rounds = max(0, row.attempts - tried - len(self._delays))
            wait = max(self.retry.backoff(rounds), reply.retry_after_s)
            row = replace(row, status="retrying", error=reply.problem(), next_attempt_at=now + wait)
            log.info("message %s to %s: %s; trying again in %g s", row.mail.message_id,
                     row.destination, row.error, wait)  # fmt: skip
        else:
            error = reply.problem()
            if _retryable(reply):
                error = f"gave up after {row.attempts} attempts: {error}"
            row = replace(row, status="failed", error=error, next_attempt_at=0.0)
            log.warning("message %s to %s failed: %s", row.mail.message_id, row.destination,
                        row.error)  # fmt: skip
        await self._store.outbox_put(row)
        return row


def _retryable(reply: Reply) -> bool:
    return reply.status in {0, 429} or reply.status >= 500
