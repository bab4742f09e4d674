"""An agent's connection to a coordinator: register, send, receive, acknowledge, deregister.

The low level under `apiary.Agent` (sdk/agent.py), usable on its own:

    async with Connection("bob", coordinator="127.0.0.1:50051") as bob:
        async for env in bob.messages():
            ...
            await bob.ack(env, AckStage.FULFILLED)

Inbound delivery uses the apiary.v1 Inbound stream: batched, with offsets, so a reconnect
resumes where the agent left off (RFC 5.5). Heartbeats from the coordinator are answered
automatically, and join/leave notices keep `directory` up to date (RFC 14).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Any

import grpc
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from apiary.core.access.proof import PROOF_KEY
from apiary.core.clock import Clock
from apiary.core.envelope import Ack, AckStage, Envelope, MessageType
from apiary.core.ids import IdGenerator
from apiary.core.signatures import SIGNATURE_KEY, encode_signature, public_bytes, verifies
from apiary.core.tasks.capacity import TASK_CONCURRENCY_METADATA, check_task_concurrency
from apiary.core.trace_context import TraceContext
from apiary.errors import (
    ApiaryError,
    NotFoundError,
    UnauthenticatedError,
    ValidationError,
    error_for_code,
)
from apiary.sdk import errors
from apiary.sdk.channel import ClientTls, open_channel
from apiary.sdk.chunking import CHUNK_CONTENT_TYPE, chunk_payloads
from apiary.sdk.credentials import REGISTER_METHOD, CallProver, ClientCredentials
from apiary.sdk.provenance import derived_from
from apiary.sdk.sender import BatchSender, SendResult
from apiary.sdk.task_acks import AckFrames
from apiary.system import SystemClock, UuidIds
from apiary.wire import pb
from apiary.wire.convert import ack_to_json, envelope_from_proto, envelope_to_proto

log = logging.getLogger("apiary.sdk")

RECIPIENT_KEY = "sw4rm-recipient"
JSON = "application/json"
RECONNECT_DELAYS_S = (0.1, 0.2, 0.5, 1.0, 2.0)
RECONNECT_CODES = frozenset({"agent_unavailable", "internal_error", "unavailable"})
"""The stream's errors that `deliveries(reconnect=True)` reconnects after: the coordinator
lost, failing, or unable to serve the stream for now (`unavailable`: its store, say)."""


@dataclass(frozen=True, slots=True)
class Delivery:
    """One inbound envelope with its inbox offset and delivery attempt."""

    envelope: Envelope
    offset: int
    attempt: int
    urgent: bool
    notice: bool = False
    """A coordinator notice (NOTIFICATION from `coordinator`): informational, already
    settled on hand-out, so it is not acknowledged."""
    batch_end: bool = True
    """The last delivery of the batch it came in: nothing else had arrived behind it. A
    reader that stops at some delivery reads to the end of its batch first: the coordinator
    hands forwarded ACKs out ahead of stored messages in a batch, so a reply sent before the
    ACK that ends a request may follow that ACK within its batch (sdk/outcome.py)."""
    trace: TraceContext | None = None
    """The W3C trace context the message continues, when the coordinator traces
    (docs/tracing.md): its handling is a span of that trace (sdk/tracing.py)."""


class Connection:
    """One agent's connection to a coordinator."""

    def __init__(
        self,
        agent_id: str,
        *,
        coordinator: str,
        name: str = "",
        description: str = "",
        capabilities: Sequence[str] = (),
        modalities: Sequence[str] = (JSON, "text/plain"),
        reasoning_connectors: Sequence[str] = ("builtin://rules",),
        communication_class: str = "STANDARD",
        clock: Clock | None = None,
        ids: IdGenerator | None = None,
        signing_key: Ed25519PrivateKey | None = None,
        tls: ClientTls | None = None,
        verify_signatures: bool = False,
        credentials: ClientCredentials | None = None,
        prove_calls: bool | None = None,
        task_concurrency: int | None = None,
    ) -> None:
        """`task_concurrency`: how many Scheduler tasks this agent runs at once, declared at
        registration (`apiary-task-concurrency` metadata; None declares nothing: one at a
        time, and no prefetched task). `TaskRunner` runs that many handlers at once.

        `signing_key`: the agent's Ed25519 key when the coordinator has message signing on
        (RFC 6.2): its public half is registered, and every envelope, registration and
        deregistration this connection sends is signed with it.

        `verify_signatures`: check, on arrival, that every message another agent produced
        carries that agent's signature under the key it registered (fetched from the
        coordinator's discovery service, again once when a signature fails, in case the key
        was rotated). A message that fails is not handed on: it is acknowledged REJECTED with
        PERMISSION_DENIED (an ACK is dropped) and logged. Messages whose producer is no
        registered agent (the coordinator's own notices and task dispatches, or an agent
        deregistered since) carry no signature to check and are taken as they come over the
        (TLS) channel.

        `credentials`: what the calls present (default: `ClientCredentials.load()`, see
        sdk/credentials.py); `tls` overrides their TLS settings.

        `prove_calls`: every call but RegisterAgent carries a per-call proof by
        `signing_key` (`apiary-agent-proof`), which authenticates it as this agent (DESIGN.md
        section 9); the coordinator checks it against the key the agent registered, so the
        agent is registered first (by `start()`, or elsewhere before `connect()`). A call that
        carries a proof does not carry the API key too: an API key then only registers the
        agent. Default: on when there is a signing key and the credentials have neither an
        API key nor a client certificate."""
        if prove_calls and signing_key is None:
            raise ValidationError.for_field(
                "prove_calls", "per-call proofs are signed by the agent's key: give signing_key"
            )
        self.agent_id = agent_id
        self.task_concurrency = (
            None if task_concurrency is None
            else check_task_concurrency(task_concurrency, "task_concurrency")
        )  # fmt: skip
        self._coordinator = coordinator
        self._signing_key = signing_key
        self._verify = verify_signatures
        self._keys: dict[str, tuple[bytes, ...] | None] = {}
        """Producers' public keys: the registered one first (b'' without one), then those
        rotated away within their grace; None for a non-agent."""
        self._tls = tls
        """TLS towards the coordinator (None: from the credentials, else plain)."""
        self._credentials = credentials
        self._prove_calls = prove_calls
        self._prover: CallProver | None = None
        self._registered = False
        self._descriptor = pb.registry_pb2.AgentDescriptor(
            agent_id=agent_id,
            name=name or agent_id,
            description=description,
            capabilities=list(capabilities),
            modalities_supported=list(modalities),
            reasoning_connectors=list(reasoning_connectors),
            communication_class=pb.common_pb2.CommunicationClass.Value(communication_class),
            public_key=public_bytes(signing_key) if signing_key is not None else b"",
        )
        self._clock = clock or SystemClock()
        self._ids = ids or UuidIds()
        # Sequence numbers must stay monotonic across restarts of the agent (the router
        # deduplicates by (producer_id, sequence_number)), so they start from the clock.
        self._sequence = int(self._clock.now() * 1_000_000)
        self._channel: grpc.aio.Channel | None = None
        self._sender: BatchSender | None = None
        self._acks: AckFrames | None = None
        """The task runner's ACKs, many to a frame (`ack_soon`)."""
        self.last_offset = 0
        """The highest inbox offset received."""
        self._unacked: dict[str, int] = {}
        self.directory: dict[str, dict[str, Any]] = {}
        """Local discovery state: the other registered agents, kept from join/leave notices."""

    async def __aenter__(self) -> Connection:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Deregister and close. Leaving on an error, the agent's error is the one raised: a
        deregistration that fails too (most often for the same cause, the coordinator or its
        store unreachable) is logged, not raised in its place (its error, translated from
        gRPC's, would carry nothing of the agent's)."""
        if et is None:
            await self.stop("agent exited")
            return
        try:
            await self.stop(f"agent failed: {et.__name__}")
        except ApiaryError as exc:
            log.warning(
                "%s left on %s and could not deregister: %s", self.agent_id, et.__name__, exc
            )

    @property
    def channel(self) -> grpc.aio.Channel:
        if self._channel is None:
            raise RuntimeError(f"agent {self.agent_id} is not started")
        return self._channel

    async def start(self) -> None:
        """Connect and register with the coordinator."""
        self.connect()
        await self.register()

    def connect(self) -> None:
        """Open the channel without registering: enough to send as an agent that is
        registered elsewhere, or as a producer that needs no answer (`apiary send`)."""
        if self._channel is None:
            credentials = self._credentials
            if credentials is None:
                credentials = ClientCredentials.load()
            prover = self._prover = self._call_prover(credentials)
            self._channel = open_channel(
                self._coordinator, self._tls, credentials, per_call=(prover,) if prover else ()
            )

    @property
    def proves_calls(self) -> bool:
        """Whether the calls carry per-call proofs (see `prove_calls`; known once connected)."""
        return self._prover is not None

    def _call_prover(self, credentials: ClientCredentials) -> CallProver | None:
        """What adds the per-call proofs (see `prove_calls`), None without them."""
        key = self._signing_key
        prove = self._prove_calls
        if prove is None:
            tls = self._tls if self._tls is not None else credentials.tls
            certificate = tls is not None and tls.cert is not None
            prove = key is not None and not credentials.api_key and not certificate
        if not prove or key is None:
            return None
        return CallProver(
            self.agent_id, key, audience=credentials.audience, tenant=credentials.tenant,
            now=self._clock.now,
        )  # fmt: skip

    async def register(self) -> None:
        """Register (again, after a reconnect). A re-registration also proves the call when
        the connection proves its calls, so that an agent whose only credential is its key
        is recognised in secure mode; a coordinator that no longer knows the key (a memory
        store restarted) refuses the proof, and the registration is made without it."""
        stub = pb.registry_pb2_grpc.RegistryServiceStub(self.channel)
        request = pb.registry_pb2.RegisterAgentRequest(agent=self._descriptor)
        metadata = self._signed(request.SerializeToString(deterministic=True))
        if self.task_concurrency is not None:
            metadata += ((TASK_CONCURRENCY_METADATA, str(self.task_concurrency)),)
        prover = self._prover
        if prover is not None and self._registered:
            proven = (*metadata, (PROOF_KEY, prover.proof(REGISTER_METHOD)))
            try:
                reply = await errors.call(lambda: stub.RegisterAgent(request, metadata=proven))
            except UnauthenticatedError:
                reply = await errors.call(lambda: stub.RegisterAgent(request, metadata=metadata))
        else:
            reply = await errors.call(lambda: stub.RegisterAgent(request, metadata=metadata))
        if not reply.accepted:
            raise ValidationError(f"registration of {self.agent_id} refused: {reply.reason}")
        self._registered = True

    async def stop(self, reason: str = "shutdown", *, deregister: bool = True) -> None:
        """Deregister (unless told not to) and close the connection; idempotent."""
        if self._channel is None:
            return
        try:
            if self._acks is not None:
                await self._acks.close()
            if self._sender is not None:
                await self._sender.close()
            if deregister:
                stub = pb.registry_pb2_grpc.RegistryServiceStub(self._channel)
                request = pb.registry_pb2.DeregisterAgentRequest(
                    agent_id=self.agent_id, reason=reason
                )
                metadata = self._signed(request.SerializeToString(deterministic=True))
                await errors.call(lambda: stub.DeregisterAgent(request, metadata=metadata))
        finally:
            await self._channel.close()
            self._channel = None
            self._sender = None
            self._acks = None

    def _signed(self, data: bytes) -> tuple[tuple[str, str], ...]:
        """The `sw4rm-signature` metadata for a request whose payload is `data` (none
        without a signing key)."""
        if self._signing_key is None:
            return ()
        return ((SIGNATURE_KEY, encode_signature(self._signing_key.sign(data))),)

    # ------------------------------------------------------------------ sending

    def envelope(
        self,
        body: Any,
        *,
        content_type: str = JSON,
        message_type: MessageType = MessageType.DATA,
        correlation_id: str = "",
        idempotency_token: str = "",
        ttl_ms: int = 0,
    ) -> Envelope:
        """A new envelope from this agent (bytes are sent as they are, anything else as JSON)."""
        payload = body if isinstance(body, bytes) else json.dumps(body).encode()
        self._sequence += 1
        message_id = self._ids.new_id()
        return Envelope(
            message_id=message_id,
            producer_id=self.agent_id,
            message_type=message_type,
            payload=payload,
            content_type=content_type,
            content_length=len(payload),
            correlation_id=correlation_id or message_id,
            sequence_number=self._sequence,
            idempotency_token=idempotency_token,
            ttl_ms=ttl_ms,
            timestamp=self._clock.now(),
        )

    def retry(self, env: Envelope) -> Envelope:
        """The next attempt of `env`: a new message_id, the same idempotency token and
        correlation, retry_count + 1 (RFC 11.2, 11.3)."""
        return replace(env, message_id=self._ids.new_id(), retry_count=env.retry_count + 1)

    async def send_envelope(self, env: Envelope, to: str = "") -> str:
        """Send one envelope; returns the router's reason. Refusals raise ApiaryError."""
        stub = pb.router_pb2_grpc.RouterServiceStub(self.channel)
        request = pb.router_pb2.SendMessageRequest(msg=envelope_to_proto(env))
        signed = self._signed(request.msg.SerializeToString(deterministic=True))
        metadata = (((RECIPIENT_KEY, to),) if to else ()) + signed
        reply = await errors.call(lambda: stub.SendMessage(request, metadata=metadata))
        if not reply.accepted:
            code, _, text = reply.reason.partition(": ")
            raise error_for_code(code, text or reply.reason, {"message_id": env.message_id})
        return str(reply.reason)

    async def send(self, to: str, body: Any, **options: Any) -> Envelope:
        """Send `body` to agent `to` (options as for `envelope`)."""
        env = self.envelope(body, **options)
        await self.send_envelope(env, to)
        return env

    async def send_chunked(
        self, to: str, payload: bytes, content_type: str, *, chunk_bytes: int = 1024 * 1024
    ) -> str:
        """Send a large payload as a chunked transfer (the recipient must have declared the
        `chunking` capability); returns the message_id of the assembled message."""
        transfer_id = self._ids.new_id()
        correlation = transfer_id
        for chunk in chunk_payloads(transfer_id, payload, content_type, chunk_bytes):
            env = self.envelope(chunk, content_type=CHUNK_CONTENT_TYPE, correlation_id=correlation)
            await self.send_envelope(env, to)
        return transfer_id

    async def send_many(
        self,
        items: Sequence[tuple[Envelope, str]],
        traces: Sequence[TraceContext | None] | None = None,
    ) -> list[SendResult]:
        """Send many envelopes in one frame of the streaming sender; per-envelope results.
        Each carries the span current now, or its own of `traces` when given."""
        if self._sender is None:
            key = self._signing_key
            self._sender = BatchSender(self.channel, key.sign if key is not None else None)
        return await self._sender.send(items, traces)

    async def ack(
        self, env: Envelope, stage: AckStage, *, error_code: str = "", note: str = ""
    ) -> Envelope:
        """Acknowledge `env` at `stage`; the coordinator forwards it to the producer."""
        ack = self.ack_envelope(env, stage, error_code=error_code, note=note)
        await self.send_envelope(ack)
        self._unacked.pop(env.message_id, None)
        return ack

    def ack_soon(
        self,
        env: Envelope,
        stage: AckStage,
        *,
        error_code: str = "",
        note: str = "",
        lazy: bool = False,
    ) -> asyncio.Future[None]:
        """Acknowledge `env` at `stage` over the streaming sender, queued now after the ACKs
        queued so before it and sent with them in as few frames as the stream allows
        (sdk/task_acks.py). The future is done once the coordinator took the ACK, or fails
        with the ApiaryError that refused it."""
        if self._acks is None:
            self._acks = AckFrames(self.send_many)
        done = self._acks.send(
            self.ack_envelope(env, stage, error_code=error_code, note=note), lazy=lazy
        )

        def taken(future: asyncio.Future[None]) -> None:
            if not future.cancelled() and future.exception() is None:
                self._unacked.pop(env.message_id, None)

        done.add_done_callback(taken)
        return done

    def acks_now(self) -> None:
        """Send the lazy ACKs `ack_soon` queued without waiting for an eager one."""
        if self._acks is not None:
            self._acks.now()

    @property
    def resume_after(self) -> int:
        """Where a reconnect resumes: after the last offset with nothing unacknowledged
        before it (RFC 5.5: the last acknowledged offset), so unacknowledged messages come
        again."""
        if self._unacked:
            return min(self._unacked.values()) - 1
        return self.last_offset

    def ack_envelope(
        self, env: Envelope, stage: AckStage, *, error_code: str = "", note: str = ""
    ) -> Envelope:
        payload = ack_to_json(Ack(env.message_id, stage, error_code, note))
        return self.envelope(
            payload, message_type=MessageType.ACKNOWLEDGEMENT, correlation_id=env.correlation_id
        )

    # ------------------------------------------------------------------ receiving

    async def deliveries(self, *, reconnect: bool = False) -> AsyncGenerator[Delivery, None]:
        """Inbound deliveries in order, resuming after `last_offset` on every (re)connect.

        Heartbeats are answered and join/leave notices applied here, not yielded. With
        `reconnect`, a lost coordinator is retried with backoff (re-registering), forever.
        """
        failures = 0
        while True:
            try:
                async for delivery in self._inbound():
                    failures = 0
                    yield delivery
                return
            except ApiaryError as exc:
                if not reconnect or exc.code not in RECONNECT_CODES:
                    raise
            await asyncio.sleep(RECONNECT_DELAYS_S[min(failures, len(RECONNECT_DELAYS_S) - 1)])
            failures += 1
            try:
                await self.register()
            except ApiaryError:
                continue

    async def _inbound(self) -> AsyncIterator[Delivery]:
        stub = pb.apiary_pb2_grpc.RouterStreamServiceStub(self.channel)
        request = pb.apiary_pb2.InboundRequest(
            agent_id=self.agent_id, resume_after=self.resume_after
        )
        call = stub.Inbound(request)
        try:
            async for batch in errors.stream(call.__aiter__()):
                last = _last_handed_on(batch.deliveries)
                for index, item in enumerate(batch.deliveries):
                    self.last_offset = max(self.last_offset, item.offset)
                    env = envelope_from_proto(item.msg)
                    if self._verify and not await self._authentic(item, env):
                        continue
                    if await self._handled_notice(env):
                        continue
                    notice = _is_notice(env)
                    if env.message_type is not MessageType.ACKNOWLEDGEMENT and not notice:
                        self._unacked[env.message_id] = item.offset
                    trace = (
                        TraceContext(item.traceparent, item.tracestate)
                        if item.traceparent
                        else None
                    )
                    yield Delivery(
                        env, item.offset, item.attempt, item.urgent, notice, index >= last, trace
                    )
        finally:
            # Closing the deliveries ends the stream on the coordinator now, not when the
            # call is collected: the inbox is free for the next stream at once.
            call.cancel()

    async def _authentic(self, item: pb.apiary_pb2.Delivery, env: Envelope) -> bool:
        """Whether `item` may be handed on (see `verify_signatures`); refuses it if not."""
        # A message the coordinator derived (a requeued dead letter, an assembled transfer)
        # comes with the signed envelope it follows from; the signature covers that one.
        derived = not item.origin or derived_from(item.msg, item.origin)
        data = item.origin or item.msg.SerializeToString(deterministic=True)
        for refresh in (False, True):  # the keys as known, then again: rotated since?
            keys = await self._producer_keys(env.producer_id, refresh=refresh)
            if keys is None:
                return True  # no registered agent: the coordinator's own message
            if derived and any(_signed_by(key, data, item.signature) for key in keys):
                return True
        if not item.signature:
            why = f"{env.message_id} from {env.producer_id} is not signed"
        elif not derived:
            why = (
                f"{env.message_id} from {env.producer_id} is not what the coordinator derives "
                "from the signed envelope delivered with it"
            )
        else:
            why = (
                f"the signature of {env.message_id} does not verify against the key"
                f" {env.producer_id} registered"
            )
        log.warning("refused: %s", why)
        if env.message_type is not MessageType.ACKNOWLEDGEMENT:
            await self.ack(env, AckStage.REJECTED, error_code="PERMISSION_DENIED", note=why)
        return False

    async def _producer_keys(
        self, agent_id: str, *, refresh: bool = False
    ) -> tuple[bytes, ...] | None:
        """The keys a message of `agent_id` may be signed with: its registered key, then
        the keys it rotated away within their grace (a message signed before a rotation
        and delivered after it still verifies; admission takes only the current key)."""
        if refresh or agent_id not in self._keys:
            stub = pb.apiary_pb2_grpc.DiscoveryServiceStub(self.channel)
            request = pb.apiary_pb2.GetAgentRequest(agent_id=agent_id)
            try:
                info = await errors.call(lambda: stub.GetAgent(request))
            except NotFoundError:
                self._keys[agent_id] = None
            else:
                self._keys[agent_id] = (
                    bytes(info.descriptor.public_key),
                    *(bytes(retired.public_key) for retired in info.retired_keys),
                )
        return self._keys[agent_id]

    async def _handled_notice(self, env: Envelope) -> bool:
        if env.message_type is MessageType.HEARTBEAT:
            try:
                await self.heartbeat()
            except ApiaryError as exc:
                if exc.code != "unavailable":
                    raise
                # The coordinator could not take the answer now (its store, say): a missed
                # answer is a missed heartbeat, not the end of the stream.
                log.warning("%s could not answer a heartbeat: %s", self.agent_id, exc)
            return True
        if _is_notice(env):
            body = json.loads(env.payload or b"{}")
            if isinstance(body, dict) and body.get("event") in DIRECTORY_EVENTS:
                self._apply_notice(body)
                return True
        return False

    def _apply_notice(self, body: dict[str, Any]) -> None:
        event = body.get("event")
        if event == "directory":
            self.directory = {
                a["agent_id"]: a for a in body.get("agents", []) if a["agent_id"] != self.agent_id
            }
        elif event == "agent_joined":
            agent = body.get("agent", {})
            self.directory[agent.get("agent_id", "")] = agent
        elif event == "agent_left":
            self.directory.pop(str(body.get("agent_id")), None)

    async def heartbeat(self, state: str = "RUNNING") -> None:
        stub = pb.registry_pb2_grpc.RegistryServiceStub(self.channel)
        request = pb.registry_pb2.HeartbeatRequest(
            agent_id=self.agent_id, state=pb.common_pb2.AgentState.Value(state)
        )
        await errors.call(lambda: stub.Heartbeat(request))

    async def messages(self) -> AsyncIterator[Envelope]:
        """Inbound envelopes, in order, until the connection closes."""
        async for delivery in self.deliveries():
            yield delivery.envelope


