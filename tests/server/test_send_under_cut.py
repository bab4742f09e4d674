"""Sends while the database cuts the coordinator's connections (honest answers under store
faults): PostgreSQL terminates the coordinator's own backends (`pg_terminate_backend`, by
the application name its connections carry: tests/server/pg_cutter.py) again and again
while producers send under idempotency tokens. Each send is answered accepted only when its
admission committed, and `unavailable` otherwise (or when nobody can tell yet); retried with
the same token, an operation whose first attempt did commit is answered already_in_progress,
never admitted twice. Afterwards every stored message has its idempotency record and its
event (both commit with the admission) and waits in its recipient's buffer: an admission
whose commit the cut left in doubt is delivered once the store tells that it committed."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc

from apiary.core.events import EventFilter
from apiary.engine.router.dedup_gate import cache_key
from apiary.engine.settings import RouterSettings
from apiary.server.inprocess import open_test_coordinator
from apiary.wire import pb
from tests.server.pg_cutter import cut_until, cut_url
from tests.server.wire_client import envelope, error_detail, register

OPERATIONS = 120
"""Operations sent at least; more while no cut has reached a send yet (`MAX_OPERATIONS`)."""
MAX_OPERATIONS = 2_000
"""Bound on the operations sent: sends are quick enough that the first 120 may all fall
between two cuts of the pool (every 0.2 s), and the test is about the ones a cut reaches."""
IN_FLIGHT = 8
GIVE_UP_S = 120.0
IN_PROGRESS = ("already_in_progress", "duplicate_detected")
SETTINGS = RouterSettings(buffer_capacity=2 * MAX_OPERATIONS)
"""Room for every operation in bob's buffer: bob never reads, so each stays in progress."""


async def _operate(
    router: pb.router_pb2_grpc.RouterServiceStub, token: str, answers: Counter[str],
    accepted: dict[str, str],
) -> None:  # fmt: skip
    """Send one operation under `token` until it is settled: accepted, or answered as in
    progress by an earlier attempt that committed. `unavailable` is the only other answer."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + GIVE_UP_S
    while True:
        env = envelope("alice", {"token": token}, idempotency_token=token)
        try:
            reply = await router.SendMessage(
                pb.router_pb2.SendMessageRequest(msg=env),
                metadata=(("sw4rm-recipient", "bob"),),
                timeout=30,
            )
        except grpc.aio.AioRpcError as exc:
            code = error_detail(exc).error_code
            assert exc.code() is grpc.StatusCode.UNAVAILABLE, (exc.code(), code, exc.details())
            assert code == "unavailable", exc.details()
            answers["unavailable"] += 1
        else:
            if reply.accepted:
                answers["accepted"] += 1
                accepted[env.message_id] = token
                return
            assert reply.reason.startswith(IN_PROGRESS), reply.reason
            answers["in_progress"] += 1
            return
        assert loop.time() < give_up, f"{token} never settled"
        await asyncio.sleep(0.01)


async def test_a_cut_connection_answers_accepted_only_what_committed(
    tmp_path: Path, postgres_dsn: str, postgres_schema: str
) -> None:
    application = f"apiary-cut-{uuid.uuid4().hex[:8]}"
    url = cut_url(postgres_dsn, postgres_schema, application)
    tokens: list[str] = []
    answers: Counter[str] = Counter()
    accepted: dict[str, str] = {}
    async with (
        open_test_coordinator(tmp_path, url, router_settings=SETTINGS) as coordinator,
        grpc.aio.insecure_channel(str(coordinator.grpc_address)) as channel,
    ):
        await register(channel, "alice", "bob")
        router = pb.router_pb2_grpc.RouterServiceStub(channel)
        stop = asyncio.Event()
        cutter = asyncio.create_task(cut_until(stop, postgres_dsn, application))

        def next_tokens() -> Iterator[str]:
            i = 0
            while i < OPERATIONS or (not answers["unavailable"] and i < MAX_OPERATIONS):
                tokens.append(token := f"op-{i}")
                yield token
                i += 1

        queue = next_tokens()

        async def sender() -> None:
            for token in queue:
                await _operate(router, token, answers, accepted)

        try:
            await asyncio.wait_for(asyncio.gather(*(sender() for _ in range(IN_FLIGHT))), 300)
        finally:
            stop.set()
            cuts = await cutter
        assert cuts > 0, "no connection was ever cut"
        assert answers["unavailable"] > 0, f"the cuts never reached a send: {answers}"

        store = coordinator.store
        stored = await store.messages.inbox("bob", 0, 100_000)
        per_token = Counter(m.idempotency_token for m in stored)
        twice = [t for t, n in per_token.items() if n > 1]
        assert not twice, f"operations admitted twice: {twice[:5]}"
        assert set(per_token) == set(tokens), "an operation was never admitted"
        stored_ids = {m.message_id for m in stored}
        assert set(accepted) <= stored_ids, "a send answered accepted is not stored"
        for message in stored:
            record = await store.idempotency.get(cache_key("alice", message.idempotency_token))
            assert record is not None, f"{message.message_id} has no idempotency record"
            assert record.current_message_id == message.message_id
        events = await coordinator.events.read(
            0, 100_000, EventFilter(event_types=frozenset({"message.received"}))
        )
        logged = Counter(e.details["message_id"] for e in events)
        assert {m.message_id for m in stored} == set(logged), "an admission without its event"
        assert max(logged.values()) == 1
        # Every stored message waits in bob's buffer, those whose commit was in doubt too.
        discovery = pb.apiary_pb2_grpc.DiscoveryServiceStub(channel)
        for _ in range(200):
            listed = await discovery.ListAgents(pb.apiary_pb2.ListAgentsRequest())
            depth = {a.descriptor.agent_id: a.buffer_depth for a in listed.agents}["bob"]
            if depth == len(stored):
                break
            await asyncio.sleep(0.05)
        assert depth == len(stored), f"{len(stored)} stored, {depth} in bob's buffer"
