"""sw4rm.router.RouterService and apiary.v1.RouterStreamService.

Where envelopes enter from clients, besides the request checks (`request_checks`):

- an envelope's timestamp must lie within the clock-skew window (admission, which also sees
  the coordinator's own and requeued envelopes, checks only that it is a time a Timestamp
  can show); in a SendStream frame, a timestamp outside it ends the stream with the error;
- a SendMessage envelope with a string past its limit, or a SendStream frame larger than
  its envelopes within every limit could be (besides payloads), is refused before
  admission, naming the field, so that nothing of it is stored, not even in the DLQ; the
  rest of an envelope's validation, charsets included, is admission's, which answers
  accepted=false and dead-letters.

A stream read over HTTP renders stored envelopes whose timestamps a Timestamp cannot show
at the nearest time it can, since the gateway's JSON could not show them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence

from google.protobuf.timestamp_pb2 import Timestamp

from apiary.core.envelope import MESSAGE_TYPE_NAMES, Envelope
from apiary.core.limits import (
    INT64_MAX,
    TIMESTAMP_MAX_S,
    Limits,
    check_id,
    check_timestamp_parts,
    utf8_size,
)
from apiary.core.signatures import split_origin
from apiary.core.trace_context import TraceContext, from_headers
from apiary.engine.router.admission import Outbound, SendOutcome
from apiary.engine.router.delivery import Delivery, parse_resume_token, resume_token
from apiary.engine.router.inbox import Handout
from apiary.engine.router.router import Router
from apiary.engine.router.send_pipeline import SendPipeline
from apiary.engine.tracing import OpenSpan
from apiary.errors import ValidationError
from apiary.server.context import RECIPIENT_KEY, RESUME_AFTER_KEY, CallContext, request_proof
from apiary.server.services.request_checks import DEFAULT_CHECKS, RequestChecks, checked
from apiary.wire import pb
from apiary.wire.convert import envelope_from_proto, float_to_timestamp, timestamp_to_float

router_pb2 = pb.router_pb2
apiary_pb2 = pb.apiary_pb2
RESUME_TOKEN_KEY = "sw4rm-resume-token"

Interceptor = Callable[[Envelope, CallContext], Awaitable[str] | None]
"""Claims an envelope sent with SendMessage before the router sees it: None to leave it to
the router, else the handling to await, whose result is the reason of the accepted answer
(the coordinator chooses it at construction)."""


def _envelope_bytes_item(handout: Handout) -> router_pb2.StreamItem:
    # The stored bytes are a canonical Envelope already: parsed straight into the reply.
    item = router_pb2.StreamItem()
    item.msg.MergeFromString(handout.message.envelope)
    return item


def _shown(timestamp: Timestamp) -> None:
    """Make `timestamp` one a Timestamp can show (JSON cannot show the others): a stored
    envelope from before the limits must not stop a stream read over HTTP."""
    if not (0 <= timestamp.seconds <= TIMESTAMP_MAX_S and 0 <= timestamp.nanos < 10**9):
        timestamp.CopyFrom(float_to_timestamp(timestamp.seconds + timestamp.nanos / 1e9))


def _fields_too_long(env: Envelope, limits: Limits) -> None:
    """Refuse `env` when one of its strings is past its limit (ValidationError naming it),
    before anything of it is stored."""
    for field, value, limit in (
        ("producer_id", env.producer_id, limits.producer_id_bytes),
        ("correlation_id", env.correlation_id, limits.correlation_id_bytes),
        ("idempotency_token", env.idempotency_token, limits.idempotency_token_bytes),
        ("repo_id", env.repo_id, limits.repo_id_bytes),
        ("worktree_id", env.worktree_id, limits.worktree_id_bytes),
        ("hlc_timestamp", env.hlc_timestamp, limits.hlc_bytes),
        ("content_type", env.content_type, limits.content_type_bytes),
        ("message_id", env.message_id, limits.id_bytes),
    ):
        if len(value) > limit and utf8_size(value) > limit:
            check_id(value, field, limit)  # raises, quoting a prefix


def _deliveries(
    batch: list[Handout], traces: Mapping[str, TraceContext]
) -> apiary_pb2.InboundBatch:
    """The batch's reply; each delivery is built in place in it (no copy into the list),
    its envelope parsed straight from the stored bytes, with the trace context its message
    continues (`traces`, by message id: none without tracing)."""
    reply = apiary_pb2.InboundBatch()
    add = reply.deliveries.add
    for handout in batch:
        message = handout.message
        offset = message.offset
        # Only the fields that are set: each keyword costs a call into the message.
        delivery = add(
            offset=offset, resume_token=resume_token(message.recipient, offset),
            attempt=handout.attempt,
        )  # fmt: skip
        if handout.urgent:
            delivery.urgent = True
        if message.signature:
            delivery.signature, delivery.origin = split_origin(message.signature)
        if traces:
            trace = traces.get(message.message_id)
            if trace is not None:
                delivery.traceparent, delivery.tracestate = trace.traceparent, trace.tracestate
        delivery.msg.MergeFromString(message.envelope)
    return reply


def _results(outcomes: list[SendOutcome]) -> apiary_pb2.SendResultFrame:
    """The frame's answer, each result built in place in it."""
    reply = apiary_pb2.SendResultFrame()
    add = reply.results.add
    for outcome in outcomes:
        add(
            message_id=outcome.message_id,
            accepted=outcome.accepted,
            error_code=outcome.error_code,
            reason=outcome.reason,
            recipient=outcome.recipient,
            offset=outcome.stored.offset if outcome.stored else 0,
        )
    return reply


