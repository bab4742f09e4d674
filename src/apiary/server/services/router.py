"""sw4rm.router.RouterService."""

from __future__ import annotations

from collections.abc import AsyncIterator

from apiary.engine.router import Router
from apiary.errors import ValidationError
from apiary.server.context import RECIPIENT_KEY, RESUME_AFTER_KEY, CallContext
from apiary.wire import pb
from apiary.wire.convert import envelope_from_proto, envelope_to_proto

router_pb2 = pb.router_pb2


class RouterHandler:
    def __init__(self, router: Router) -> None:
        self._router = router

    async def send_message(
        self, req: router_pb2.SendMessageRequest, ctx: CallContext
    ) -> router_pb2.SendMessageResponse:
        if not req.HasField("msg"):
            raise ValidationError("msg is required", {"field": "msg"})
        admission = await self._router.send(envelope_from_proto(req.msg), ctx.get(RECIPIENT_KEY))
        stored = admission.message
        return router_pb2.SendMessageResponse(
            accepted=True, reason=f"received by {stored.recipient} at offset {stored.offset}"
        )

    async def stream_incoming(
        self, req: router_pb2.StreamRequest, ctx: CallContext
    ) -> AsyncIterator[router_pb2.StreamItem]:
        if not req.agent_id:
            raise ValidationError("agent_id is required", {"field": "agent_id"})
        raw = ctx.get(RESUME_AFTER_KEY, "0")
        if not raw.isdigit():
            raise ValidationError(
                f"{RESUME_AFTER_KEY} must be a non-negative integer", {"field": RESUME_AFTER_KEY}
            )
        async for env in self._router.stream(req.agent_id, int(raw)):
            yield router_pb2.StreamItem(msg=envelope_to_proto(env))