DIRECTORY_EVENTS = frozenset({"directory", "agent_joined", "agent_left"})
"""Coordinator notices the connection applies to `directory` itself; the others (HITL,
task deferrals, ...) are delivered, marked as notices."""


def _is_notice(env: Envelope) -> bool:
    return env.message_type is MessageType.NOTIFICATION and env.producer_id == "coordinator"


def _last_handed_on(items: Sequence[pb.apiary_pb2.Delivery]) -> int:
    """The index of the last of a batch's `items` that `_inbound` hands on rather than
    handles itself (heartbeats, directory notices); -1 when there is none. (One that then
    fails signature verification is not handed on either: the delivery before it is then not
    marked as its batch's end.)"""
    for index in range(len(items) - 1, -1, -1):
        msg = items[index].msg
        if msg.message_type == pb.common_pb2.HEARTBEAT:
            continue
        if msg.message_type == pb.common_pb2.NOTIFICATION and msg.producer_id == "coordinator":
            try:
                body = json.loads(msg.payload or b"{}")
            except ValueError:
                return index
            if isinstance(body, dict) and body.get("event") in DIRECTORY_EVENTS:
                continue
        return index
    return -1


def _signed_by(key: bytes, data: bytes, signature: bytes) -> bool:
    return bool(key) and bool(signature) and verifies(key, data, signature)
