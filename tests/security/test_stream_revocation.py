"""A long-lived event stream is decided again before each write: revoking (or expiring)
the credential it was opened with ends it with an `error` event naming the refusal, and
deciding again records nothing for the stream to carry."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import aiohttp
import pytest

from apiary.core.access.principal import PrincipalKind
from apiary.server.auth.keys import KeyRing, credentials_path
from apiary.wire import pb
from tests.security.access_harness import open_secure
from tests.server.wire_client import descriptor

pytestmark = pytest.mark.conformance("security.multitenant.defense-in-depth")
WAIT_S = 10.0


async def _frames(response: aiohttp.ClientResponse) -> list[str]:
    """The stream's frames until it ends."""
    text = (await asyncio.wait_for(response.text(), WAIT_S)).strip()
    return [frame for frame in text.split("\n\n") if frame]


async def test_revoking_the_key_ends_the_open_event_stream(tmp_path: Path) -> None:
    async with open_secure(tmp_path) as secure:
        ring = KeyRing(credentials_path(tmp_path))
        entry, key = ring.create(
            PrincipalKind.OPERATOR, "watcher", roles=("events",), now=time.time()
        )
        url = f"http://{secure.coordinator.http_address}/v1/events/stream?keepalive=1"
        async with (
            aiohttp.ClientSession() as session,
            session.get(url, headers={"Authorization": f"Bearer {key}"}) as response,
        ):
            assert response.status == 200
            first = await asyncio.wait_for(response.content.readuntil(b"\n\n"), WAIT_S)
            assert first.startswith(b"retry:")
            ring.revoke(entry.key_id, now=time.time())
            registry = pb.registry_pb2_grpc.RegistryServiceStub(secure.channel)
            reply = await registry.RegisterAgent(
                pb.registry_pb2.RegisterAgentRequest(agent=descriptor("carol")),
                metadata=secure.metadata("root"),
            )
            assert reply.accepted
            frames = await _frames(response)
        (last,) = [f for f in frames if f.startswith("event: error")]
        assert frames[-1] == last
        refusal = json.loads(last.split("data: ", 1)[1])
        assert refusal["code"] == "unauthenticated" and "revoked" in refusal["message"]
        # Nothing of carol's registration reached the revoked watcher.
        assert not any("agent.registered" in f for f in frames)