STREAM_SPAN = "apiary.v1.RouterStreamService/SendStream"
"""The name of a streamed envelope's span (a unary send's is its call's, SendMessage)."""


def _message_attributes(env: Envelope, recipient: str) -> dict[str, str | int | bool]:
    """A send's span attributes (OpenTelemetry's messaging names where there is one)."""
    attributes: dict[str, str | int | bool] = {
        "messaging.system": "sw4rm", "messaging.operation.name": "send",
        "messaging.message.id": env.message_id,
        "messaging.message.conversation_id": env.correlation_id,
        "apiary.producer_id": env.producer_id,
        "apiary.message_type": MESSAGE_TYPE_NAMES.get(env.message_type, str(env.message_type)),
    }  # fmt: skip
    if recipient:
        attributes["messaging.destination.name"] = recipient
    return attributes


MAX_OFFSET_DIGITS = len(str(INT64_MAX))
ENVELOPE_OVERHEAD = 576
"""Bytes of an OutboundEnvelope besides its strings and payload: tags and lengths, the
numbers, the timestamp, a signature, a traceparent (docs/tracing.md)."""


def _resume_after(agent_id: str, raw_offset: str, token: str, limits: Limits) -> int:
    """The offset to resume after: the token's, else the metadata's (ASCII digits of a
    number the stores keep)."""
    if token:
        # Tokens this server issues hold an agent id (JSON-escaped, base64): a longer text
        # is none of them, and is not decoded.
        if len(token) > 8 * limits.agent_id_bytes + 128:
            raise ValidationError.for_field("resume_token", "is not a token this server issued")
        offset = parse_resume_token(token, agent_id)
        if not 0 <= offset <= INT64_MAX:
            raise ValidationError.for_field("resume_token", "is not a token this server issued")
        return offset
    if not (raw_offset.isascii() and raw_offset.isdigit() and len(raw_offset) <= MAX_OFFSET_DIGITS):
        raise ValidationError.for_field(
            RESUME_AFTER_KEY, f"must be a non-negative integer up to {INT64_MAX}"
        )
    offset = int(raw_offset)
    if offset > INT64_MAX:
        raise ValidationError.for_field(
            RESUME_AFTER_KEY, f"must be a non-negative integer up to {INT64_MAX}"
        )
    return offset


