"""Clients present the credentials of `ClientCredentials.load()` on every call (real
sockets): the API key on all four call kinds over plain and TLS channels, an agent's
per-call proofs against a secure coordinator (replays and proofs for another method
refused), and the CLI saying whom it acted as."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from apiary.core.access.principal import Principal, PrincipalKind
from apiary.core.access.proof import PROOF_KEY
from apiary.core.envelope import AckStage
from apiary.errors import UnauthenticatedError
from apiary.sdk.agent import Agent
from apiary.sdk.channel import open_channel
from apiary.sdk.client import Client
from apiary.sdk.connection import Connection, Delivery
from apiary.sdk.credentials import CallProver, ClientCredentials
from apiary.server.auth.devca import issue_dev_certificates
from apiary.server.auth.keys import KeyRing, credentials_path
from apiary.server.auth.settings import AuthSettings
from apiary.server.config.address import Address
from apiary.server.config.server import ServerConfig
from apiary.server.coordinator import Coordinator, open_coordinator
from apiary.server.inprocess import open_test_coordinator
from apiary.wire import pb

CLIENT_VARIABLES = (
    "APIARY_API_KEY", "APIARY_TLS_CA", "APIARY_TLS_CERT", "APIARY_TLS_KEY", "APIARY_AUDIENCE",
    "APIARY_COORDINATOR", "APIARY_CLIENT_CONFIG", "XDG_CONFIG_HOME", "APIARY_TOKEN",
)  # fmt: skip
HEARTBEAT = "/sw4rm.registry.RegistryService/Heartbeat"
ECHO = "apiary.test.Echo"
reg = pb.registry_pb2


@pytest.fixture(autouse=True)
def _no_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Each test starts with no client credentials anywhere (a home of its own)."""
    for name in CLIENT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


@asynccontextmanager
async def _secure(tmp_path: Path) -> AsyncIterator[tuple[Coordinator, KeyRing]]:
    """A secure-mode coordinator (authentication, default deny; no TLS, as in-process
    tests may) and its key ring."""
    config = ServerConfig(
        data_dir=tmp_path / "data", grpc=Address("127.0.0.1", 0),
        http=Address("127.0.0.1", 0), store="memory://", auth=AuthSettings(secure=True),
    )  # fmt: skip
    async with open_coordinator(config) as coordinator:
        yield coordinator, KeyRing(credentials_path(tmp_path / "data"))


def _key(ring: KeyRing, kind: PrincipalKind, name: str, roles: tuple[str, ...] = ()) -> str:
    return ring.create(kind, name, roles=roles, now=time.time())[1]


# --- the API key on every kind of call ----------------------------------------------------------


def _echo_server_handler() -> grpc.GenericRpcHandler:
    """Answers every call kind with the credentials the call carried, as JSON."""

    def seen(context: grpc.aio.ServicerContext) -> bytes:
        metadata = dict(context.invocation_metadata() or ())
        return json.dumps({k: metadata.get(k, "") for k in ("authorization", PROOF_KEY)}).encode()

    async def unary_unary(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return seen(context)

    async def unary_stream(request: bytes, context: grpc.aio.ServicerContext) -> Any:
        yield seen(context)

    async def stream_unary(requests: Any, context: grpc.aio.ServicerContext) -> bytes:
        async for _ in requests:
            pass
        return seen(context)

    async def stream_stream(requests: Any, context: grpc.aio.ServicerContext) -> Any:
        async for _ in requests:
            yield seen(context)

    return grpc.method_handlers_generic_handler(ECHO, {
        "UnaryUnary": grpc.unary_unary_rpc_method_handler(unary_unary),
        "UnaryStream": grpc.unary_stream_rpc_method_handler(unary_stream),
        "StreamUnary": grpc.stream_unary_rpc_method_handler(stream_unary),
        "StreamStream": grpc.stream_stream_rpc_method_handler(stream_stream),
    })  # fmt: skip


@asynccontextmanager
async def _echo_server(tls: tuple[Path, Path] | None = None) -> AsyncIterator[str]:
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((_echo_server_handler(),))
    if tls is None:
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        pair = (tls[1].read_bytes(), tls[0].read_bytes())
        port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([pair]))
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


