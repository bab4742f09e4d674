"""A swarm peer as a service (`open_swarm_peer`, what `apiary swarm serve` runs): its own TLS
listener, /health and /info, and the wake hook, which runs any command with the message's
JSON on stdin and never holds up the request."""

from __future__ import annotations

import json
import shlex
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from apiary.errors import ValidationError
from apiary.server.config.loader import load_config
from apiary.store.memory.store import open_memory_store
from apiary.swarm.courier import RetryPolicy
from apiary.swarm.errors import SwarmFileError
from apiary.swarm.home import NodeConfig, SwarmHome
from apiary.swarm.peer import SwarmPeer, open_swarm_peer
from apiary.swarm.settings import NodeSettings, PeerSettings
from tests.swarm.peers import http, open_peer, until
from tests.swarm.pki import Pki


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@asynccontextmanager
async def _service(
    tmp: Path, pki: Pki, wake: str = "", node_settings: NodeSettings | None = None
) -> AsyncIterator[SwarmPeer]:
    port = _free_port()
    home = SwarmHome(tmp / "service")
    home.init(NodeConfig("service", f"https://127.0.0.1:{port}/swarm", ca_file=str(pki.ca_file)))
    settings = PeerSettings(home.path, f"127.0.0.1:{port}", str(pki.cert_file),
                            str(pki.key_file), wake=wake)  # fmt: skip
    async with (
        open_memory_store() as store,
        open_swarm_peer(settings, store.swarm, node_settings=node_settings) as peer,
    ):
        yield peer


async def test_a_serving_peer_delivers_to_a_member_once_it_is_back(
    tmp_path: Path, pki: Pki
) -> None:
    # What `apiary swarm serve` (and a coordinator with [swarm]) runs retries in the
    # background by itself: no command, no restart.
    quick = NodeSettings(retry_delays=(), retry=RetryPolicy(interval_s=0.05, first_backoff_s=0.1))
    async with _service(tmp_path, pki, node_settings=quick) as peer:
        sid = peer.node.create("builders").swarm_id
        async with open_peer(tmp_path, "away", pki) as away:
            await away.node.join(peer.node.invite(sid).url)
            port = int(away.endpoint.rsplit(":", 1)[1].split("/")[0])
        message, (row,) = await peer.node.send(sid, "away", "ping")
        assert row.status == "retrying"
        async with open_peer(tmp_path, "away", pki, port=port) as back:

            async def delivered() -> bool:
                (now,) = await peer.node.store.outbox_get(message.message_id)
                return now.status == "delivered"

            await until(delivered)
            inbox = await back.store.swarm.list_recent()
            assert [e.mail.content for e in inbox] == ["ping"]


@pytest.mark.conformance("swarm.transport.tls")
async def test_health_and_info_over_tls(tmp_path: Path, pki: Pki) -> None:
    async with _service(tmp_path, pki) as peer:
        assert peer.address is not None and peer.bridge is None
        endpoint = peer.node.config.endpoint
        health = await http(pki, "GET", f"{endpoint}/health")
        assert (health.status, health.body["status"], health.body["agent_id"]) == (
            200, "healthy", "service",
        )  # fmt: skip
        assert health.body["protocol_version"] == "0.1.0"
        info = await http(pki, "GET", f"{endpoint}/info")
        assert info.body["public_key"] == peer.node.identity.public_key
        assert info.body["endpoint"] == endpoint
        assert info.body["capabilities"] == ["message", "system", "notification"]


async def test_the_wake_hook_runs_without_holding_the_request(tmp_path: Path, pki: Pki) -> None:
    out, go = tmp_path / "woken.json", tmp_path / "go"
    # The command waits for `go`, which the test creates only once the POST has answered.
    script = (
        "import pathlib, sys, time\n"
        f"go = pathlib.Path({str(go)!r})\n"
        "while not go.exists(): time.sleep(0.01)\n"
        f"part = pathlib.Path({str(out) + '.part'!r})\n"
        "part.write_text(sys.stdin.read())\n"
        f"part.rename({str(out)!r})\n"  # whole or not at all, for the test's poll
    )
    wake = f"{shlex.quote(sys.executable)} -c {shlex.quote(script)}"
    async with _service(tmp_path, pki, wake) as peer, open_peer(tmp_path, "sender", pki) as sender:
        sid = peer.node.create("wakers").swarm_id
        await sender.node.join(peer.node.invite(sid).url)
        message, (row,) = await sender.node.send(sid, "service", "wake up")
        assert row.status == "delivered"
        assert not out.exists()  # answered while the command still waits
        go.touch()
        await until(out.exists)
        woken = json.loads(out.read_text())
        assert (woken["message_id"], woken["content"]) == (message.message_id, "wake up")
        assert woken["signature"] == message.signature


@pytest.mark.conformance("swarm.transport.tls")
async def test_a_listener_needs_its_certificate(tmp_path: Path, pki: Pki) -> None:
    home = SwarmHome(tmp_path / "service")
    home.init(NodeConfig("service", "https://127.0.0.1:1/swarm"))
    async with open_memory_store() as store:
        with pytest.raises(SwarmFileError, match="cert"):
            async with open_swarm_peer(PeerSettings(home.path, "127.0.0.1:0"), store.swarm):
                pass
        missing = PeerSettings(home.path, "127.0.0.1:0", str(tmp_path / "no.pem"), "k.pem")
        with pytest.raises(SwarmFileError, match="unusable certificate"):
            async with open_swarm_peer(missing, store.swarm):
                pass


def test_the_coordinator_configuration_takes_a_swarm_table(tmp_path: Path) -> None:
    path = tmp_path / "apiary.toml"
    path.write_text(
        '[swarm]\nhome = "/srv/swarm"\nlisten = "0.0.0.0:8443"\ncert = "c.pem"\nkey = "k.pem"\n'
        'bridge_agent = "reviewer"\n'
    )
    swarm = load_config(path, {}, {}).swarm
    assert swarm == PeerSettings(Path("/srv/swarm"), "0.0.0.0:8443", "c.pem", "k.pem",
                                 bridge_agent="reviewer")  # fmt: skip
    assert load_config(None, {}, {}).swarm is None
    for text, field in (
        ('[swarm]\nlisten = "0.0.0.0:8443"\n', "swarm.home"),
        ('[swarm]\nhome = "h"\nlisten = "0.0.0.0:8443"\n', "swarm.cert"),
        ('[swarm]\nhome = "h"\nport = 1\n', "swarm.port"),
        ("[swarm]\nhome = 7\n", "swarm.home"),
        ('[swarm]\nhome = "h"\ninsecure = "yes"\n', "swarm.insecure"),
    ):
        path.write_text(text)
        with pytest.raises(ValidationError) as caught:
            load_config(path, {}, {})
        assert caught.value.details["field"] == field
    # Development: a plain-HTTP listener needs no certificate (served on loopback only).
    path.write_text('[swarm]\nhome = "h"\nlisten = "127.0.0.1:8443"\ninsecure = true\n')
    assert load_config(path, {}, {}).swarm == PeerSettings(
        Path("h"), "127.0.0.1:8443", insecure=True
    )
