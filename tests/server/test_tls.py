"""TLS and mTLS on the coordinator's gRPC and HTTP ports (DESIGN.md section 9), reached by
the SDK and the CLI through one channel factory (`apiary.sdk.channel`), with a private CA
made for the test."""

from __future__ import annotations

import asyncio
import os
import ssl
import sys
from pathlib import Path

import aiohttp
import grpc
import pytest

from apiary.errors import ValidationError
from apiary.sdk.channel import ClientTls, open_channel
from apiary.sdk.connection import Connection
from apiary.server.inprocess import open_test_coordinator
from apiary.wire import pb
from tests.server.wire_client import descriptor
from tests.swarm.pki import Pki, make_pki


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki")


async def _register(channel: grpc.aio.Channel, agent_id: str) -> bool:
    stub = pb.registry_pb2_grpc.RegistryServiceStub(channel)
    request = pb.registry_pb2.RegisterAgentRequest(agent=descriptor(agent_id))
    reply = await stub.RegisterAgent(request, timeout=5)
    return bool(reply.accepted)


async def _healthz(url: str, context: ssl.SSLContext | None) -> int:
    async with aiohttp.ClientSession() as http, http.get(url, ssl=context) as response:
        return response.status


async def test_tls_serves_clients_that_trust_the_ca_and_refuses_plain_ones(
    tmp_path: Path, pki: Pki
) -> None:
    async with open_test_coordinator(tmp_path, tls_cert=pki.cert_file, tls_key=pki.key_file) as c:
        address = f"localhost:{c.grpc_address.port}"
        async with open_channel(address, ClientTls(ca=pki.ca_file)) as channel:
            assert await _register(channel, "alice")
        async with Connection("bob", coordinator=address, tls=ClientTls(ca=pki.ca_file)) as bob:
            assert (await bob.send("alice", {"over": "tls"})).message_id
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async with grpc.aio.insecure_channel(address) as plain:
                await _register(plain, "mallory")
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        https = f"https://localhost:{c.http_address.port}/healthz"
        assert await _healthz(https, pki.client()) == 200
        with pytest.raises(aiohttp.ClientError):
            await _healthz(f"http://localhost:{c.http_address.port}/healthz", None)


async def test_mtls_requires_a_client_certificate(tmp_path: Path, pki: Pki) -> None:
    async with open_test_coordinator(
        tmp_path, tls_cert=pki.cert_file, tls_key=pki.key_file, tls_client_ca=pki.ca_file
    ) as c:
        address = f"localhost:{c.grpc_address.port}"
        anonymous = ClientTls(ca=pki.ca_file)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async with open_channel(address, anonymous) as channel:
                await _register(channel, "alice")
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        known = ClientTls(ca=pki.ca_file, cert=pki.client_cert, key=pki.client_key)
        async with open_channel(address, known) as channel:
            assert await _register(channel, "alice")
        https = f"https://localhost:{c.http_address.port}/healthz"
        with pytest.raises(aiohttp.ClientError):
            await _healthz(https, pki.client())
        with_cert = pki.client()
        with_cert.load_cert_chain(pki.client_cert, pki.client_key)
        assert await _healthz(https, with_cert) == 200


async def test_the_cli_reaches_a_tls_coordinator_through_the_environment(
    tmp_path: Path, pki: Pki
) -> None:
    async with open_test_coordinator(tmp_path, tls_cert=pki.cert_file, tls_key=pki.key_file) as c:
        address = f"localhost:{c.grpc_address.port}"
        command = [sys.executable, "-m", "apiary.cli.main", "events", "--grpc", address, "--json"]
        env = {**os.environ, "APIARY_TLS_CA": str(pki.ca_file)}
        # Not subprocess.run: the coordinator serves from this event loop.
        proc = await asyncio.create_subprocess_exec(
            *command, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()
        assert "coordinator.started" in out.decode()


def test_client_tls_settings_name_what_is_missing(tmp_path: Path) -> None:
    assert ClientTls.from_env({}) is None
    assert ClientTls.from_env({"APIARY_TLS_CA": "ca.pem"}) == ClientTls(ca=Path("ca.pem"))
    with pytest.raises(ValidationError) as caught:
        ClientTls.from_env({"APIARY_TLS_CERT": "me.pem"})
    assert caught.value.details["field"] == "APIARY_TLS_KEY"
    with pytest.raises(ValidationError) as caught:
        ClientTls(cert=Path("me.pem"))
    assert caught.value.details["field"] == "key"
    with pytest.raises(ValidationError) as caught:
        ClientTls(ca=tmp_path / "absent.pem").credentials()
    assert caught.value.details["field"] == "APIARY_TLS_CA"
