"""sw4rm.router.RouterService and apiary.v1.RouterStreamService."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

from apiary.core.envelope import Envelope
from apiary.core.signatures import split_origin
from apiary.engine.router.admission import Outbound, SendOutcome
from apiary.engine.router.delivery import Delivery, parse_resume_token, resume_token
from apiary.engine.router.inbox import Handout
from apiary.engine.router.router import Router
from apiary.engine.router.send_pipeline import SendPipeline
from apiary.errors import ValidationError
from apiary.server.context import RECIPIENT_KEY, RESUME_AFTER_KEY, CallContext, request_proof
from apiary.wire import pb
from apiary.wire.convert import envelope_from_proto

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


def _deliveries(batch: list[Handout]) -> apiary_pb2.InboundBatch:
    """The batch's reply; each delivery is built in place in it (no copy into the list),
    its envelope parsed straight from the stored bytes."""
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


def _resume_after(agent_id: str, raw_offset: str, token: str) -> int:
    if token:
        return parse_resume_token(token, agent_id)
    if not raw_offset.isdigit():
        raise ValidationError.for_field(RESUME_AFTER_KEY, "must be a non-negative integer")
    return int(raw_offset)


class RouterHandler:
    def __init__(
        self, router: Router, delivery: Delivery, intercept: Interceptor | None = None
    ) -> None:
        self._router = router
        self._delivery = delivery
        self._intercept = intercept

    async def send_message(
        self, req: router_pb2.SendMessageRequest, ctx: CallContext
    ) -> router_pb2.SendMessageResponse:
        if not req.HasField("msg"):
            raise ValidationError.for_field("msg", "is required")
        env = envelope_from_proto(req.msg)
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
            req.agent_id, ctx.get(RESUME_AFTER_KEY, "0"), ctx.get(RESUME_TOKEN_KEY)
        )
        take_over = ctx.principal.is_agent(req.agent_id)
        async for batch in self._delivery.stream(req.agent_id, after, take_over=take_over):
            for handout in batch:
                yield _envelope_bytes_item(handout)


class RouterStreamHandler:
    def __init__(self, router: Router, delivery: Delivery) -> None:
        self._router = router
        self._delivery = delivery
        self._pipeline = SendPipeline(router)

    async def send_stream(
        self, frames: AsyncIterator[apiary_pb2.SendFrame], ctx: CallContext
    ) -> AsyncIterator[apiary_pb2.SendResultFrame]:
        async for outcomes in self._pipeline.run(self._batches(frames, ctx)):
            yield _results(outcomes)

    async def _batches(
        self, frames: AsyncIterator[apiary_pb2.SendFrame], ctx: CallContext
    ) -> AsyncIterator[list[Outbound]]:
        async for frame in frames:
            settings = self._router.settings
            if len(frame.items) > settings.max_frame_items:
                raise ValidationError.for_field(
                    "items", f"at most {settings.max_frame_items} envelopes per frame"
                )
            # The payload bytes are counted only when the whole frame is over the limit (they
            # are part of it): a frame well under it needs no pass over its envelopes.
            over = frame.ByteSize() > settings.max_frame_bytes
            size = sum(len(item.msg.payload) for item in frame.items) if over else 0
            if size > settings.max_frame_bytes:
                raise ValidationError.for_field(
                    "items",
                    f"at most {settings.max_frame_bytes} payload bytes per frame, not {size}",
                )
            default = ctx.get(RECIPIENT_KEY)
            batch = []
            for item in frame.items:
                msg = item.msg
                batch.append(
                    Outbound(envelope_from_proto(msg), item.recipient or default,
                             msg.SerializeToString(deterministic=True),
                             signature=item.signature, remote=True)
                )  # fmt: skip
            yield batch

    async def inbound(
        self, req: apiary_pb2.InboundRequest, ctx: CallContext
    ) -> AsyncIterator[apiary_pb2.InboundBatch]:
        if not req.agent_id:
            raise ValidationError.for_field("agent_id", "is required")
        after = _resume_after(req.agent_id, str(req.resume_after), req.resume_token)
        take_over = ctx.principal.is_agent(req.agent_id)
        async for batch in self._delivery.stream(
            req.agent_id, after, req.max_batch, take_over=take_over
        ):
            yield _deliveries(batch)
