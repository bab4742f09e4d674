"""The messaging engine without transports, on a fake clock: for fast, deterministic tests.

async with open_test_engine() as h:
    await h.register("alice"); await h.register("bob")
    outcome = await h.send("alice", "bob", {"n": 1})
    (handout,) = await h.take("bob")
    h.clock.advance(10.0); await h.fire()
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from apiary.core.envelope import Ack, AckStage, Envelope, MessageType
from apiary.core.events import Event
from apiary.core.handoff_request import HandoffPolicy
from apiary.core.records import AgentRecord, StoredMessage
from apiary.engine.assembly import Engine, Runtime, build_engine, close_engine, load_engine
from apiary.engine.hitl import HitlSettings
from apiary.engine.negotiation.policies import NegotiationSettings
from apiary.engine.negotiation.rooms import RoomSettings
from apiary.engine.presence import PresenceSettings
from apiary.engine.router.admission import Outbound, SendOutcome, is_notice
from apiary.engine.router.inbox import Handout
from apiary.engine.settings import RouterSettings, SchedulerSettings
from apiary.engine.worktrees.settings import WorktreeSettings
from apiary.store.memory.store import open_memory_store
from apiary.store.open import open_store
from apiary.store.protocols import Store
from apiary.testing.clock import FakeClock
from apiary.testing.ids import SequentialIds
from apiary.wire.convert import ack_to_json


@dataclass
class EngineHarness:
    engine: Engine
    store: Store
    clock: FakeClock
    ids: SequentialIds
    streams: list[AsyncGenerator[list[Handout], None]] = field(default_factory=list)
    """Delivery streams `connect` opened, closed with the harness."""

    async def register(
        self,
        agent_id: str,
        *,
        modalities: Sequence[str] = ("application/json", "text/plain"),
        communication_class: str = "STANDARD",
        capacity: int | None = None,
        task_concurrency: int | None = None,
        **extra: Any,
    ) -> AgentRecord:
        """Register `agent_id` (its descriptor's other fields in `extra`: name, capabilities,
        ...), declaring `task_concurrency` when given, and announce it."""
        descriptor = {
            "agent_id": agent_id, "name": agent_id, "reasoning_connectors": ["builtin://rules"],
            "modalities_supported": list(modalities), "communication_class": communication_class,
            **extra,
        }  # fmt: skip
        record = await self.engine.registry.register(descriptor, task_concurrency=task_concurrency)
        await self.engine.presence.joined(record)
        if capacity is not None:
            self.engine.router.set_capacity(agent_id, capacity)
        return record

    def envelope(
        self, producer: str, body: Any = None, *, message_type: MessageType = MessageType.DATA,
        content_type: str = "application/json", **fields: Any,
    ) -> Envelope:  # fmt: skip
        payload = body if isinstance(body, bytes) else json.dumps(body or {}).encode()
        env = Envelope(
            message_id=str(uuid.uuid4()), producer_id=producer, message_type=message_type,
            payload=payload, content_type=content_type, content_length=len(payload),
            correlation_id=str(uuid.uuid4()), timestamp=self.clock.now(),
        )  # fmt: skip
        return replace(env, **fields)

    async def send(self, producer: str, to: str, body: Any = None, **fields: Any) -> SendOutcome:
        """Send through the router (hard errors raise, soft rejections answer)."""
        return await self.engine.router.send(Outbound(self.envelope(producer, body, **fields), to))

    async def send_env(self, env: Envelope, to: str = "") -> SendOutcome:
        return await self.engine.router.send(Outbound(env, to))

    async def ack(
        self, agent: str, message_id: str, stage: AckStage, error_code: str = "", note: str = ""
    ) -> SendOutcome:
        payload = ack_to_json(Ack(message_id, stage, error_code, note))
        env = self.envelope(agent, payload, message_type=MessageType.ACKNOWLEDGEMENT)
        outcome = await self.engine.router.send(Outbound(env))
        await self.engine.scheduler.settled()  # the dispatches the ACK made possible
        return outcome

    async def ack_frame(
        self, agent: str, acks: Sequence[tuple[str, AckStage, str, str]]
    ) -> list[SendOutcome]:
        """`agent`'s ACKs (message id, stage, error code, note) in one frame of its streaming
        sender, applied together, in order."""
        envs = [
            self.envelope(agent, ack_to_json(Ack(message_id, stage, code, note)),
                          message_type=MessageType.ACKNOWLEDGEMENT)
            for message_id, stage, code, note in acks
        ]  # fmt: skip
        outcomes = await self.engine.router.send_many([Outbound(env) for env in envs])
        await self.engine.scheduler.settled()
        return outcomes

    async def take(
        self, agent: str, resume_after: int = 0, *, notices: bool = False
    ) -> list[Handout]:
        """One batch from a new stream session of `agent` (empty when nothing is pending)."""
        delivery = self.engine.delivery
        batch = await delivery.poll(agent, await delivery.open(agent, resume_after))
        return batch if notices else [h for h in batch if not is_notice(h.message)]

    async def connect(self, agent: str) -> AsyncGenerator[list[Handout], None]:
        """Open `agent`'s delivery stream as an agent does, and keep it open (the agent
        counts as connected: presence notices and heartbeats reach it) until the stream is
        closed or the harness is. Its first batch (the directory, at least) has been handed
        out; read on with `anext`."""
        stream = self.engine.delivery.stream(agent)
        await anext(stream)
        self.streams.append(stream)
        return stream

    async def fire(self) -> int:
        return await self.engine.router.fire_due()

    async def events(self, event_type: str | None = None) -> list[Event]:
        found = await self.engine.events.read(limit=10_000)
        return [e for e in found if event_type is None or e.event_type == event_type]

    async def message(self, message_id: str) -> StoredMessage:
        """The stored message, with the hand-out counts the router writes behind stored
        first (as a clean shutdown would)."""
        await self.engine.router.flush_deliveries()
        found = await self.store.messages.get(message_id)
        assert found is not None, f"no message {message_id}"
        return found

    async def inbox_payloads(self, agent: str) -> list[dict[str, Any]]:
        """JSON payloads of every message stored for `agent`, oldest first."""
        out = []
        for m in await self.store.messages.inbox(agent, 0, 10_000):
            env = self.engine.router.codec.decode(m.envelope)
            out.append({"type": env.message_type.name, "state": m.state.value,
                        "message_id": m.message_id, **_json(env.payload)})  # fmt: skip
        return out


def _json(payload: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(payload)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


@asynccontextmanager
async def open_test_engine(
    settings: RouterSettings | None = None,
    *,
    store_url: str = "memory://",
    data_dir: Any = None,
    clock: FakeClock | None = None,
    ids: SequentialIds | None = None,
    hitl: HitlSettings | None = None,
    scheduler: SchedulerSettings | None = None,
    handoff: HandoffPolicy | None = None,
    worktrees: WorktreeSettings | None = None,
    rooms: RoomSettings | None = None,
    negotiation: NegotiationSettings | None = None,
) -> AsyncIterator[EngineHarness]:
    """An engine over `store_url` (memory by default; `sqlite:///ABSOLUTE/PATH.db` to test
    restarts). To reopen the same store, pass the same `clock` and `ids`: ids must stay unique
    across the engine's lifetimes, as random UUIDs are in a real process."""
    clock = clock or FakeClock()
    ids = ids or SequentialIds()
    runtime = Runtime(
        clock=clock, ids=ids, sleep=clock.sleep, presence=PresenceSettings(), hitl=hitl,
        handoff=handoff, rooms=rooms,
        negotiation=negotiation,
    )  # fmt: skip
    opener = open_memory_store() if store_url == "memory://" else open_store(store_url, data_dir)
    async with opener as store:
        engine = build_engine(
            store, settings or RouterSettings(), runtime, scheduler_settings=scheduler,
            data_dir=data_dir, worktree_settings=worktrees,
        )  # fmt: skip
        await load_engine(engine)
        harness = EngineHarness(engine, store, clock, ids)
        try:
            yield harness
        finally:
            for stream in harness.streams:
                await stream.aclose()
            await close_engine(engine)