async def _every_kind(channel: grpc.aio.Channel, metadata: Any = None) -> list[dict[str, str]]:
    """What the echo server saw on one call of each kind."""

    async def one() -> Any:
        yield b"x"

    seen = [
        await channel.unary_unary(f"/{ECHO}/UnaryUnary")(b"x", metadata=metadata),
        *[r async for r in channel.unary_stream(f"/{ECHO}/UnaryStream")(b"x", metadata=metadata)],
        await channel.stream_unary(f"/{ECHO}/StreamUnary")(one(), metadata=metadata),
        *[r async for r in channel.stream_stream(f"/{ECHO}/StreamStream")(one(),
                                                                          metadata=metadata)],
    ]  # fmt: skip
    return [json.loads(raw) for raw in seen]


async def test_every_call_kind_carries_the_api_key_on_plain_and_tls_channels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = "apk_abcdefghijkm_" + "K" * 43
    monkeypatch.setenv("APIARY_API_KEY", key)
    certs = issue_dev_certificates(tmp_path / "certs", [], now=dt.datetime.now(dt.UTC))
    monkeypatch.setenv("APIARY_TLS_CA", str(certs.ca_cert))
    async with (
        _echo_server() as plain,
        _echo_server((certs.server_cert, certs.server_key)) as secured,
    ):
        # No credentials given: open_channel takes them from the environment (TLS too).
        async with open_channel(secured) as channel:
            seen = await _every_kind(channel)
        assert [s["authorization"] for s in seen] == [f"Bearer {key}"] * 4
        async with open_channel(plain, credentials=ClientCredentials(api_key=key)) as channel:
            seen = await _every_kind(channel)
            assert [s["authorization"] for s in seen] == [f"Bearer {key}"] * 4
            # A call that sets authorization itself (an operator token) keeps it.
            given = await _every_kind(channel, (("authorization", "Bearer op-token"),))
            assert [s["authorization"] for s in given] == ["Bearer op-token"] * 4
        async with open_channel(plain, credentials=ClientCredentials()) as channel:
            assert [s["authorization"] for s in await _every_kind(channel)] == [""] * 4


async def test_a_call_proof_goes_instead_of_the_key(tmp_path: Path) -> None:
    prover = CallProver("bob", Ed25519PrivateKey.generate())
    credentials = ClientCredentials(api_key="apk_abcdefghijkm_" + "K" * 43)
    async with (
        _echo_server() as plain,
        open_channel(plain, credentials=credentials, per_call=(prover,)) as channel,
    ):
        seen = await _every_kind(channel)
    assert [s["authorization"] for s in seen] == [""] * 4
    assert all(s[PROOF_KEY].startswith("v1;bob;") for s in seen)
    assert len({s[PROOF_KEY] for s in seen}) == 4  # a fresh nonce per call


# --- a real coordinator in secure mode --------------------------------------------------------


async def test_a_client_with_apiary_api_key_is_authenticated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with _secure(tmp_path) as (coordinator, ring):
        address = str(coordinator.grpc_address)
        events = _key(ring, PrincipalKind.OPERATOR, "auditor", ("events",))
        request = pb.apiary_pb2.ReadEventsRequest(limit=1)
        async with Client(address) as anonymous:
            with pytest.raises(UnauthenticatedError, match="secure mode"):
                await anonymous.events.ReadEvents(request)
        monkeypatch.setenv("APIARY_API_KEY", events)
        async with Client(address) as client:
            reply = await client.events.ReadEvents(request)
        assert reply.last_sequence >= 1
        # The same key from the client configuration file, for a tool with no environment.
        monkeypatch.delenv("APIARY_API_KEY")
        config = tmp_path / "client.toml"
        config.write_text(f'[client]\napi_key = "{events}"\n')
        config.chmod(0o600)
        monkeypatch.setenv("APIARY_CLIENT_CONFIG", str(config))
        async with Client(address) as client:
            assert (await client.events.ReadEvents(request)).last_sequence >= 1


async def _first_data(connection: Connection) -> Delivery:
    async def first() -> Delivery:
        async for delivery in connection.deliveries():
            if not delivery.notice:
                return delivery
        raise AssertionError("the inbox stream ended")

    return await asyncio.wait_for(first(), 10)


async def _access(client: Client, actor: str) -> list[dict[str, Any]]:
    """The `access.decided` events of `actor`."""
    reply = await client.events.ReadEvents(
        pb.apiary_pb2.ReadEventsRequest(event_types=["access.decided"], limit=1000)
    )
    return [json.loads(e.details_json) for e in reply.events if e.actor == actor]


