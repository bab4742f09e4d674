"""The dead letter queue (RFC 21.1): what goes in, with which context, and how it comes out."""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from apiary.core.clock import Clock
from apiary.core.envelope import Envelope
from apiary.core.envelope_ids import EnvelopeIds, for_retry
from apiary.core.events import EventFilter
from apiary.core.ids import IdGenerator
from apiary.core.records import DlqEntry, DlqFilter, StoredMessage
from apiary.core.signatures import split_origin
from apiary.engine.codec import EnvelopeCodec
from apiary.engine.eventlog import EventRecorder
from apiary.errors import AlreadyCompletedError, NotFoundError
from apiary.store.protocols import DlqStore

EXCERPT_BYTES = 512
EXPORT_PAGE = 100
"""Entries in one page of an export when the caller names no page size."""
EXPORT_PAGE_BYTES = 3 * 1024 * 1024
"""About where an export page stops: under the 4 MiB a gRPC client receives by default."""


@dataclass(frozen=True)
class ExportPage:
    """One page of a DLQ export."""

    bundle: bytes
    """JSON: {"exported_at", "entries": [...]}."""
    entries: int
    last_id: int
    """The entry id of its last entry (the `after_id` of the next page); `after_id` when
    the page is empty."""
    more: bool
    """Whether matching entries follow it."""


Requeue = Callable[[Envelope, str, bytes, bytes, int], Awaitable[str]]
"""Admits an envelope for a recipient again, as a requeue (`Outbound.requeue`: no
deduplication), with the signature and the signed envelope it was derived from (both empty
without signing), marking the DLQ entry (its id last) requeued as it in the admission's
transaction (`Outbound.dead_letter`); returns the new message_id."""


def excerpt(entry: DlqEntry, codec: EnvelopeCodec) -> bytes:
    """At most EXCERPT_BYTES of the payload: enough for triage, bounded for exports."""
    return codec.decode(entry.envelope).payload[:EXCERPT_BYTES]


def _iso(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).isoformat().replace("+00:00", "Z")


def _next_attempt(env: Envelope, new_message_id: str, now: float) -> Envelope:
    """`env` as the next attempt of its message (`for_retry`: a new message_id, retry_count
    + 1), stamped `now`: a TTL counts from the requeue, or an expired message could never be
    requeued. ValidationError naming retry_count when the count is at the uint32 maximum:
    the copy could not be encoded, so the dead letter stays where it is."""
    ids = for_retry(
        EnvelopeIds(
            message_id=env.message_id, idempotency_token=env.idempotency_token,
            correlation_id=env.correlation_id, producer_id=env.producer_id,
            sequence_number=env.sequence_number, retry_count=env.retry_count,
        ),
        new_message_id,
    )  # fmt: skip
    return replace(env, message_id=ids.message_id, retry_count=ids.retry_count, timestamp=now)