@checked
class RouterHandler:
    def __init__(
        self,
        router: Router,
        delivery: Delivery,
        intercept: Interceptor | None = None,
        checks: RequestChecks = DEFAULT_CHECKS,
    ) -> None:
        self._router = router
        self._delivery = delivery
        self._intercept = intercept
        self._checks = checks

    async def send_message(
        self, req: router_pb2.SendMessageRequest, ctx: CallContext
    ) -> router_pb2.SendMessageResponse:
        if not req.HasField("msg"):
            raise ValidationError.for_field("msg", "is required")
        env = envelope_from_proto(req.msg)
        _fields_too_long(env, self._checks.limits)
        if req.msg.HasField("timestamp"):
            stamp = req.msg.timestamp
            check_timestamp_parts(stamp.seconds, stamp.nanos, "msg.timestamp")
            self._checks.timestamp(timestamp_to_float(stamp), "msg.timestamp")
        tracing = self._router.tracing
        if tracing is not None:
            tracing.annotate(_message_attributes(env, ctx.get(RECIPIENT_KEY)))
        claimed = self._intercept(env, ctx) if self._intercept is not None else None
        if claimed is not None:
            return router_pb2.SendMessageResponse(accepted=True, reason=await claimed)
        item = Outbound(
            env, ctx.get(RECIPIENT_KEY), raw=req.msg.SerializeToString(deterministic=True),
            signature=request_proof(ctx), remote=True,
        )  # fmt: skip
        outcome = await self._router.send(item)
        return router_pb2.SendMessageResponse(accepted=outcome.accepted, reason=outcome.reason)

    async def stream_incoming(
        self, req: router_pb2.StreamRequest, ctx: CallContext
    ) -> AsyncIterator[router_pb2.StreamItem]:
        if not req.agent_id:
            raise ValidationError.for_field("agent_id", "is required")
        after = _resume_after(
            req.agent_id, ctx.get(RESUME_AFTER_KEY, "0"), ctx.get(RESUME_TOKEN_KEY),
            self._checks.limits,
        )  # fmt: skip
        take_over = ctx.principal.is_agent(req.agent_id)
        shown = ctx.transport == "http"
        async for batch in self._delivery.stream(req.agent_id, after, take_over=take_over):
            for handout in batch:
                item = _envelope_bytes_item(handout)
                if shown:
                    _shown(item.msg.timestamp)
                yield item


