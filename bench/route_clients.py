"""Producer and consumer processes of bench/route.py (they talk to Apiary or the bare relay
through the same protos, so only the server differs between the two runs)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import grpc

from apiary.wire import pb

c = pb.common_pb2
a = pb.apiary_pb2


def _descriptor(agent_id: str) -> Any:
    return pb.registry_pb2.RegisterAgentRequest(
        agent=pb.registry_pb2.AgentDescriptor(
            agent_id=agent_id, name=agent_id, reasoning_connectors=["builtin://rules"],
            modalities_supported=["application/json"],
        )
    )  # fmt: skip


class Sequence:
    def __init__(self) -> None:
        self.value = int(time.time() * 1_000_000)

    def next(self) -> int:
        self.value += 1
        return self.value


def envelope(producer: str, seq: Sequence, message_type: int, body: dict[str, Any]) -> Any:
    payload = json.dumps(body, separators=(",", ":")).encode()
    message_id = str(uuid.uuid4())
    return c.Envelope(
        message_id=message_id, producer_id=producer, correlation_id=message_id,
        sequence_number=seq.next(), message_type=message_type, content_type="application/json",
        content_length=len(payload), payload=payload,
    )  # fmt: skip


async def register(channel: grpc.aio.Channel, agent_id: str) -> None:
    reply = await pb.registry_pb2_grpc.RegistryServiceStub(channel).RegisterAgent(
        _descriptor(agent_id)
    )
    assert reply.accepted, reply.reason


async def consumer(address: str, agent_id: str, ready: asyncio.Event | None = None) -> None:
    """Acknowledges every DATA delivery FULFILLED, one ACK frame per inbound batch."""
    seq = Sequence()
    async with grpc.aio.insecure_channel(address) as channel:
        await register(channel, agent_id)
        stub = pb.apiary_pb2_grpc.RouterStreamServiceStub(channel)
        acks = stub.SendStream()

        async def drain() -> None:
            async for _ in acks:
                pass

        drainer = asyncio.create_task(drain())
        inbound = stub.Inbound(a.InboundRequest(agent_id=agent_id, max_batch=256))
        if ready is not None:
            ready.set()
        async for batch in inbound:
            items = [
                a.OutboundEnvelope(msg=envelope(agent_id, seq, c.ACKNOWLEDGEMENT, {
                    "ack_for_message_id": d.msg.message_id, "ack_stage": "FULFILLED",
                }))
                for d in batch.deliveries if d.msg.message_type == c.DATA
            ]  # fmt: skip
            if items:
                await acks.write(a.SendFrame(items=items))
        drainer.cancel()


class Tracker:
    def __init__(self, n: int) -> None:
        self.sent: dict[str, float] = {}
        self.latencies: list[float] = []
        self.rejected = 0
        self.done = asyncio.Event()
        self.n = n

    def fulfilled(self, message_id: str) -> None:
        started = self.sent.pop(message_id, None)
        if started is not None:
            self.latencies.append(time.perf_counter() - started)
            if len(self.latencies) + self.rejected >= self.n:
                self.done.set()


async def _watch_acks(channel: grpc.aio.Channel, agent_id: str, tracker: Tracker) -> None:
    stub = pb.apiary_pb2_grpc.RouterStreamServiceStub(channel)
    async for batch in stub.Inbound(a.InboundRequest(agent_id=agent_id, max_batch=256)):
        for d in batch.deliveries:
            if d.msg.message_type == c.ACKNOWLEDGEMENT:
                body = json.loads(d.msg.payload)
                if body.get("ack_stage") == "FULFILLED":
                    tracker.fulfilled(body["ack_for_message_id"])


async def _unary(
    channel: grpc.aio.Channel, me: str, to: str, n: int, inflight: int, t: Tracker
) -> None:
    stub = pb.router_pb2_grpc.RouterServiceStub(channel)
    seq = Sequence()
    counter = iter(range(n))

    async def worker() -> None:
        for i in counter:
            env = envelope(me, seq, c.DATA, {"i": i})
            t.sent[env.message_id] = time.perf_counter()
            reply = await stub.SendMessage(
                pb.router_pb2.SendMessageRequest(msg=env), metadata=(("sw4rm-recipient", to),)
            )
            if not reply.accepted:
                t.sent.pop(env.message_id, None)
                t.rejected += 1

    await asyncio.gather(*(worker() for _ in range(inflight)))


async def _stream(
    channel: grpc.aio.Channel, me: str, to: str, n: int, frame: int, window: int, t: Tracker
) -> None:
    stub = pb.apiary_pb2_grpc.RouterStreamServiceStub(channel)
    call = stub.SendStream()
    seq = Sequence()
    slots = asyncio.Semaphore(window)

    async def read() -> None:
        async for reply in call:
            for r in reply.results:
                if not r.accepted:
                    t.sent.pop(r.message_id, None)
                    t.rejected += 1
            slots.release()

    reader = asyncio.create_task(read())
    for start in range(0, n, frame):
        await slots.acquire()
        items = []
        now = time.perf_counter()
        for i in range(start, min(start + frame, n)):
            env = envelope(me, seq, c.DATA, {"i": i})
            t.sent[env.message_id] = now
            items.append(a.OutboundEnvelope(msg=env, recipient=to))
        await call.write(a.SendFrame(items=items))
    await t.done.wait()
    await call.done_writing()
    reader.cancel()


async def producer(
    address: str, me: str, to: str, n: int, mode: str, inflight: int, frame: int
) -> dict[str, Any]:
    tracker = Tracker(n)
    async with grpc.aio.insecure_channel(address) as channel:
        await register(channel, me)
        watcher = asyncio.create_task(_watch_acks(channel, me, tracker))
        started, cpu = time.perf_counter(), time.process_time()
        if mode == "unary":
            await _unary(channel, me, to, n, inflight, tracker)
        else:
            await _stream(channel, me, to, n, frame, inflight, tracker)
        await asyncio.wait_for(tracker.done.wait(), 600)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        watcher.cancel()
    lat = sorted(tracker.latencies)
    return {
        "messages": len(lat), "rejected": tracker.rejected, "seconds": round(elapsed, 3),
        "msgs_per_s": round(len(lat) / elapsed), "p50_ms": round(lat[len(lat) // 2] * 1000, 2),
        "p99_ms": round(lat[int(len(lat) * 0.99)] * 1000, 2), "cpu_s": round(cpu, 3),
    }  # fmt: skip
