"""Cluster mode in process (docs/cluster.md): two coordinators serving one PostgreSQL schema
as replicas. An agent registered through one is known to the other; a message admitted by
either is stored once and delivered, in offset order, to its recipient's stream wherever
that is; an ACK sent to either reaches the producer's stream on the other; a replica that
stops without releasing anything (as a killed process) has its partitions taken over, its
ACK deadlines fired once by the new owner, and the messages pending for its agents
delivered on the other replica. One idempotency token sent to both at once is admitted
once; every dead letter is seen on both and requeued once. (Tenants besides the default:
tests/server/test_cluster_tenants.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import aiohttp
import pytest

from apiary.core.cluster.partitions import partition_of
from apiary.core.envelope import Ack, AckStage, Envelope, MessageType
from apiary.core.records import MessageState
from apiary.engine.cluster.keeper import LeaseKeeper
from apiary.engine.cluster.settings import ClusterSettings
from apiary.engine.router.admission import Outbound, is_notice
from apiary.engine.router.inbox import Handout
from apiary.engine.settings import RouterSettings
from apiary.errors import ApiaryError, NoRouteError
from apiary.sdk.connection import Connection
from apiary.sdk.errors import CoordinatorUnreachableError
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from apiary.wire.convert import ack_to_json

pytestmark = pytest.mark.postgres

WAIT_S = 30.0
PARTITIONS = 8
LEASE_S = 1.5
ACK_TIMEOUT_S = 2.0
BUFFER = 1000
"""Room for every message a test sends an agent before it reads them (the store counts an
agent's buffer over both replicas: tests/server/test_cluster_limits.py)."""


@dataclass
class Reader:
    """What one agent's stream received, read in the background."""

    messages: list[Envelope] = field(default_factory=list)
    """Messages from agents (not the coordinator's notices), in the order handed out."""
    acks: list[Ack] = field(default_factory=list)
    """ACKs and NACKs for messages the agent produced."""
    offsets: list[int] = field(default_factory=list)
    task: asyncio.Task[None] | None = None


async def _until(condition: Callable[[], bool], what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"never: {what}")
        await asyncio.sleep(0.02)


def _settings(replica_id: str) -> ClusterSettings:
    return ClusterSettings(True, replica_id, LEASE_S, PARTITIONS)


@asynccontextmanager
async def _replica(tmp_path: Path, url: str, replica_id: str) -> AsyncIterator[Coordinator]:
    async with open_test_coordinator(
        tmp_path / replica_id, url, cluster=_settings(replica_id),
        router_settings=RouterSettings(ack_timeout_s=ACK_TIMEOUT_S, buffer_capacity=BUFFER),
    ) as coordinator:  # fmt: skip
        yield coordinator


def _envelope(
    producer: str, body: object, message_type: MessageType = MessageType.DATA
) -> Envelope:
    payload = json.dumps(body).encode()
    return Envelope(
        message_id=str(uuid.uuid4()), producer_id=producer, message_type=message_type,
        payload=payload, content_type="application/json", content_length=len(payload),
        correlation_id=str(uuid.uuid4()),
    )  # fmt: skip


async def _register(replica: Coordinator, agent_id: str) -> None:
    record = await replica.registry.register({
        "agent_id": agent_id, "name": agent_id, "reasoning_connectors": ["builtin://rules"],
        "modalities_supported": ["application/json"],
    })  # fmt: skip
    await replica.presence.joined(record)


async def _send(replica: Coordinator, producer: str, to: str, body: object) -> str:
    env = _envelope(producer, body)
    outcome = await replica.router.send(Outbound(env, to))
    assert outcome.accepted, outcome.reason
    return env.message_id


async def _ack(replica: Coordinator, agent_id: str, message_id: str, stage: AckStage) -> None:
    env = _envelope(agent_id, None, MessageType.ACKNOWLEDGEMENT)
    payload = ack_to_json(Ack(message_id, stage))
    env = replace(env, payload=payload, content_length=len(payload))
    outcome = await replica.router.send(Outbound(env))
    assert outcome.accepted, outcome.reason


def _read(replica: Coordinator, agent_id: str) -> Reader:
    """Open `agent_id`'s stream on `replica` and read it in the background."""
    reader = Reader()
    codec = replica.router.codec

    async def read() -> None:
        stream: AsyncGenerator[list[Handout], None] = replica.delivery.stream(agent_id)
        try:
            async for batch in stream:
                for handout in batch:
                    env = codec.decode(handout.message.envelope)
                    if env.message_type is MessageType.ACKNOWLEDGEMENT:
                        reader.acks.append(codec.decode_ack(env))
                    elif not is_notice(handout.message):
                        reader.messages.append(env)
                        reader.offsets.append(handout.message.offset)
        finally:
            await stream.aclose()

    reader.task = asyncio.create_task(read())
    return reader


async def _stop(reader: Reader) -> None:
    assert reader.task is not None
    reader.task.cancel()
    await asyncio.gather(reader.task, return_exceptions=True)


def _owned_by(replica: Coordinator, prefix: str) -> str:
    """An agent id whose partition `replica` owns now."""
    assert replica.cluster is not None
    owned = replica.cluster.keeper.owned()
    return next(
        f"{prefix}-{n}" for n in range(1000) if partition_of(f"{prefix}-{n}", PARTITIONS) in owned
    )


def _keeper(replica: Coordinator) -> LeaseKeeper:
    assert replica.cluster is not None
    return replica.cluster.keeper


@asynccontextmanager
async def _two(tmp_path: Path, url: str) -> AsyncIterator[tuple[Coordinator, Coordinator]]:
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(_replica(tmp_path, url, "a"))
        b = await stack.enter_async_context(_replica(tmp_path, url, "b"))
        a_keeper, b_keeper = _keeper(a), _keeper(b)
        await _until(
            lambda: len(a_keeper.owned()) == len(b_keeper.owned()) == PARTITIONS // 2,
            "the partitions shared between the two replicas",
        )
        yield a, b


async def test_bob_on_a_receives_from_alice_on_b_and_the_ack_reaches_alice(
    tmp_path: Path, url: str
) -> None:
    async with _two(tmp_path, url) as (a, b):
        await _register(a, "bob")
        await _register(b, "alice")
        # Registered through A, bob is known to B (and alice to A): routed, not no_route.
        await _until(lambda: b.registry.known("bob") is not None, "B knows bob")
        await _until(lambda: a.registry.known("alice") is not None, "A knows alice")
        bob, alice = _read(a, "bob"), _read(b, "alice")
        await _until(lambda: a.router.streaming("bob") and b.router.streaming("alice"), "streams")

        sent = await _send(b, "alice", "bob", {"n": 1})
        await _until(lambda: len(bob.messages) == 1, "bob's stream on A receives it")
        assert bob.messages[0].message_id == sent
        await _ack(a, "bob", sent, AckStage.FULFILLED)
        await _until(lambda: len(alice.acks) == 1, "the ACK reaches alice's stream on B")
        assert (alice.acks[0].ack_for_message_id, alice.acks[0].ack_stage) == (
            sent, AckStage.FULFILLED,
        )  # fmt: skip
        stored = await b.store.messages.get(sent)
        assert stored is not None and stored.state is MessageState.FULFILLED

        # Deregistered through A: B forgets bob, and refuses to route to him.
        await a.registry.deregister("bob", "leaving")
        await _until(lambda: b.registry.known("bob") is None, "B forgets bob")
        with pytest.raises(NoRouteError):
            await b.router.send(Outbound(_envelope("alice", {"n": 2}), "bob"))
        await _stop(bob)
        await _stop(alice)


async def test_an_agent_registered_a_moment_ago_on_one_replica_is_routed_to_by_the_other(
    tmp_path: Path, url: str
) -> None:
    async with _two(tmp_path, url) as (a, b):
        await _register(a, "bob")
        bob = _read(a, "bob")
        await _until(lambda: a.router.streaming("bob"), "bob's stream")
        # dave registers on B and sends at once, before A's poll or a note could tell A: A
        # looks dave up in the store when bob's ACK is forwarded to him, and when bob
        # writes to him, instead of answering no_route.
        await _register(b, "dave")
        dave = _read(b, "dave")
        sent = await _send(b, "dave", "bob", {"n": 1})
        await _until(lambda: len(bob.messages) == 1, "bob receives it")
        await _ack(a, "bob", sent, AckStage.FULFILLED)
        reply = await _send(a, "bob", "dave", {"re": 1})
        await _until(lambda: len(dave.acks) == 1 and len(dave.messages) == 1, "dave hears back")
        assert dave.acks[0].ack_for_message_id == sent
        assert dave.messages[0].message_id == reply
        # Nobody registered erin anywhere: no_route still, after the store is asked.
        with pytest.raises(NoRouteError):
            await a.router.send(Outbound(_envelope("bob", {"n": 2}), "erin"))
        await _stop(bob)
        await _stop(dave)


async def test_an_agents_messages_through_both_replicas_arrive_in_offset_order(
    tmp_path: Path, url: str
) -> None:
    async with _two(tmp_path, url) as (a, b):
        await _register(a, "bob")
        await _register(b, "alice")
        await _until(lambda: b.registry.known("bob") is not None, "B knows bob")
        bob = _read(a, "bob")
        await _until(lambda: a.router.streaming("bob"), "bob's stream")
        # One at a time through alternating replicas, then a burst through both at once.
        sent = [await _send((a, b)[n % 2], "alice", "bob", {"n": n}) for n in range(6)]
        burst = await asyncio.gather(
            *(_send((a, b)[n % 2], "alice", "bob", {"n": n}) for n in range(6, 16))
        )
        await _until(lambda: len(bob.messages) == 16, "all 16 at bob's stream")
        received = [env.message_id for env in bob.messages]
        assert received[:6] == sent
        assert sorted(received[6:]) == sorted(burst)
        assert bob.offsets == sorted(bob.offsets)  # handed out in offset order
        assert len(set(bob.offsets)) == 16  # each once
        for message_id in received:
            await _ack(a, "bob", message_id, AckStage.FULFILLED)
        await _stop(bob)


async def test_one_token_sent_to_both_replicas_at_once_is_admitted_once(
    tmp_path: Path, url: str
) -> None:
    """Each replica reserves a token in memory while it admits it; across replicas the
    store decides (the token's record is inserted with the admission, over none or the one
    deduplication found): of two attempts of one token sent at the same moment to the two
    replicas, exactly one is admitted, the other answered already_in_progress naming it;
    once the admitted one is FULFILLED, attempts to both are answered duplicate_detected with
    the cached outcome."""
    async with _two(tmp_path, url) as (a, b):
        await _register(a, "bob")
        await _register(b, "alice")
        await _until(lambda: a.registry.known("alice") is not None, "A knows alice")
        await _until(lambda: b.registry.known("bob") is not None, "B knows bob")
        admitted: dict[str, str] = {}
        for n in range(60):
            token = f"tok-{n}"
            attempts = [replace(_envelope("alice", {"n": n}), idempotency_token=token)
                        for _ in range(2)]  # fmt: skip
            outcomes = await asyncio.gather(*(
                replica.router.send(Outbound(env, "bob"))
                for replica, env in zip((a, b), attempts, strict=True)
            ))  # fmt: skip
            accepted = [o.message_id for o in outcomes if o.accepted]
            assert len(accepted) == 1, [o.reason for o in outcomes]
            (refused,) = [o for o in outcomes if not o.accepted]
            assert refused.error_code == "already_in_progress", refused.reason
            assert refused.error is not None
            assert refused.error.details["original_message_id"] == accepted[0]
            admitted[token] = accepted[0]
        stored = await a.store.messages.inbox("bob", limit=1000)
        by_token = sorted((m.idempotency_token, m.message_id) for m in stored)
        assert by_token == sorted(admitted.items())  # one message per token, the admitted

        await _ack(a, "bob", admitted["tok-0"], AckStage.FULFILLED)
        again = [replace(_envelope("alice", {}), idempotency_token="tok-0") for _ in range(2)]
        outcomes = await asyncio.gather(*(
            replica.router.send(Outbound(env, "bob"))
            for replica, env in zip((a, b), again, strict=True)
        ))  # fmt: skip
        for outcome in outcomes:
            assert outcome.error_code == "duplicate_detected", outcome.reason
            assert outcome.details["original_message_id"] == admitted["tok-0"]
            assert outcome.details["original_status"] == "FULFILLED"


async def test_every_replica_sees_every_dead_letter_and_requeues_it_once(
    tmp_path: Path, url: str
) -> None:
    """Dead letters are in the store: each replica lists, reads and exports those every
    replica recorded; an entry is marked requeued in the transaction that admits its copy,
    only if no requeue marked it first, so that requeues of one entry sent at the same
    moment to both replicas admit one copy, which reaches the recipient's stream once."""
    async with _two(tmp_path, url) as (a, b):
        await _register(a, "bob")
        await _register(b, "alice")
        await _until(lambda: b.registry.known("bob") is not None, "B knows bob")
        bob = _read(a, "bob")
        await _until(lambda: a.router.streaming("bob"), "bob's stream")
        sent = [await _send((a, b)[n % 2], "alice", "bob", {"n": n}) for n in range(10)]
        await _until(lambda: len(bob.messages) == 10, "bob receives them")
        for n, message_id in enumerate(sent):  # failed through either replica
            await _ack((a, b)[n % 2], "bob", message_id, AckStage.FAILED)
        for replica in (a, b):
            entries = await replica.router.dead_letters.list(None, 0, 100)
            assert sorted(e.message_id for e in entries) == sorted(sent)
            assert (await replica.router.dead_letters.get(entries[0].entry_id)) == entries[0]
            page = await replica.router.dead_letters.export(None, False)
            exported = json.loads(page.bundle)["entries"]
            assert sorted(e["message_id"] for e in exported) == sorted(sent)

        async def requeue(replica: Coordinator, entry_id: int) -> str:
            async def send(
                env: Envelope, recipient: str, signature: bytes, origin: bytes, entry: int
            ) -> str:
                item = Outbound(env, recipient, requeue=True, signature=signature,
                                origin=origin, dead_letter=entry)  # fmt: skip
                outcome = await replica.router.send(item)
                if outcome.error is not None:
                    raise outcome.error
                return outcome.message_id

            return await replica.router.dead_letters.requeue(entry_id, _Ids(), send)

        copies: list[str] = []
        for entry in await a.router.dead_letters.list(None, 0, 100):
            results = await asyncio.gather(
                requeue(a, entry.entry_id), requeue(b, entry.entry_id), return_exceptions=True
            )
            admitted = [r for r in results if isinstance(r, str)]
            assert len(admitted) == 1, results
            (refused,) = [r for r in results if not isinstance(r, str)]
            assert isinstance(refused, ApiaryError) and refused.code == "ALREADY_COMPLETED"
            assert (await b.router.dead_letters.get(entry.entry_id)).requeued_as == admitted[0]
            copies.append(admitted[0])
        await _until(lambda: len(bob.messages) == 20, "bob receives the copies")
        assert sorted(env.message_id for env in bob.messages[10:]) == sorted(copies)
        stored = await a.store.messages.inbox("bob", limit=100)
        assert len([m for m in stored if m.producer_id == "alice"]) == 20  # each copy once
        for message_id in copies:
            await _ack(a, "bob", message_id, AckStage.FULFILLED)
        await _stop(bob)


class _Ids:
    def new_id(self) -> str:
        return str(uuid.uuid4())


async def test_a_message_whose_note_is_lost_goes_live_at_the_next_poll(
    tmp_path: Path, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LISTEN/NOTIFY is the hint, polling the guarantee: with A not listening (every note B
    sends it is lost), what B admits for bob, streaming on A, is made live by A's first full
    poll that begins after the admission, and reaches bob's stream."""
    async with _two(tmp_path, url) as (a, b):
        assert a.cluster is not None
        (listening,) = [t for t in a.cluster.tasks if t.get_name().endswith("-listen")]
        listening.cancel()
        await _register(a, "bob")
        await _register(b, "alice")
        bob = _read(a, "bob")
        await _until(lambda: a.router.streaming("bob"), "bob's stream")
        follower, sweep = a.cluster.follower, a.cluster.follower.sweep
        admitted: list[str] = []
        polls: list[bool] = []
        """Per full poll of A begun after the admission: whether it left the message live."""

        async def poll(*, full: bool = True) -> None:
            before = list(admitted)
            await sweep(full=full)
            if full and before:
                polls.append(all(m in a.router.live.copies for m in before))

        monkeypatch.setattr(follower, "sweep", poll)
        for n in range(3):
            admitted.append(await _send(b, "alice", "bob", {"n": n}))
            await _until(
                lambda: len(bob.messages) == len(admitted) and bool(polls),
                "bob receives it, and a poll of A begins after its admission",
            )
            assert polls[0], "the first poll after the admission missed the message"
            polls.clear()
        assert [env.message_id for env in bob.messages] == admitted
        await _stop(bob)


async def test_a_stopped_replicas_partitions_are_taken_over_and_its_work_goes_on(
    tmp_path: Path, url: str
) -> None:
    async with _two(tmp_path, url) as (a, b):
        assert a.cluster is not None and b.cluster is not None
        bob = _owned_by(a, "bob")  # A owns bob's partition: A runs his deadlines, until...
        await _register(a, bob)
        await _register(a, "carol")
        await _register(b, "alice")
        await _until(lambda: b.registry.known(bob) is not None, "B knows bob")
        bob_on_a, alice = _read(a, bob), _read(b, "alice")
        await _until(lambda: a.router.streaming(bob) and b.router.streaming("alice"), "streams")
        held = await _send(b, "alice", bob, {"n": 1})
        await _until(lambda: len(bob_on_a.messages) == 1, "bob holds it, unacknowledged")
        for_carol = await _send(a, "alice", "carol", {"n": 2})  # carol has no stream

        for _ in range(int(WAIT_S / 0.02)):  # A stores the deadline of bob's hand-out
            stored = await b.store.messages.get(held)
            if stored is not None and stored.ack_deadline > 0:
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError("the ACK deadline of bob's hand-out was never stored")
        a.cluster.halt()  # ...A stops as a killed process: nothing released, nothing written
        await _stop(bob_on_a)
        await _until(lambda: len(_keeper(b).owned()) == PARTITIONS, "B takes over")
        assert b.cluster.keeper.takeovers == PARTITIONS // 2
        later = await _send(b, "alice", bob, {"n": 3})

        # The ACK deadline of what bob held when A stopped fires once, on B, its new owner.
        await _until(lambda: any(x.ack_for_message_id == held for x in alice.acks), "the NACK")
        (nack,) = [x for x in alice.acks if x.ack_for_message_id == held]
        assert nack.ack_stage is AckStage.TIMED_OUT
        stored = await b.store.messages.get(held)
        assert stored is not None and stored.state is MessageState.TIMED_OUT

        # Bob and carol connect to B: what waited for them, admitted by A or by B.
        bob_on_b, carol = _read(b, bob), _read(b, "carol")
        await _until(lambda: len(bob_on_b.messages) == len(carol.messages) == 1, "delivered")
        assert bob_on_b.messages[0].message_id == later
        assert carol.messages[0].message_id == for_carol
        await _ack(b, bob, later, AckStage.FULFILLED)
        await _ack(b, "carol", for_carol, AckStage.FULFILLED)
        await _until(lambda: len(alice.acks) == 3, "both ACKs reach alice")
        assert [x.ack_for_message_id for x in alice.acks].count(held) == 1
        # B's /metrics say so: every partition held, half of them taken over, the deadline.
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://{b.http_address}/metrics") as response,
        ):
            figures = _figures(await response.text())
        assert figures["apiary_cluster_partitions_owned"] == PARTITIONS
        assert figures["apiary_cluster_partitions"] == PARTITIONS
        assert figures["apiary_cluster_takeovers_total"] == PARTITIONS // 2
        assert figures["apiary_cluster_deadlines_fired_total"] >= 1
        assert figures["apiary_cluster_lease_ticks_total"] >= 1
        timed_out = [
            e for e in await b.events.read(limit=10_000)
            if e.event_type == "message.state" and e.details.get("message_id") == held
            and e.details.get("to") == "TIMED_OUT"
        ]  # fmt: skip
        assert len(timed_out) == 1
        for reader in (bob_on_b, carol, alice):
            await _stop(reader)


def _figures(text: str) -> dict[str, float]:
    """The unlabelled samples of a /metrics page, by name."""
    return {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line.startswith("apiary_cluster_") and "{" not in line
    }


async def _ack_until_taken(agent: Connection, envelope: Envelope) -> None:
    """FULFILLED, sent again while the channel finds no replica (one that went away with
    the call in flight, the channel not yet moved on), as the SDK's task runner does."""
    for _ in range(50):
        try:
            await agent.ack(envelope, AckStage.FULFILLED)
            return
        except CoordinatorUnreachableError:
            await asyncio.sleep(0.1)
    await agent.ack(envelope, AckStage.FULFILLED)


async def test_an_agent_given_both_replicas_moves_to_the_other_when_its_replica_stops(
    tmp_path: Path, url: str
) -> None:
    """The SDK takes several replicas (`host:port,host:port`): its channel connects to the
    first it can reach; when that replica stops, the agent's stream reconnects to the other,
    registers there, and what is sent to it meanwhile reaches it."""
    async with AsyncExitStack() as stack:
        a_stack = await stack.enter_async_context(AsyncExitStack())
        a = await a_stack.enter_async_context(_replica(tmp_path, url, "a"))
        b = await stack.enter_async_context(_replica(tmp_path, url, "b"))
        both = f"{a.grpc_address},{b.grpc_address}"
        got: list[Envelope] = []
        bob = await stack.enter_async_context(Connection("bob", coordinator=both))

        async def read() -> None:
            async for delivery in bob.deliveries(reconnect=True):
                if delivery.envelope.message_type is MessageType.DATA:
                    got.append(delivery.envelope)
                    await _ack_until_taken(bob, delivery.envelope)

        reader = asyncio.create_task(read())
        try:
            await _until(lambda: a.router.streaming("bob"), "bob streams from A, the first")
            await _register(b, "alice")
            first = await _send(b, "alice", "bob", {"n": 1})
            await _until(lambda: [e.message_id for e in got] == [first], "bob gets it on A")
            await a_stack.aclose()  # A stops: bob's stream ends, the channel moves to B
            await _until(lambda: b.router.streaming("bob"), "bob streams from B")
            second = await _send(b, "alice", "bob", {"n": 2})
            await _until(lambda: [e.message_id for e in got] == [first, second], "on B")
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
