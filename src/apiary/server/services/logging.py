"""sw4rm.logging.LoggingService and apiary.v1.EventLogService over the one event log."""

from __future__ import annotations

from apiary.core.events import EventFilter
from apiary.core.json_reader import read_json_object
from apiary.engine.eventlog import EventRecorder
from apiary.errors import ValidationError
from apiary.server.context import CallContext
from apiary.server.services.request_checks import DEFAULT_CHECKS, RequestChecks, checked
from apiary.wire import pb
from apiary.wire.convert import event_to_proto

MAX_READ = 5000


@checked
class LoggingHandler:
    """Agents' own log events join the coordinator's event log as `agent.log` events."""

    def __init__(self, events: EventRecorder, checks: RequestChecks = DEFAULT_CHECKS) -> None:
        self._events = events
        self._checks = checks

    async def ingest(
        self, req: pb.logging_pb2.LogEvent, ctx: CallContext
    ) -> pb.logging_pb2.IngestResponse:
        if not req.event_type:
            raise ValidationError("event_type is required", {"field": "event_type"})
        level = req.level or "INFO"
        if level not in {"INFO", "WARN", "ERROR"}:
            raise ValidationError(
                f"level must be INFO, WARN or ERROR, not {level!r}", {"field": "level"}
            )
        limits = self._checks.limits
        details = (
            read_json_object(
                req.details_json, "details_json", max_bytes=limits.document_bytes,
                max_depth=limits.json_depth,
            )
            if req.details_json
            else {}
        )  # fmt: skip
        await self._events.record(
            "agent.log",
            req.agent_id or ctx.peer,
            correlation_id=req.correlation_id,
            agent_id=req.agent_id,
            log_event_type=req.event_type,
            level=level,
            details=details,
        )
        return pb.logging_pb2.IngestResponse(ok=True)


@checked
class EventLogHandler:
    def __init__(self, events: EventRecorder, checks: RequestChecks = DEFAULT_CHECKS) -> None:
        self._events = events
        self._checks = checks

    async def read_events(
        self, req: pb.apiary_pb2.ReadEventsRequest, ctx: CallContext
    ) -> pb.apiary_pb2.ReadEventsResponse:
        limit = req.limit or 500
        if limit > MAX_READ:
            raise ValidationError(f"limit must be at most {MAX_READ}", {"field": "limit"})
        where = EventFilter(
            correlation_id=req.correlation_id or None,
            agent_id=req.agent_id or None,
            event_types=frozenset(req.event_types) or None,
        )
        events = await self._events.read(after=req.after_sequence, limit=limit, where=where)
        return pb.apiary_pb2.ReadEventsResponse(
            events=[event_to_proto(e) for e in events],
            last_sequence=await self._events.last_sequence(),
        )
