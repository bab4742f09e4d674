"""The bridge end to end: a coordinator with a [swarm] peer ("hive", TLS listener of its own)
and a remote Apiary peer. A swarm message reaches a local SDK agent through the router as a
DATA envelope (a notification as NOTIFICATION) in the swarm thread's correlation, the agent's
reply goes back out as a signed swarm message in the same thread, and its ACKs mark the
inbox message read. The swarm routes are also served on the coordinator's HTTP port."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

import apiary
from apiary.core.envelope import MessageType
from apiary.errors import NotFoundError, UnsupportedMessageTypeError, ValidationError
from apiary.server.config.address import Address
from apiary.server.config.server import ServerConfig
from apiary.server.coordinator import Coordinator, open_coordinator
from apiary.swarm.home import NodeConfig, SwarmHome
from apiary.swarm.node import SwarmNode
from apiary.swarm.settings import PeerSettings
from tests.swarm.peers import Peer, open_peer, until
from tests.swarm.pki import Pki


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@asynccontextmanager
async def _coordinator(tmp: Path, pki: Pki, bridge_agent: str) -> AsyncIterator[Coordinator]:
    port = _free_port()
    home = SwarmHome(tmp / "hive-home")
    home.init(NodeConfig("hive", f"https://127.0.0.1:{port}/swarm", ca_file=str(pki.ca_file)))
    swarm = PeerSettings(
        home.path, listen=f"127.0.0.1:{port}", cert=str(pki.cert_file), key=str(pki.key_file),
        bridge_agent=bridge_agent,
    )  # fmt: skip
    config = ServerConfig(
        data_dir=tmp / "data", grpc=Address("127.0.0.1", 0), http=Address("127.0.0.1", 0),
        store="memory://", swarm=swarm,
    )  # fmt: skip
    async with open_coordinator(config, swarm_client_tls=pki.client()) as c:
        yield c


class Reviewer(apiary.Agent):
    """A local agent: answers every swarm message, records what it got."""

    def __init__(self, coordinator: str) -> None:
        super().__init__("reviewer", coordinator=coordinator)
        self.got: list[apiary.Message] = []

    async def on_data(self, msg: apiary.Message) -> str:
        self.got.append(msg)
        body = msg.json()
        await msg.reply({"content": f"reviewed: {body['content']}", "priority": "high"})
        return "reviewed"

    async def on_notification(self, msg: apiary.Message) -> str:
        self.got.append(msg)
        return "noted"


@asynccontextmanager
async def _running(agent: apiary.Agent) -> AsyncIterator[None]:
    job = asyncio.create_task(agent.run())
    try:
        await until(lambda: agent._runner is not None)
        yield
    finally:
        job.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await job


@dataclass
class World:
    coordinator: Coordinator
    hive: SwarmNode
    remote: Peer
    reviewer: Reviewer
    swarm_id: str


@pytest.fixture
async def world(tmp_path: Path, pki: Pki) -> AsyncIterator[World]:
    async with _coordinator(tmp_path, pki, bridge_agent="") as coordinator:
        assert coordinator.swarm is not None and coordinator.swarm.bridge is not None
        hive = coordinator.swarm.node
        reviewer = Reviewer(str(coordinator.grpc_address))
        async with open_peer(tmp_path, "remote", pki) as remote, _running(reviewer):
            swarm_id = hive.create("federation").swarm_id
            assert (await remote.node.join(hive.invite(swarm_id).url)).status == "accepted"
            yield World(coordinator, hive, remote, reviewer, swarm_id)


async def _inbox(peer_store: Any, swarm_id: str) -> list[Any]:
    return [e for e in await peer_store.list_recent(swarm_id) if e.mail.message_type != "system"]


async def test_a_swarm_message_reaches_a_local_agent_and_its_reply_goes_back_signed(
    world: World,
) -> None:
    sent, (row,) = await world.remote.node.send(
        world.swarm_id, "hive", "please review PR 7", metadata={"to": "reviewer"},
        references=({"type": "github_pr", "repo": "o/r", "number": 7, "action": "mention"},),
    )  # fmt: skip
    assert row.status == "delivered"
    await until(lambda: world.reviewer.got)
    (got,) = world.reviewer.got
    assert got.message_type is MessageType.DATA
    assert got.producer_id == "swarm"
    assert got.correlation_id == sent.message_id  # no thread yet: the message starts one
    body = got.json()
    assert (body["content"], body["from"], body["swarm_id"], body["message_id"]) == (
        "please review PR 7", "remote", world.swarm_id, sent.message_id,
    )  # fmt: skip
    assert body["references"][0]["number"] == 7

    async def replied() -> list[Any]:
        return await _inbox(world.remote.store.swarm, world.swarm_id)

    await until(replied)
    (reply,) = await replied()
    assert reply.mail.sender_id == "hive"  # accepted by remote: signed by hive's key
    assert reply.mail.content == "reviewed: please review PR 7"
    assert (reply.mail.in_reply_to, reply.mail.thread_id) == (sent.message_id, sent.message_id)
    assert (reply.mail.recipient_id, reply.mail.priority) == ("remote", "high")
    assert reply.mail.wire["signature"]

    async def read() -> bool:
        entry = await world.hive.store.inbox_get(sent.message_id)
        return entry is not None and entry.status == "read"

    await until(read)  # the reviewer's ACKs came back to the bridge

    # The thread goes on: remote answers in the thread, the agent sees the same correlation.
    await world.remote.node.send(
        world.swarm_id, "hive", "thanks", metadata={"to": "reviewer"},
        thread_id=sent.message_id, in_reply_to=reply.mail.message_id,
    )  # fmt: skip
    await until(lambda: len(world.reviewer.got) == 2)
    assert world.reviewer.got[1].correlation_id == sent.message_id
    await until(lambda: _count(world, 2))


async def _count(world: World, n: int) -> bool:
    return len(await _inbox(world.remote.store.swarm, world.swarm_id)) == n


async def test_notifications_go_to_the_default_agent_and_unknown_agents_stay_in_the_inbox(
    tmp_path: Path, pki: Pki
) -> None:
    async with _coordinator(tmp_path, pki, bridge_agent="reviewer") as coordinator:
        assert coordinator.swarm is not None
        hive = coordinator.swarm.node
        reviewer = Reviewer(str(coordinator.grpc_address))
        async with open_peer(tmp_path, "remote", pki) as remote, _running(reviewer):
            sid = hive.create("federation").swarm_id
            await remote.node.join(hive.invite(sid).url)
            await remote.node.broadcast(sid, "new issue #9", kind="notification")
            await until(lambda: reviewer.got)
            assert reviewer.got[0].message_type is MessageType.NOTIFICATION
            lost, _ = await remote.node.send(sid, "hive", "for nobody", metadata={"to": "ghost"})
            entry = await hive.store.inbox_get(lost.message_id)
            assert entry is not None and entry.status == "unread"  # kept, just not bridged
            assert len(reviewer.got) == 1


async def test_what_an_agent_sends_to_the_bridge_is_checked(world: World) -> None:
    client = world.reviewer
    with pytest.raises(ValidationError, match="correlation_id"):
        await client.send("swarm", {"content": "out of the blue"})
    with pytest.raises(ValidationError, match="type"):
        await client.send("swarm", {"content": "x", "swarm_id": world.swarm_id,
                                    "recipient": "remote", "type": "system"})  # fmt: skip
    with pytest.raises(NotFoundError, match="nobody"):
        await client.send("swarm", {"content": "x", "swarm_id": world.swarm_id,
                                    "recipient": "nobody"})  # fmt: skip
    with pytest.raises(UnsupportedMessageTypeError):
        await client.send("swarm", b"\x00\x01", content_type="application/octet-stream")
    # A new conversation names its swarm and recipient; text is sent as it is.
    await client.send("swarm", {"content": "hello from inside", "swarm_id": world.swarm_id,
                                "recipient": "broadcast"})  # fmt: skip
    await until(lambda: _count(world, 1))
    (entry,) = await _inbox(world.remote.store.swarm, world.swarm_id)
    assert (entry.mail.content, entry.mail.recipient_id) == ("hello from inside", "broadcast")


async def test_the_swarm_routes_are_mounted_on_the_coordinator_http_port(world: World) -> None:
    url = f"http://{world.coordinator.http_address}/swarm"
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{url}/info") as response:
            info = await response.json()
        assert (info["agent_id"], info["public_key"]) == ("hive", world.hive.identity.public_key)
        async with session.post(f"{url}/message", data=b"[]") as response:
            assert response.status == 400
            assert (await response.json())["error"]["details"]["field"] == "body"
        async with session.get(f"{url}/health") as response:
            assert (await response.json())["status"] == "healthy"
