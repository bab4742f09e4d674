"""apiary.v1.DlqService: inspect, filter, requeue and export dead letters (RFC 21.1); an
export comes page by page, each page naming the cursor of the next (dlq_cursor.py).

A dead letter keeps what its producer sent, valid or not; its view is built defensively
(stored bytes that are not an Envelope show no excerpt, any stored time is shown), so that
no entry can fail a listing."""

from __future__ import annotations

from google.protobuf.message import DecodeError

from apiary.core.envelope import Envelope
from apiary.core.ids import IdGenerator
from apiary.core.records import DlqEntry, DlqFilter
from apiary.engine.dead_letters import EXCERPT_BYTES, EXPORT_PAGE
from apiary.engine.router.admission import Outbound
from apiary.engine.router.router import Router
from apiary.errors import ApiaryError, ValidationError
from apiary.server.context import CallContext
from apiary.server.services.dlq_cursor import export_cursor, read_export_cursor
from apiary.server.services.request_checks import DEFAULT_CHECKS, RequestChecks, checked
from apiary.wire import pb
from apiary.wire.convert import float_to_timestamp, timestamp_to_float

apiary_pb2 = pb.apiary_pb2
MAX_LIST = 1000


def _filter(f: apiary_pb2.DlqFilter) -> DlqFilter:
    return DlqFilter(
        since=timestamp_to_float(f.since) if f.HasField("since") else None,
        until=timestamp_to_float(f.until) if f.HasField("until") else None,
        error_code=f.error_code or None,
        recipient=f.recipient or None,
        producer_id=f.producer_id or None,
        include_requeued=not f.exclude_requeued,
    )


def _excerpt(envelope: bytes) -> bytes:
    """The first bytes of the stored envelope's payload; none when it does not parse."""
    try:
        return pb.common_pb2.Envelope.FromString(envelope).payload[:EXCERPT_BYTES]
    except DecodeError:
        return b""


def _seconds(value: object) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def _entry(entry: DlqEntry) -> apiary_pb2.DlqEntry:
    out = apiary_pb2.DlqEntry(
        entry_id=entry.entry_id, message_id=entry.message_id, producer_id=entry.producer_id,
        recipient=entry.recipient, correlation_id=entry.correlation_id,
        message_type=entry.message_type,  # type: ignore[arg-type]
        error_code=entry.error_code, reason=entry.reason,
        created_at=float_to_timestamp(entry.created_at),
        failed_at=float_to_timestamp(entry.failed_at), content_type=entry.content_type,
        payload_size=entry.payload_size, payload_excerpt=_excerpt(entry.envelope),
        route=entry.route, requeued_as=entry.requeued_as,
        attempts=[
            apiary_pb2.DlqAttempt(
                at=float_to_timestamp(_seconds(a.get("at"))), what=str(a.get("what", "")),
                reason=str(a.get("reason", "")),
            )
            for a in entry.attempts
        ],
    )  # fmt: skip
    if entry.requeued_at:
        out.requeued_at.CopyFrom(float_to_timestamp(entry.requeued_at))
    return out


@checked
class DlqHandler:
    def __init__(
        self, router: Router, ids: IdGenerator, checks: RequestChecks = DEFAULT_CHECKS
    ) -> None:
        self._router = router
        self._letters = router.dead_letters
        self._ids = ids
        self._checks = checks

    async def list(
        self, req: apiary_pb2.ListDlqRequest, ctx: CallContext
    ) -> apiary_pb2.ListDlqResponse:
        limit = req.limit or 100
        if limit > MAX_LIST:
            raise ValidationError.for_field("limit", f"must be at most {MAX_LIST}")
        entries = await self._letters.list(_filter(req.filter), req.after_id, limit)
        return apiary_pb2.ListDlqResponse(entries=[_entry(e) for e in entries])

    async def get(self, req: apiary_pb2.GetDlqRequest, ctx: CallContext) -> apiary_pb2.DlqEntry:
        return _entry(await self._letters.get(req.entry_id))

    async def requeue(
        self, req: apiary_pb2.RequeueDlqRequest, ctx: CallContext
    ) -> apiary_pb2.RequeueDlqResponse:
        if not req.entry_ids:
            raise ValidationError.for_field("entry_ids", "name at least one entry")
        results = []
        for entry_id in req.entry_ids:
            try:
                new_id = await self._letters.requeue(entry_id, self._ids, self._send)
                results.append(
                    apiary_pb2.RequeueResult(entry_id=entry_id, ok=True, new_message_id=new_id)
                )
            except ApiaryError as exc:
                results.append(
                    apiary_pb2.RequeueResult(
                        entry_id=entry_id, ok=False, error=f"{exc.code}: {exc.message}"
                    )
                )
        return apiary_pb2.RequeueDlqResponse(results=results)

    async def _send(
        self, env: Envelope, recipient: str, signature: bytes, origin: bytes, entry_id: int
    ) -> str:
        item = Outbound(
            env, recipient, requeue=True, signature=signature, origin=origin, dead_letter=entry_id
        )
        outcome = await self._router.send(item)
        if not outcome.accepted:
            raise outcome.error or ValidationError(outcome.reason)
        return outcome.message_id

    async def export(
        self, req: apiary_pb2.ExportDlqRequest, ctx: CallContext
    ) -> apiary_pb2.ExportDlqResponse:
        page_size = req.page_size or EXPORT_PAGE
        if page_size > MAX_LIST:
            raise ValidationError.for_field("page_size", f"must be at most {MAX_LIST}")
        after_id = read_export_cursor(req.cursor, req.filter)
        page = await self._letters.export(
            _filter(req.filter), req.include_payloads, after_id=after_id, limit=page_size
        )
        return apiary_pb2.ExportDlqResponse(
            bundle=page.bundle,
            content_type="application/json",
            entries=page.entries,
            next_cursor=export_cursor(page.last_id, req.filter) if page.more else "",
        )