@checked
class RouterStreamHandler:
    def __init__(
        self, router: Router, delivery: Delivery, checks: RequestChecks = DEFAULT_CHECKS
    ) -> None:
        self._router = router
        self._delivery = delivery
        self._pipeline = SendPipeline(router)
        self._checks = checks

    async def send_stream(
        self, frames: AsyncIterator[apiary_pb2.SendFrame], ctx: CallContext
    ) -> AsyncIterator[apiary_pb2.SendResultFrame]:
        tracing = self._router.tracing
        if tracing is None:
            async for outcomes in self._pipeline.run(self._batches(frames, ctx)):
                yield _results(outcomes)
            return
        # With tracing, each envelope is a span from its frame's arrival to its answer.
        spans: deque[list[OpenSpan]] = deque()
        try:
            async for outcomes in self._pipeline.run(self._batches(frames, ctx, spans)):
                for span, outcome in zip(spans.popleft(), outcomes, strict=True):
                    span.end(outcome.error_code, outcome.reason)
                yield _results(outcomes)
        finally:
            for unanswered in spans:
                for span in unanswered:
                    span.end("cancelled", "the stream ended before the frame was answered")

    async def _batches(
        self,
        frames: AsyncIterator[apiary_pb2.SendFrame],
        ctx: CallContext,
        spans: deque[list[OpenSpan]] | None = None,
    ) -> AsyncIterator[list[Outbound]]:
        async for frame in frames:
            settings = self._router.settings
            if len(frame.items) > settings.max_frame_items:
                raise ValidationError.for_field(
                    "items", f"at most {settings.max_frame_items} envelopes per frame"
                )
            checks = self._checks
            limits = checks.limits
            # Envelopes within every limit take at most `budget` bytes besides payloads. The
            # payload bytes are counted only when the whole frame is over the payload limit
            # or that budget (they are part of it): a frame under both needs no pass over its
            # envelopes.
            frame_size = frame.ByteSize()
            budget = len(frame.items) * (limits.envelope_ids_bytes() + ENVELOPE_OVERHEAD)
            counted = frame_size > settings.max_frame_bytes or frame_size > budget
            size = sum(len(item.msg.payload) for item in frame.items) if counted else 0
            if size > settings.max_frame_bytes:
                raise ValidationError.for_field(
                    "items",
                    f"at most {settings.max_frame_bytes} payload bytes per frame, not {size}",
                )
            suspect = frame_size - size > budget
            default = ctx.get(RECIPIENT_KEY)
            now = checks.now()
            latest = now + limits.clock_skew_s
            earliest = now - limits.timestamp_age_s if limits.timestamp_age_s else 0.0
            batch = []
            for index, item in enumerate(frame.items):
                msg = item.msg
                env = envelope_from_proto(msg)
                if suspect or item.recipient:
                    self._check_item(index, env, item.recipient, suspect)
                stamp = env.timestamp
                if stamp > latest or (stamp and stamp < earliest):
                    checks.timestamp(stamp, f"items[{index}].msg.timestamp")
                batch.append(
                    Outbound(env, item.recipient or default,
                             msg.SerializeToString(deterministic=True),
                             signature=item.signature, remote=True)
                )  # fmt: skip
            if spans is not None:
                batch = self._spanned(batch, frame.items, from_headers(ctx.metadata), spans)
            yield batch

    def _spanned(
        self,
        batch: list[Outbound],
        items: Sequence[apiary_pb2.OutboundEnvelope],
        stream_trace: TraceContext | None,
        spans: deque[list[OpenSpan]],
    ) -> list[Outbound]:
        """`batch`, each envelope with a span of its own (added to `spans`), a child of the
        context its item carries (else the stream's metadata's), whose context it carries on."""
        tracing = self._router.tracing
        assert tracing is not None
        opened: list[OpenSpan] = []
        traced: list[Outbound] = []
        for outbound, item in zip(batch, items, strict=True):
            parent = (
                TraceContext(item.traceparent, item.tracestate)
                if item.traceparent
                else stream_trace
            )
            attributes = _message_attributes(outbound.envelope, outbound.recipient)
            span = tracing.start(STREAM_SPAN, parent, attributes, kind="server")
            opened.append(span)
            traced.append(
                Outbound(outbound.envelope, outbound.recipient, outbound.raw,
                         signature=outbound.signature, remote=True, trace=span.context)
            )  # fmt: skip
        spans.append(opened)
        return traced

    def _check_item(self, index: int, env: Envelope, recipient: str, strings: bool) -> None:
        """An item's recipient, and with `strings` its envelope's strings, within their
        limits (ValidationError naming the item)."""
        limits = self._checks.limits
        try:
            check_id(recipient, "recipient", limits.agent_id_bytes)
            if strings:
                _fields_too_long(env, limits)
        except ValidationError as exc:
            field = f"items[{index}].{exc.details.get('field', 'msg')}"
            raise ValidationError(
                f"items[{index}].{exc.message}", {**exc.details, "field": field}
            ) from None

    async def inbound(
        self, req: apiary_pb2.InboundRequest, ctx: CallContext
    ) -> AsyncIterator[apiary_pb2.InboundBatch]:
        if not req.agent_id:
            raise ValidationError.for_field("agent_id", "is required")
        after = _resume_after(
            req.agent_id, str(req.resume_after), req.resume_token, self._checks.limits
        )
        take_over = ctx.principal.is_agent(req.agent_id)
        shown = ctx.transport == "http"
        traces = self._router.live.traces
        async for batch in self._delivery.stream(
            req.agent_id, after, req.max_batch, take_over=take_over
        ):
            reply = _deliveries(batch, traces)
            if shown:
                for delivery in reply.deliveries:
                    _shown(delivery.msg.timestamp)
            yield reply
