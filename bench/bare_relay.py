"""The ceiling for bench/route.py: a grpc.aio server that speaks the same protos as Apiary
but only moves bytes between in-memory queues (no validation, no persistence, no events)."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from collections.abc import AsyncIterator
from typing import Any

import grpc

from apiary.wire import pb

a = pb.apiary_pb2


class Relay:
    def __init__(self) -> None:
        self.queues: defaultdict[str, asyncio.Queue[Any]] = defaultdict(asyncio.Queue)
        self.producers: dict[str, str] = {}
        self.offsets: defaultdict[str, int] = defaultdict(int)

    def route(self, msg: Any, recipient: str) -> a.SendResult:
        if msg.message_type == pb.common_pb2.ACKNOWLEDGEMENT:
            recipient = self.producers.pop(json.loads(msg.payload)["ack_for_message_id"], "")
        else:
            self.producers[msg.message_id] = msg.producer_id
        self.offsets[recipient] += 1
        self.queues[recipient].put_nowait((self.offsets[recipient], msg))
        return a.SendResult(message_id=msg.message_id, accepted=True, recipient=recipient)


class Registry(pb.registry_pb2_grpc.RegistryServiceServicer):
    async def RegisterAgent(self, request: Any, context: Any) -> Any:  # noqa: N802
        return pb.registry_pb2.RegisterAgentResponse(accepted=True)


class Router(pb.router_pb2_grpc.RouterServiceServicer):
    def __init__(self, relay: Relay) -> None:
        self.relay = relay

    async def SendMessage(self, request: Any, context: Any) -> Any:  # noqa: N802
        metadata = dict(context.invocation_metadata())
        self.relay.route(request.msg, metadata.get("sw4rm-recipient", ""))
        return pb.router_pb2.SendMessageResponse(accepted=True)


class Streams(pb.apiary_pb2_grpc.RouterStreamServiceServicer):
    def __init__(self, relay: Relay) -> None:
        self.relay = relay

    async def SendStream(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:  # noqa: N802
        async for frame in request_iterator:
            yield a.SendResultFrame(
                results=[self.relay.route(i.msg, i.recipient) for i in frame.items]
            )

    async def Inbound(self, request: Any, context: Any) -> AsyncIterator[Any]:  # noqa: N802
        queue = self.relay.queues[request.agent_id]
        while True:
            items = [await queue.get()]
            while not queue.empty() and len(items) < (request.max_batch or 256):
                items.append(queue.get_nowait())
            yield a.InboundBatch(
                deliveries=[a.Delivery(offset=o, attempt=1, msg=m) for o, m in items]
            )


async def serve(port: int) -> None:
    relay = Relay()
    server = grpc.aio.server()
    pb.registry_pb2_grpc.add_RegistryServiceServicer_to_server(Registry(), server)
    pb.router_pb2_grpc.add_RouterServiceServicer_to_server(Router(relay), server)
    pb.apiary_pb2_grpc.add_RouterStreamServiceServicer_to_server(Streams(relay), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()