class DeadLetters:
    def __init__(
        self, dlq: DlqStore, events: EventRecorder, codec: EnvelopeCodec, clock: Clock
    ) -> None:
        self._dlq = dlq
        self._events = events
        self._codec = codec
        self._clock = clock

    async def failed(self, message: StoredMessage, code: str, note: str, now: float) -> None:
        """An admitted message that ended in a terminal error: the only way into the DLQ (an
        envelope refused at admission was never the router's; engine/router/rejections.py)."""
        env = self._codec.decode(message.envelope)
        await self._add(
            DlqEntry(
                entry_id=0, message_id=message.message_id, producer_id=message.producer_id,
                recipient=message.recipient, correlation_id=message.correlation_id,
                message_type=message.message_type, error_code=code,
                reason=note or code, created_at=message.created_at, failed_at=now,
                content_type=env.content_type, payload_size=len(env.payload),
                envelope=message.envelope, attempts=await self._history(message),
                route=f"{message.producer_id} -> coordinator -> {message.recipient}",
                signature=message.signature,
            )
        )  # fmt: skip

    async def _history(self, message: StoredMessage) -> tuple[dict[str, Any], ...]:
        where = EventFilter(correlation_id=message.correlation_id, agent_id=message.recipient)
        events = await self._events.read(limit=2000, where=where)
        return tuple(
            {"at": e.ts, "what": e.event_type, "reason": str(e.details.get("error_code") or
             e.details.get("to") or e.details.get("stage") or "")}
            for e in events
            if e.details.get("message_id") == message.message_id
        )  # fmt: skip

    async def _add(self, entry: DlqEntry) -> None:
        stored = await self._dlq.add(entry)
        await self._events.record(
            "dlq.added", "coordinator", correlation_id=entry.correlation_id,
            agent_id=entry.recipient, entry_id=stored.entry_id, message_id=entry.message_id,
            error_code=entry.error_code, reason=entry.reason,
        )  # fmt: skip

    async def list(self, where: DlqFilter | None, after_id: int, limit: int) -> list[DlqEntry]:
        return await self._dlq.list(where, after_id, limit)

    async def get(self, entry_id: int) -> DlqEntry:
        entry = await self._dlq.get(entry_id)
        if entry is None:
            raise NotFoundError(f"no DLQ entry {entry_id}", {"entry_id": str(entry_id)})
        return entry

    async def requeue(self, entry_id: int, ids: IdGenerator, send: Requeue) -> str:
        """Admit the entry's envelope again as a new attempt (new message_id, same token);
        the entry is marked requeued with the admission, once (a requeue of it racing this
        one, on this replica or another, is refused already_completed)."""
        entry = await self.get(entry_id)
        if entry.requeued_as:
            raise AlreadyCompletedError(
                f"DLQ entry {entry_id} was already requeued as {entry.requeued_as}",
                {"entry_id": str(entry_id), "requeued_as": entry.requeued_as},
            )
        retry = _next_attempt(self._codec.decode(entry.envelope), ids.new_id(), self._clock.now())
        # What vouched for the dead letter vouches for the copy: the signature over the
        # envelope the producer signed (this one, or the one it was derived from).
        signature, origin = split_origin(entry.signature)
        new_id = await send(retry, entry.recipient, signature, origin or entry.envelope, entry_id)
        await self._events.record(
            "dlq.requeued", "operator", correlation_id=entry.correlation_id,
            agent_id=entry.recipient, entry_id=entry_id, message_id=entry.message_id,
            new_message_id=new_id,
        )  # fmt: skip
        return new_id

    async def export(
        self,
        where: DlqFilter | None,
        include_payloads: bool,
        *,
        after_id: int = 0,
        limit: int = EXPORT_PAGE,
        max_bytes: int = EXPORT_PAGE_BYTES,
    ) -> ExportPage:
        """One page of the JSON diagnostic bundle of the matching entries (payload excerpts
        by default): those after `after_id`, at most `limit`, and no entry past `max_bytes`
        of entries once one is in (a larger entry makes a page of its own)."""
        found = await self._dlq.list(where, after_id, limit + 1)
        docs: list[dict[str, Any]] = []
        size, last = 0, after_id
        for entry in found[:limit]:
            doc = self.describe(entry, include_payload=include_payloads)
            cost = len(json.dumps(doc))
            if docs and size + cost > max_bytes:
                break
            docs.append(doc)
            size, last = size + cost, entry.entry_id
        bundle = {"exported_at": _iso(self._clock.now()), "entries": docs}
        encoded = json.dumps(bundle, indent=2, sort_keys=True).encode()
        return ExportPage(encoded, len(docs), last, more=len(docs) < len(found))

    def describe(self, entry: DlqEntry, *, include_payload: bool = False) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "entry_id": entry.entry_id, "message_id": entry.message_id,
            "producer_id": entry.producer_id, "recipient": entry.recipient,
            "correlation_id": entry.correlation_id, "error_code": entry.error_code,
            "reason": entry.reason, "created_at": _iso(entry.created_at),
            "failed_at": _iso(entry.failed_at), "content_type": entry.content_type,
            "payload_size": entry.payload_size, "route": entry.route,
            "attempts": [dict(a, at=_iso(float(a.get("at", 0)))) for a in entry.attempts],
            "requeued_as": entry.requeued_as,
        }  # fmt: skip
        payload = self._codec.decode(entry.envelope).payload
        key = "payload_base64" if include_payload else "payload_excerpt_base64"
        doc[key] = base64.b64encode(
            payload if include_payload else payload[:EXCERPT_BYTES]
        ).decode()
        return doc