async def test_an_agent_registered_by_key_proves_its_calls_afterwards(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with _secure(tmp_path) as (coordinator, ring):
        address = str(coordinator.grpc_address)
        bob_key = _key(ring, PrincipalKind.AGENT, "bob")
        auditor = ClientCredentials(api_key=_key(ring, PrincipalKind.OPERATOR, "a", ("events",)))
        monkeypatch.setenv("APIARY_API_KEY", bob_key)
        bob = Agent("bob", coordinator=address, signing_key=Ed25519PrivateKey.generate(),
                    prove_calls=True)  # fmt: skip
        await bob.start()  # registered as the key's agent
        try:
            assert bob.proves_calls
            # From now on the key is not needed: the proofs authenticate bob.
            ring.revoke(bob_key, now=time.time())
            await bob.heartbeat()
            # A reconnecting agent registers again: its proof vouches for it, not the key.
            await bob.register()
            sent = await bob.send("bob", {"n": 1})
            got = await _first_data(bob)
            assert got.envelope.message_id == sent.message_id
            await bob.ack(got.envelope, AckStage.FULFILLED)
        finally:
            await bob.stop()
        async with Client(address, credentials=auditor) as client:
            decided = await _access(client, "agent:bob@default")
        mechanisms = {(d["action"].rsplit("/", 1)[1], d["mechanism"]) for d in decided}
        assert ("RegisterAgent", "api_key") in mechanisms
        assert ("RegisterAgent", "agent_proof") in mechanisms
        for method in ("Heartbeat", "SendMessage", "Inbound", "DeregisterAgent"):
            assert (method, "agent_proof") in mechanisms, method
        assert all(d["allowed"] for d in decided)


async def _registered_bob(address: str, ring: KeyRing) -> Ed25519PrivateKey:
    key = Ed25519PrivateKey.generate()
    credentials = ClientCredentials(api_key=_key(ring, PrincipalKind.AGENT, "bob"))
    bob = Connection("bob", coordinator=address, signing_key=key, credentials=credentials)
    await bob.start()
    await bob.stop(deregister=False)
    return key


async def _heartbeat(channel: grpc.aio.Channel, proof: str) -> Any:
    stub = pb.registry_pb2_grpc.RegistryServiceStub(channel)
    request = reg.HeartbeatRequest(agent_id="bob")
    return await stub.Heartbeat(request, metadata=((PROOF_KEY, proof),))


async def test_a_replayed_proof_is_refused(tmp_path: Path) -> None:
    async with _secure(tmp_path) as (coordinator, ring):
        address = str(coordinator.grpc_address)
        key = await _registered_bob(address, ring)
        proof = CallProver("bob", key).proof(HEARTBEAT)
        async with open_channel(address, credentials=ClientCredentials()) as channel:
            assert (await _heartbeat(channel, proof)).ok
            with pytest.raises(grpc.aio.AioRpcError) as replayed:
                await _heartbeat(channel, proof)
        assert replayed.value.code() is grpc.StatusCode.UNAUTHENTICATED
        assert PROOF_KEY in (replayed.value.details() or "")


async def test_a_proof_for_another_method_or_agent_is_refused(tmp_path: Path) -> None:
    async with _secure(tmp_path) as (coordinator, ring):
        address = str(coordinator.grpc_address)
        key = await _registered_bob(address, ring)
        prover = CallProver("bob", key)
        async with open_channel(address, credentials=ClientCredentials()) as channel:
            for proof in (
                prover.proof("/sw4rm.registry.RegistryService/DeregisterAgent"),
                CallProver("bob", key, audience="elsewhere").proof(HEARTBEAT),
                CallProver("bob", Ed25519PrivateKey.generate()).proof(HEARTBEAT),
            ):
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await _heartbeat(channel, proof)
                assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
                assert "not a signature of this call" in (refused.value.details() or "")
            # A right proof still goes through: nothing above was taken for bob.
            assert (await _heartbeat(channel, prover.proof(HEARTBEAT))).ok


async def test_an_agent_with_a_key_proves_its_calls_by_default_in_dev_mode(
    tmp_path: Path,
) -> None:
    async with open_test_coordinator(tmp_path) as coordinator:
        bob = Connection("bob", coordinator=str(coordinator.grpc_address),
                         signing_key=Ed25519PrivateKey.generate())  # fmt: skip
        await bob.start()
        try:
            assert bob.proves_calls
            await bob.heartbeat()
            sent = await bob.send("bob", {"n": 1})
            assert (await _first_data(bob)).envelope.message_id == sent.message_id
        finally:
            await bob.stop()


# --- the CLI says whom it acts as -------------------------------------------------------------


async def _cli(address: str, env: dict[str, str], *args: str, code: int) -> tuple[str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "apiary.cli.main", *args, "--grpc", address,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "COLUMNS": "200", **env},
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == code, (proc.returncode, err.decode())
    return out.decode(), err.decode()


async def test_status_shows_the_credentials_and_refusals_name_them(tmp_path: Path) -> None:
    async with _secure(tmp_path) as (coordinator, ring):
        address = str(coordinator.grpc_address)
        operator = _key(ring, PrincipalKind.OPERATOR, "ops", ("dlq",))
        agent = _key(ring, PrincipalKind.AGENT, "bob")
        operator_id, agent_id = operator.split("_")[1], agent.split("_")[1]
        out, _ = await _cli(address, {"APIARY_API_KEY": operator}, "status", "--json", code=0)
        shown = json.loads(out)["credentials"]
        assert (shown["presents"], shown["key_id"], shown["source"]) == (
            "api_key", operator_id, "APIARY_API_KEY",
        )  # fmt: skip
        assert operator.split("_", 2)[2] not in out
        table, _ = await _cli(address, {"APIARY_API_KEY": operator}, "status", code=0)
        assert f"credentials: API key {operator_id} (from APIARY_API_KEY)" in table
        _, denied = await _cli(address, {"APIARY_API_KEY": agent}, "status", code=1)
        assert "permission_denied" in denied and "agent:bob@default" in denied
        assert denied.strip().endswith(f"(acting as API key {agent_id} from APIARY_API_KEY)")
        _, anonymous = await _cli(address, {}, "status", code=1)
        assert "unauthenticated" in anonymous
        assert anonymous.strip().endswith("(acting as anonymous, with no credential)")


async def test_status_names_the_client_certificates_principal(tmp_path: Path) -> None:
    ops = Principal(PrincipalKind.OPERATOR, "ops", "team-a", frozenset({"dlq"}))
    worker = Principal(PrincipalKind.AGENT, "worker-1", "team-a")
    now = dt.datetime.now(dt.UTC)
    certs = issue_dev_certificates(tmp_path / "certs", [ops, worker], now=now)

    def env(who: int) -> dict[str, str]:
        client = certs.clients[who]
        return {"APIARY_TLS_CA": str(certs.ca_cert), "APIARY_TLS_CERT": str(client.cert),
                "APIARY_TLS_KEY": str(client.key)}  # fmt: skip

    async with open_test_coordinator(
        tmp_path / "data", tls_cert=certs.server_cert, tls_key=certs.server_key,
        tls_client_ca=certs.ca_cert, auth=AuthSettings(secure=True),
    ) as coordinator:  # fmt: skip
        address = str(coordinator.grpc_address)
        out, _ = await _cli(address, env(0), "status", "--json", code=0)
        _, denied = await _cli(address, env(1), "status", code=1)
    shown = json.loads(out)["credentials"]
    assert (shown["presents"], shown["principal"], shown["tenant"], shown["source"]) == (
        "client_certificate", "operator:ops@team-a", "team-a", "APIARY_TLS_CERT",
    )  # fmt: skip
    assert "apiary://team-a/operator/ops?roles=dlq" in shown["text"]
    assert denied.strip().endswith(
        "(acting as client certificate apiary://team-a/agent/worker-1 from APIARY_TLS_CERT)"
    )


async def test_an_agent_of_another_tenant_proves_its_calls_in_its_tenant(tmp_path: Path) -> None:
    """`tenant` (APIARY_TENANT, `[client] tenant`) goes as `apiary-tenant` on every call: an
    agent of acme registered with its key proves its later calls against acme's registry,
    and is acme's agent, not the default tenant's."""
    async with _secure(tmp_path) as (coordinator, ring):
        address = str(coordinator.grpc_address)
        key = ring.create(PrincipalKind.AGENT, "bob", tenant="acme", now=time.time())[1]
        credentials = ClientCredentials(api_key=key, tenant="acme")
        bob = Agent(
            "bob", coordinator=address, signing_key=Ed25519PrivateKey.generate(),
            credentials=credentials, prove_calls=True,
        )  # fmt: skip
        await bob.start()
        try:
            ring.revoke(key, now=time.time())  # from now on only the proofs speak for bob
            await bob.heartbeat()
        finally:
            await bob.stop()
        assert coordinator.tenancy is not None
        acme = coordinator.tenancy.opened("acme")
        assert acme is not None
        events = await acme.engine.events.read(limit=10_000)
        beats = [
            e for e in events
            if e.event_type == "access.decided" and e.details["action"].endswith("/Heartbeat")
        ]  # fmt: skip
        assert [(e.actor, e.details["mechanism"]) for e in beats] == [
            ("agent:bob@acme", "agent_proof")
        ]
        assert [a.agent_id for a in await coordinator.store.agents.list()] == []
