"""Message signing over real gRPC (RFC 6.2, 14, 23; DESIGN.md section 9): with
`signing_required`, agents register an Ed25519 public key, every envelope they send carries
its signature (unary metadata or the stream item's field), keys rotate only with the current
key's signature, and deregistration (revocation) needs the agent's key or an operator."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from apiary.core.envelope import AckStage
from apiary.core.signatures import SIGNATURE_KEY, encode_signature, public_bytes
from apiary.engine.assembly import Runtime
from apiary.engine.hitl import HitlSettings
from apiary.engine.operators import OperatorEntry, token_digest
from apiary.engine.registry import RETIRED_KEY_GRACE_S
from apiary.engine.settings import RouterSettings
from apiary.sdk.connection import Connection, Delivery
from apiary.server.inprocess import open_test_coordinator
from apiary.testing.clock import FakeClock
from apiary.wire import pb
from tests.server.wire_client import Running, descriptor, envelope, error_detail, open_running

registry_pb2 = pb.registry_pb2
apiary_pb2 = pb.apiary_pb2


@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[Running]:
    async with open_running(tmp_path, RouterSettings(signing_required=True)) as r:
        yield r


def _signed(key: Ed25519PrivateKey, message: object) -> tuple[tuple[str, str], ...]:
    data = message.SerializeToString(deterministic=True)  # type: ignore[attr-defined]
    return ((SIGNATURE_KEY, encode_signature(key.sign(data))),)


async def _register(
    running: Running, agent_id: str, key: Ed25519PrivateKey | None, *, proof_by: object = None
) -> registry_pb2.RegisterAgentResponse:
    agent = descriptor(agent_id)
    if key is not None:
        agent.public_key = public_bytes(key)
    request = registry_pb2.RegisterAgentRequest(agent=agent)
    signer = proof_by if proof_by is not None else key
    metadata = _signed(signer, request) if isinstance(signer, Ed25519PrivateKey) else ()
    stub = pb.registry_pb2_grpc.RegistryServiceStub(running.channel)
    reply: registry_pb2.RegisterAgentResponse = await stub.RegisterAgent(request, metadata=metadata)
    return reply


async def _send(
    running: Running, msg: pb.common_pb2.Envelope, signer: Ed25519PrivateKey | None
) -> pb.router_pb2.SendMessageResponse:
    metadata = (("sw4rm-recipient", "bob"),)
    if signer is not None:
        metadata += _signed(signer, msg)
    stub = pb.router_pb2_grpc.RouterServiceStub(running.channel)
    reply: pb.router_pb2.SendMessageResponse = await stub.SendMessage(
        pb.router_pb2.SendMessageRequest(msg=msg), metadata=metadata
    )
    return reply


async def _refused(call: object) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call  # type: ignore[misc]
    detail = error_detail(caught.value)
    return caught.value.code(), detail.details.get("field", "")


async def _refused_by(running: Running, message_id: str) -> str:
    """The error code the message ended REJECTED with ('' while it has not)."""
    for _ in range(1000):  # up to 10 s on a loaded machine
        found = await running.coordinator.store.messages.get(message_id)
        if found is not None and found.state.value == "REJECTED":
            return found.error_code
        await asyncio.sleep(0.01)
    return ""


@pytest.mark.conformance("registry.register.public-key-when-signing")
async def test_registering_without_a_public_key_is_refused(running: Running) -> None:
    reply = await _register(running, "alice", None)
    assert not reply.accepted
    assert "public_key" in reply.reason and "signing" in reply.reason
    short = descriptor("alice")
    short.public_key = b"k" * 31
    stub = pb.registry_pb2_grpc.RegistryServiceStub(running.channel)
    reply = await stub.RegisterAgent(registry_pb2.RegisterAgentRequest(agent=short))
    assert not reply.accepted and "32-byte Ed25519" in reply.reason


async def test_signed_envelopes_are_admitted_and_others_refused(running: Running) -> None:
    alice, mallory = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    assert (await _register(running, "alice", alice)).accepted
    assert (await _register(running, "bob", Ed25519PrivateKey.generate())).accepted
    good = envelope("alice", {"n": 1})
    assert (await _send(running, good, alice)).accepted
    unsigned = envelope("alice", {"n": 2})
    assert await _refused(_send(running, unsigned, None)) == (
        grpc.StatusCode.PERMISSION_DENIED, "signature",
    )  # fmt: skip
    forged = envelope("alice", {"n": 3})  # someone else claims to be alice
    assert await _refused(_send(running, forged, mallory)) == (
        grpc.StatusCode.PERMISSION_DENIED, "signature",
    )  # fmt: skip
    # A signature covers the bytes: a changed payload no longer verifies.
    tampered = envelope("alice", {"n": 4})
    proof = _signed(alice, tampered)
    tampered.payload = b'{"n": 5}'
    stub = pb.router_pb2_grpc.RouterServiceStub(running.channel)
    call = stub.SendMessage(
        pb.router_pb2.SendMessageRequest(msg=tampered),
        metadata=(("sw4rm-recipient", "bob"), *proof),
    )
    assert (await _refused(call))[0] == grpc.StatusCode.PERMISSION_DENIED
    # Refusals are not silent: each is answered, logged with its reason and counted; none
    # was admitted, so none is a dead letter.
    coordinator = running.coordinator
    logged = [e for e in await coordinator.events.read(limit=1000)
              if e.event_type == "message.rejected"]  # fmt: skip
    assert {e.details["message_id"] for e in logged} == {
        unsigned.message_id, forged.message_id, tampered.message_id,
    }  # fmt: skip
    assert {e.details["error_code"] for e in logged} == {"permission_denied"}
    assert coordinator.router.stats.admission_refused == {"permission_denied": 3}
    assert await coordinator.store.dlq.list() == []


async def test_each_streamed_envelope_carries_its_own_signature(running: Running) -> None:
    alice = Ed25519PrivateKey.generate()
    assert (await _register(running, "alice", alice)).accepted
    assert (await _register(running, "bob", Ed25519PrivateKey.generate())).accepted
    frame = apiary_pb2.SendFrame()
    for n, sign in enumerate((True, False, True)):
        item = frame.items.add(msg=envelope("alice", {"n": n}), recipient="bob")
        if sign:
            item.signature = alice.sign(item.msg.SerializeToString(deterministic=True))
    stub = pb.apiary_pb2_grpc.RouterStreamServiceStub(running.channel)
    call = stub.SendStream()
    await call.write(frame)
    reply = await call.read()
    await call.done_writing()
    assert [(r.accepted, r.error_code) for r in reply.results] == [
        (True, ""), (False, "permission_denied"), (True, ""),
    ]  # fmt: skip


@pytest.mark.conformance("security.keys.rotation-revocation")
async def test_a_key_rotates_only_with_the_current_key_and_is_revoked_by_deregistration(
    running: Running,
) -> None:
    old, new, thief = (Ed25519PrivateKey.generate() for _ in range(3))
    assert (await _register(running, "alice", old)).accepted
    assert (await _register(running, "bob", Ed25519PrivateKey.generate())).accepted
    # Someone with another key cannot take alice's name...
    assert await _refused(_register(running, "alice", thief)) == (
        grpc.StatusCode.PERMISSION_DENIED, "agent.public_key",
    )  # fmt: skip
    # ...but alice can rotate, proving the change with the key she holds now.
    assert (await _register(running, "alice", new, proof_by=old)).accepted
    assert await _refused(_send(running, envelope("alice"), old)) == (
        grpc.StatusCode.PERMISSION_DENIED, "signature",
    )  # fmt: skip
    assert (await _send(running, envelope("alice"), new)).accepted
    rotated = [
        e for e in await running.coordinator.events.read() if e.event_type == "agent.key_rotated"
    ]
    assert [e.agent_id for e in rotated] == ["alice"]
    # Revocation: deregistering needs alice's key (or an operator); then any key registers.
    stub = pb.registry_pb2_grpc.RegistryServiceStub(running.channel)
    request = registry_pb2.DeregisterAgentRequest(agent_id="alice", reason="key lost")
    assert await _refused(stub.DeregisterAgent(request, metadata=_signed(thief, request))) == (
        grpc.StatusCode.PERMISSION_DENIED, SIGNATURE_KEY,
    )  # fmt: skip
    assert (await stub.DeregisterAgent(request, metadata=_signed(new, request))).ok
    assert (await _register(running, "alice", thief)).accepted  # a fresh registration


async def test_an_sdk_connection_with_a_key_signs_what_it_sends(running: Running) -> None:
    address = str(running.coordinator.grpc_address)
    async with (
        Connection(
            "alice",
            coordinator=address,
            clock=running.clock,
            signing_key=Ed25519PrivateKey.generate(),
        ) as a,
        Connection(
            "bob",
            coordinator=address,
            clock=running.clock,
            signing_key=Ed25519PrivateKey.generate(),
        ),
    ):
        sent = await a.send("bob", {"hello": True})
        (result,) = await a.send_many([(a.envelope({"n": 2}), "bob")])
        assert result.accepted, result.reason
        stored = await running.coordinator.store.messages.get(sent.message_id)
        assert stored is not None and stored.recipient == "bob"
    # Both deregistered on exit, which with signing on needs their signatures.
    assert await running.coordinator.store.agents.list() == []


async def test_an_operator_revokes_an_agent_whose_key_is_lost(tmp_path: Path) -> None:
    clock = FakeClock()
    hitl = HitlSettings(operators=(OperatorEntry("olivia", token_digest("tok"), ("admin",)),))
    runtime = Runtime(clock=clock, sleep=clock.sleep, hitl=hitl)
    settings = RouterSettings(signing_required=True)
    async with (
        open_test_coordinator(tmp_path, runtime=runtime, router_settings=settings) as c,
        grpc.aio.insecure_channel(str(c.grpc_address)) as channel,
    ):
        running = Running(c, clock, channel)
        assert (await _register(running, "alice", Ed25519PrivateKey.generate())).accepted
        stub = pb.registry_pb2_grpc.RegistryServiceStub(channel)
        request = registry_pb2.DeregisterAgentRequest(agent_id="alice", reason="key leaked")
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.DeregisterAgent(request, metadata=(("authorization", "Bearer nope"),))
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert await c.store.agents.get("alice") is not None
        reply = await stub.DeregisterAgent(request, metadata=(("authorization", "Bearer tok"),))
        assert reply.ok and await c.store.agents.get("alice") is None


@pytest.mark.conformance("security.idempotency.authenticated-derivation")
async def test_idempotency_tokens_are_scoped_by_the_authenticated_producer(
    running: Running,
) -> None:
    alice, mallory = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    for agent, key in (("alice", alice), ("mallory", mallory), ("bob", None)):
        assert (await _register(running, agent, key or Ed25519PrivateKey.generate())).accepted
    token = "alice:deploy:1"
    assert (await _send(running, envelope("alice", idempotency_token=token), alice)).accepted
    # Mallory cannot poison alice's entry: as alice her envelope does not verify...
    assert await _refused(
        _send(running, envelope("alice", idempotency_token=token), mallory)
    ) == (grpc.StatusCode.PERMISSION_DENIED, "signature")  # fmt: skip
    # ...and under her own name the same token is her own operation, not alice's.
    mine = await _send(running, envelope("mallory", idempotency_token=token), mallory)
    assert mine.accepted, mine.reason
    # Alice's own retry meets her own operation, still in progress.
    again = await _send(running, envelope("alice", idempotency_token=token), alice)
    assert not again.accepted and again.reason.startswith("already_in_progress")


async def _next(deliveries: AsyncIterator[Delivery]) -> Delivery:
    return await asyncio.wait_for(deliveries.__anext__(), 10)


async def _data(deliveries: AsyncIterator[Delivery]) -> Delivery:
    """The next delivery that is not a coordinator notice."""
    while (found := await _next(deliveries)).notice:
        pass
    return found


async def test_a_recipient_verifies_the_producers_signature_end_to_end(tmp_path: Path) -> None:
    # The signature admission verified is delivered with the message, so the recipient
    # checks it too: here against a message changed at rest in the SQLite file.
    store = f"sqlite:///{tmp_path / 'apiary.db'}"
    keys = {"alice": Ed25519PrivateKey.generate(), "bob": Ed25519PrivateKey.generate()}
    signing = RouterSettings(signing_required=True)

    def connect(running: Running, agent: str) -> Connection:
        return Connection(
            agent,
            coordinator=running.grpc,
            clock=running.clock,
            signing_key=keys[agent],
            verify_signatures=True,
        )

    async with open_running(tmp_path / "first", signing, store) as running:
        alice, bob = connect(running, "alice"), connect(running, "bob")
        await alice.start()
        await bob.start()
        kept = await alice.send("bob", {"n": 1})
        changed = await alice.send("bob", {"n": 2})
        stored = await running.coordinator.store.messages.get(kept.message_id)
        assert stored is not None and len(stored.signature) == 64
        await alice.stop(deregister=False)
        await bob.stop(deregister=False)
    with sqlite3.connect(tmp_path / "apiary.db") as raw:
        (blob,) = raw.execute(
            "SELECT envelope FROM messages WHERE message_id = ?", (changed.message_id,)
        ).fetchone()
        assert b'{"n": 2}' in blob
        raw.execute(
            "UPDATE messages SET envelope = ? WHERE message_id = ?",
            (blob.replace(b'{"n": 2}', b'{"n": 3}'), changed.message_id),
        )
    async with open_running(tmp_path / "second", signing, store) as running:
        alice, bob = connect(running, "alice"), connect(running, "bob")
        await alice.start()
        await bob.start()
        handed_on: asyncio.Queue[Delivery] = asyncio.Queue()

        async def receive() -> None:
            async for delivery in bob.deliveries():
                if not delivery.notice:
                    await handed_on.put(delivery)

        receiving = asyncio.create_task(receive())
        try:
            first = await asyncio.wait_for(handed_on.get(), 10)
            assert (first.envelope.message_id, first.envelope.payload) == (
                kept.message_id, b'{"n": 1}',
            )  # fmt: skip
            await bob.ack(first.envelope, AckStage.FULFILLED)
            # The changed one is refused, not handed on: REJECTED with PERMISSION_DENIED.
            answers = alice.deliveries()
            acks = [json.loads((await _data(answers)).envelope.payload) for _ in range(2)]
            outcomes = {
                (a["ack_for_message_id"], a["ack_stage"], a.get("error_code", "")) for a in acks
            }
            assert outcomes == {
                (kept.message_id, "FULFILLED", ""),
                (changed.message_id, "REJECTED", "PERMISSION_DENIED"),
            }  # fmt: skip
            refused = await running.coordinator.store.messages.get(changed.message_id)
            assert refused is not None and refused.state.value == "REJECTED"
            assert handed_on.empty()
        finally:
            receiving.cancel()
            await alice.stop()
            await bob.stop()


async def test_a_verifying_recipient_refuses_what_no_signature_vouches_for(
    tmp_path: Path,
) -> None:
    # Without signing at the coordinator nothing is verified at admission and no signature
    # is delivered: an agent that registered a key and verifies refuses its peers' messages,
    # while the coordinator's own (the directory, heartbeats) come through.
    async with (
        open_running(tmp_path) as running,
        Connection("alice", coordinator=running.grpc,
                   clock=running.clock, signing_key=Ed25519PrivateKey.generate()) as alice,
        Connection("bob", coordinator=running.grpc, verify_signatures=True) as bob,
    ):  # fmt: skip
        sent = await alice.send("bob", {"n": 1})
        await running.coordinator.presence.tick()
        handed_on: list[Delivery] = []

        async def receive() -> None:
            async for delivery in bob.deliveries():
                handed_on.append(delivery)

        receiving = asyncio.create_task(receive())
        try:
            # bob's REJECTED ACK travels back through the router
            assert await _refused_by(running, sent.message_id) == "permission_denied"
            # The coordinator's notices come through: the directory bob's stream opened with.
            for _ in range(500):
                if "alice" in bob.directory:
                    break
                await asyncio.sleep(0.01)
        finally:
            receiving.cancel()
        assert [d for d in handed_on if d.envelope.producer_id == "alice"] == []
        assert "alice" in bob.directory


@pytest.mark.conformance("security.keys.rotation-revocation")
async def test_a_message_signed_before_its_producer_rotated_still_verifies(
    tmp_path: Path,
) -> None:
    # alice signs two messages with her old key, then rotates. Admission now takes only the
    # new key, but what she signed before still verifies for a recipient within the grace
    # period (the registry keeps the keys rotated away, apiary.v1 AgentInfo.retired_keys),
    # and no longer after it.
    old, new = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    async with (
        # (No ack timeout within the day the clock jumps.)
        open_running(tmp_path, RouterSettings(signing_required=True, ack_timeout_s=1e6)) as running,
        Connection(
            "bob",
            coordinator=running.grpc,
            clock=running.clock,
            signing_key=Ed25519PrivateKey.generate(),
            verify_signatures=True,
        ) as bob,
    ):
        alice = Connection("alice", coordinator=running.grpc, clock=running.clock, signing_key=old)
        await alice.start()
        within = await alice.send("bob", {"n": 1})
        after = await alice.send("bob", {"n": 2})
        await alice.stop(deregister=False)  # (its connection holds the old key)
        assert (await _register(running, "alice", new, proof_by=old)).accepted
        assert await _refused(_send(running, envelope("alice"), old)) == (
            grpc.StatusCode.PERMISSION_DENIED, "signature",
        )  # fmt: skip
        stub = pb.apiary_pb2_grpc.DiscoveryServiceStub(running.channel)
        info = await stub.GetAgent(apiary_pb2.GetAgentRequest(agent_id="alice"))
        assert bytes(info.descriptor.public_key) == public_bytes(new)
        assert [bytes(k.public_key) for k in info.retired_keys] == [public_bytes(old)]
        deliveries = bob.deliveries()
        first = await _data(deliveries)
        assert first.envelope.message_id == within.message_id  # verified: handed on
        await bob.ack(first.envelope, AckStage.FULFILLED)
        # A day later the old key vouches for nothing any more: the second is refused.
        running.clock.advance(RETIRED_KEY_GRACE_S + 1)
        info = await stub.GetAgent(apiary_pb2.GetAgentRequest(agent_id="alice"))
        assert list(info.retired_keys) == []
        bob._keys.clear()  # as a recipient that never looked alice's keys up before
        refused = asyncio.create_task(_data(deliveries))
        try:
            assert await _refused_by(running, after.message_id) == "permission_denied"
        finally:
            refused.cancel()


async def _dead_letter(
    alice: Connection, carol: Connection, deliveries: AsyncIterator[Delivery]
) -> None:
    """alice sends carol a signed message, which carol fails: an admitted message that failed,
    a dead letter."""
    (sent,) = await alice.send_many([(alice.envelope({"n": 1}), "carol")])
    assert sent.accepted, sent.reason
    got = await _data(deliveries)
    assert got.envelope.message_id == sent.message_id
    await carol.ack(got.envelope, AckStage.FAILED, error_code="internal_error", note="later")


async def test_what_the_coordinator_derives_from_a_signed_message_still_verifies(
    tmp_path: Path,
) -> None:
    # A requeued dead letter gets a new message_id, retry_count and timestamp, and a message
    # assembled from chunks was signed chunk by chunk: both come to the recipient with the
    # signed envelope they follow from (Delivery.origin), and verify.
    keys = {agent: Ed25519PrivateKey.generate() for agent in ("alice", "bob", "carol")}
    async with (
        open_running(tmp_path, RouterSettings(signing_required=True)) as running,
        Connection(
            "alice", coordinator=running.grpc, clock=running.clock, signing_key=keys["alice"]
        ) as alice,
        Connection(
            "bob",
            coordinator=running.grpc,
            clock=running.clock,
            signing_key=keys["bob"],
            capabilities=["chunking"],
            verify_signatures=True,
        ) as bob,
    ):
        carol = Connection(
            "carol",
            coordinator=running.grpc,
            clock=running.clock,
            signing_key=keys["carol"],
            verify_signatures=True,
        )
        await carol.start()
        try:
            # A message carol fails: a dead letter kept with alice's signature.
            deliveries = carol.deliveries()
            await _dead_letter(alice, carol, deliveries)
            (entry,) = await running.coordinator.store.dlq.list()
            assert len(entry.signature) == 64
            stub = pb.apiary_pb2_grpc.DlqServiceStub(running.channel)
            reply = await stub.Requeue(apiary_pb2.RequeueDlqRequest(entry_ids=[entry.entry_id]))
            (result,) = reply.results
            assert result.ok, result.error
            got = await _data(deliveries)
            assert (got.envelope.message_id, got.envelope.retry_count) == (
                result.new_message_id, 1,
            )  # fmt: skip
            assert json.loads(got.envelope.payload) == {"n": 1}
            await carol.ack(got.envelope, AckStage.FULFILLED)
        finally:
            await carol.stop()
        # A chunked transfer to bob, assembled by the coordinator.
        payload = json.dumps({"text": "several chunks " * 1000}).encode()
        transfer = await alice.send_chunked("bob", payload, "application/json", chunk_bytes=4096)
        got = await _data(bob.deliveries())
        assert (got.envelope.message_id, got.envelope.payload) == (transfer, payload)
        stored = await running.coordinator.store.messages.get(transfer)
        assert stored is not None and len(stored.signature) > 64  # with the final chunk


async def test_a_derived_message_changed_at_rest_is_refused(tmp_path: Path) -> None:
    # The origin vouches only for what follows from it: a requeued copy whose payload was
    # changed in the database is refused by its verifying recipient.
    store = f"sqlite:///{tmp_path / 'apiary.db'}"
    keys = {agent: Ed25519PrivateKey.generate() for agent in ("alice", "carol")}
    signing = RouterSettings(signing_required=True)
    async with (
        open_running(tmp_path / "first", signing, store) as running,
        Connection(
            "alice", coordinator=running.grpc, clock=running.clock, signing_key=keys["alice"]
        ) as alice,
    ):
        carol = Connection(
            "carol", coordinator=running.grpc, clock=running.clock, signing_key=keys["carol"]
        )
        await carol.start()
        await _dead_letter(alice, carol, carol.deliveries())
        stub = pb.apiary_pb2_grpc.DlqServiceStub(running.channel)
        (entry,) = await running.coordinator.store.dlq.list()
        (result,) = (await stub.Requeue(apiary_pb2.RequeueDlqRequest(
            entry_ids=[entry.entry_id]))).results  # fmt: skip
        copy_id = result.new_message_id
        await carol.stop(deregister=False)
        await alice.stop(deregister=False)
    with sqlite3.connect(tmp_path / "apiary.db") as raw:
        (blob,) = raw.execute(
            "SELECT envelope FROM messages WHERE message_id = ?", (copy_id,)
        ).fetchone()
        raw.execute(
            "UPDATE messages SET envelope = ? WHERE message_id = ?",
            (blob.replace(b'{"n": 1}', b'{"n": 9}'), copy_id),
        )
    async with open_running(tmp_path / "second", signing, store) as running:
        carol = Connection(
            "carol",
            coordinator=running.grpc,
            clock=running.clock,
            signing_key=keys["carol"],
            verify_signatures=True,
        )
        await carol.start()
        receiving = asyncio.create_task(_data(carol.deliveries()))
        try:
            assert await _refused_by(running, copy_id) == "permission_denied"
        finally:
            receiving.cancel()
            await carol.stop(deregister=False)
