"""Buffer capacity, credits and the maximum age in cluster mode (docs/cluster.md, "Buffers,
credits and the maximum age"): two coordinators serving one PostgreSQL schema. An agent's
buffer fills with the messages both replicas admitted for it, and the one past its capacity
is refused buffer_full whichever replica admits it; a producer's credits at an agent are
counted over both, and a credit comes back when the agent acknowledges on either; a message
waiting past `max_age_s` for an agent with no stream on any replica fails once, on the
owner of its partition, and one whose agent streams on the other replica does not; a
tenant's `queued_messages` quota counts the messages admitted on both."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import grpc
import pytest

from apiary.core.envelope import AckStage, Envelope, MessageType
from apiary.core.records import MessageState
from apiary.engine.router.admission import Outbound, SendOutcome
from apiary.engine.settings import RouterSettings
from apiary.server.auth.settings import AuthSettings, Quota
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from apiary.wire import pb
from tests.server.test_cluster_replicas import (
    PARTITIONS,
    _ack,
    _keeper,
    _read,
    _register,
    _settings,
    _stop,
    _until,
)
from tests.server.wire_client import envelope, error_detail

pytestmark = pytest.mark.postgres


@asynccontextmanager
async def _two(
    tmp_path: Path, url: str, settings: RouterSettings
) -> AsyncIterator[tuple[Coordinator, Coordinator]]:
    async with AsyncExitStack() as stack:
        a, b = [
            await stack.enter_async_context(
                open_test_coordinator(
                    tmp_path / name, url, cluster=_settings(name), router_settings=settings
                )
            )
            for name in ("a", "b")
        ]
        await _until(
            lambda: len(_keeper(a).owned()) == len(_keeper(b).owned()) == PARTITIONS // 2,
            "the partitions shared between the two replicas",
        )
        yield a, b


async def _offer(replica: Coordinator, producer: str, to: str) -> SendOutcome:
    payload = json.dumps({"n": 1}).encode()
    env = Envelope(
        message_id=str(uuid.uuid4()), producer_id=producer, message_type=MessageType.DATA,
        payload=payload, content_type="application/json", content_length=len(payload),
        correlation_id=str(uuid.uuid4()),
    )  # fmt: skip
    return await replica.router.send(Outbound(env, to))


async def test_an_agents_buffer_is_counted_over_both_replicas(tmp_path: Path, url: str) -> None:
    async with _two(tmp_path, url, RouterSettings(buffer_capacity=3)) as (a, b):
        await _register(a, "bob")
        await _register(a, "alice")
        await _until(lambda: b.registry.known("bob") is not None, "B knows bob")
        admitted = [await _offer(r, "alice", "bob") for r in (a, b, a)]
        assert all(o.accepted for o in admitted), [o.reason for o in admitted]
        # Bob has no stream: neither replica holds his messages in memory; the store counts.
        for replica in (b, a):
            full = await _offer(replica, "alice", "bob")
            assert not full.accepted and full.error_code == "buffer_full"
            assert "capacity exceeded for agent=bob (3/3)" in full.reason
        assert await a.store.messages.count("bob", frozenset({MessageState.RECEIVED})) == 3

        # Bob reads one (READ leaves the buffer) through B: there is room again on A.
        reader = _read(b, "bob")
        await _until(lambda: len(reader.messages) == 3, "bob's stream on B receives the three")
        await _ack(b, "bob", reader.messages[0].message_id, AckStage.READ)
        room = await _offer(a, "alice", "bob")
        assert room.accepted, room.reason
        await _stop(reader)


async def test_a_producers_credits_are_counted_over_both_replicas(tmp_path: Path, url: str) -> None:
    settings = RouterSettings(credit_window=4, per_producer_cap=2)
    async with _two(tmp_path, url, settings) as (a, b):
        for agent in ("bob", "alice", "carol"):
            await _register(a, agent)
        await _until(lambda: b.registry.known("carol") is not None, "B knows everyone")
        first, second = await _offer(a, "alice", "bob"), await _offer(b, "alice", "bob")
        assert first.accepted and second.accepted
        # Alice holds her cap of 2 at bob, one through each replica.
        for replica in (a, b):
            capped = await _offer(replica, "alice", "bob")
            assert not capped.accepted and capped.error_code == "buffer_full"
            assert capped.reason.endswith("no credit for alice at bob: producer_cap (2/2)")
        both = [await _offer(r, "carol", "bob") for r in (b, a)]
        assert all(o.accepted for o in both)
        window = await _offer(b, "carol", "bob")
        assert not window.accepted and "window_exhausted (4/4)" in window.reason

        # Bob finishes alice's first message through B: the credit comes back on A too.
        reader = _read(b, "bob")
        await _until(lambda: len(reader.messages) == 4, "bob's stream receives the four")
        done = next(m for m in reader.messages if m.message_id == first.message_id)
        await _ack(b, "bob", done.message_id, AckStage.FULFILLED)
        again = await _offer(a, "alice", "bob")
        assert again.accepted, again.reason
        await _stop(reader)


async def test_a_message_past_the_maximum_age_fails_once_on_its_partitions_owner(
    tmp_path: Path, url: str
) -> None:
    settings = RouterSettings(max_age_s=1.0, ack_timeout_s=60.0)
    async with _two(tmp_path, url, settings) as (a, b):
        await _register(a, "bob")
        await _register(a, "alice")
        await _until(lambda: b.registry.known("alice") is not None, "B knows alice")
        alice = _read(b, "alice")
        await _until(lambda: b.router.streaming("alice"), "alice streams on B")
        # Bob has no stream on any replica: the message waits, then ages out.
        sent = await _offer(a, "alice", "bob")
        assert sent.accepted
        await _until(lambda: len(alice.acks) == 1, "alice is NACKed once")
        nack = alice.acks[0]
        assert (nack.ack_for_message_id, nack.error_code) == (sent.message_id, "agent_unavailable")
        assert "bob has had no live stream on any replica" in nack.note
        stored = await b.store.messages.get(sent.message_id)
        assert stored is not None and stored.state is MessageState.FAILED
        entries = await a.store.dlq.list()
        assert [(e.message_id, e.error_code) for e in entries] == [
            (sent.message_id, "agent_unavailable")
        ]
        fired = [r.cluster.timers.fired for r in (a, b) if r.cluster is not None]
        assert sorted(fired) == [0, 1]
        await _stop(alice)


async def _send_over_grpc(replica: Coordinator, producer: str, to: str) -> str:
    """What SendMessage through `replica` answers: 'accepted', or the error's code, limit
    and message."""
    async with grpc.aio.insecure_channel(str(replica.grpc_address)) as channel:
        router = pb.router_pb2_grpc.RouterServiceStub(channel)
        try:
            reply = await router.SendMessage(
                pb.router_pb2.SendMessageRequest(msg=envelope(producer, {"n": 1})),
                metadata=(("sw4rm-recipient", to),),
            )
        except grpc.aio.AioRpcError as exc:
            detail = error_detail(exc)
            return f"{detail.error_code} {detail.details['limit']}: {detail.message}"
    return "accepted" if reply.accepted else f"refused: {reply.reason}"


async def test_a_tenants_queued_messages_quota_is_counted_over_both_replicas(
    tmp_path: Path, url: str
) -> None:
    """The tenant's messages admitted on either replica count: at its quota on A, it is
    refused on B (to another recipient), with the quota's error; a message read makes room."""
    auth = AuthSettings(quotas={"*": Quota(queued_messages=2)})
    async with AsyncExitStack() as stack:
        a, b = [
            await stack.enter_async_context(
                open_test_coordinator(tmp_path / name, url, cluster=_settings(name), auth=auth)
            )
            for name in ("a", "b")
        ]
        for agent in ("alice", "bob", "carol"):
            await _register(a, agent)
        await _until(lambda: b.registry.known("carol") is not None, "B knows carol")
        assert await _send_over_grpc(a, "alice", "bob") == "accepted"
        first_on_b = await _send_over_grpc(b, "alice", "carol")
        assert first_on_b == "accepted"
        for replica, to in ((a, "bob"), (b, "carol"), (b, "bob")):
            refused = await _send_over_grpc(replica, "alice", to)
            used = "tenant default has used its queued_messages quota (2 of 2)"
            assert refused.startswith(f"quota_exceeded queued_messages: {used}"), refused
        # Neither replica holds the messages in memory (no stream): the store counted.
        assert a.router.queued() == b.router.queued() == 0
        # What the coordinator produces itself (not a client's call: a Scheduler's
        # dispatch) is not refused by the quota, as on one coordinator; it counts.
        assert (await _offer(b, "alice", "bob")).accepted
        # bob reads his two messages (through A): 1 of 2 queued, room again, on B.
        for message in await a.store.messages.inbox("bob"):
            await _ack(a, "bob", message.message_id, AckStage.READ)
        assert await _send_over_grpc(b, "alice", "carol") == "accepted"
        assert (await _send_over_grpc(a, "alice", "bob")).startswith("quota_exceeded")


async def test_admissions_at_once_on_both_replicas_never_pass_the_quota(
    tmp_path: Path, url: str
) -> None:
    """Sends to different recipients (whose offset counters do not serialize them) at once
    through both replicas: the quota's row lock does, so exactly the quota is admitted."""
    auth = AuthSettings(quotas={"*": Quota(queued_messages=4)})
    recipients = [f"r{i}" for i in range(12)]
    async with AsyncExitStack() as stack:
        a, b = [
            await stack.enter_async_context(
                open_test_coordinator(tmp_path / name, url, cluster=_settings(name), auth=auth)
            )
            for name in ("a", "b")
        ]
        for agent in ("alice", *recipients):
            await _register(a, agent)
        await _until(lambda: b.registry.known(recipients[-1]) is not None, "B knows them")
        answers = await asyncio.gather(*(
            _send_over_grpc((a, b)[i % 2], "alice", to) for i, to in enumerate(recipients)
        ))  # fmt: skip
        assert answers.count("accepted") == 4, answers
        assert all(x == "accepted" or x.startswith("quota_exceeded") for x in answers), answers
        stored = [len(await a.store.messages.inbox(to)) for to in recipients]
        assert sum(stored) == 4
