"""Plain HTTP on loopback for local development (`--insecure`): nodes whose homes were set up
with it federate over http://127.0.0.1; every other node still refuses plain HTTP, and
nothing but a loopback address is ever served or taken that way."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import aiohttp
import pytest
from typer.testing import CliRunner

from apiary.cli.main import app
from apiary.store.memory.store import open_memory_store
from apiary.swarm.errors import SwarmError, SwarmFileError
from apiary.swarm.home import NodeConfig, SwarmHome
from apiary.swarm.node import open_swarm_node
from apiary.swarm.peer import listener_context
from apiary.swarm.settings import PeerSettings
from apiary.swarm.transport import bind, open_swarm_server, swarm_app
from apiary.swarm.wire import check_endpoint, is_loopback_http
from tests.swarm.peers import FAST, Peer, http, open_peer, until
from tests.swarm.pki import Pki

SRC = Path(__file__).resolve().parents[2] / "src"


@asynccontextmanager
async def open_dev_peer(root: Path, agent_id: str) -> AsyncIterator[Peer]:
    """A peer of a home made with --insecure, serving plain HTTP on 127.0.0.1."""
    sock = bind("127.0.0.1", 0)
    endpoint = f"http://127.0.0.1:{sock.getsockname()[1]}/swarm"
    home = SwarmHome(root / agent_id)
    home.init(NodeConfig(agent_id, endpoint, insecure=True))
    async with (
        open_memory_store() as store,
        open_swarm_node(
            home.config(), home.identity(), home.states(), store.swarm, settings=FAST
        ) as node,
        open_swarm_server(swarm_app(node), sock, None),
    ):
        yield Peer(node, store, home)


@pytest.mark.parametrize(
    ("url", "loopback"),
    [
        ("http://127.0.0.1:8443/swarm", True), ("http://127.8.9.10/swarm", True),
        ("http://localhost:1/swarm", True), ("http://[::1]:8443/swarm", True),
        ("http://10.0.0.1:8443/swarm", False), ("http://example.com/swarm", False),
        ("http://127.0.0.1.example.com/swarm", False), ("https://127.0.0.1/swarm", False),
        ("http://[::1/swarm", False), ("ftp://127.0.0.1/swarm", False),
    ],
)  # fmt: skip
def test_what_counts_as_loopback_http(url: str, loopback: bool) -> None:
    assert is_loopback_http(url) is loopback
    if loopback:
        assert check_endpoint(url, "endpoint", insecure=True) == url
        with pytest.raises(SwarmError) as caught:
            check_endpoint(url, "endpoint")
        assert "--insecure" in caught.value.message
    elif not url.startswith("https://"):
        with pytest.raises(SwarmError):
            check_endpoint(url, "endpoint", insecure=True)


def test_a_home_takes_a_loopback_http_endpoint_only_when_insecure(tmp_path: Path) -> None:
    home = SwarmHome(tmp_path / "dev")
    with pytest.raises(SwarmFileError) as caught:
        home.init(NodeConfig("dev", "http://127.0.0.1:8443/swarm"))
    assert caught.value.field == "endpoint" and "--insecure" in str(caught.value)
    with pytest.raises(SwarmFileError):
        home.init(NodeConfig("dev", "http://192.0.2.1:8443/swarm", insecure=True))
    home.init(NodeConfig("dev", "http://127.0.0.1:8443/swarm", insecure=True))
    assert home.config().insecure is True
    assert json.loads(home.config_path.read_text())["insecure"] is True


async def test_development_nodes_federate_over_loopback_http(tmp_path: Path) -> None:
    async with AsyncExitStack() as stack:
        alpha, beta, gamma = [
            await stack.enter_async_context(open_dev_peer(tmp_path, name))
            for name in ("alpha", "beta", "gamma")
        ]
        sid = alpha.node.create("local").swarm_id
        invite = alpha.node.invite(sid)
        assert (await beta.node.join(invite.url)).status == "accepted"
        assert (await gamma.node.join(invite.url)).status == "accepted"
        everyone = ["alpha", "beta", "gamma"]
        await until(lambda: beta.members(sid) == everyone)  # member_joined over plain HTTP
        member = beta.node.state.swarm(sid).member("gamma")
        assert member is not None and member.endpoint == gamma.endpoint
        _, rows = await gamma.node.broadcast(sid, "hello over loopback")
        assert sorted((r.destination, r.status) for r in rows) == [
            ("alpha", "delivered"), ("beta", "delivered"),
        ]  # fmt: skip
        # The state file holds http:// endpoints and still reads back.
        assert beta.home.states().load().swarm(sid).member("gamma") == member


async def test_a_node_not_set_up_for_development_refuses_plain_http(
    tmp_path: Path, pki: Pki
) -> None:
    async with open_dev_peer(tmp_path, "dev") as dev, open_peer(tmp_path, "prod", pki) as prod:
        message = dev.node.courier.compose(
            "550e8400-e29b-41d4-a716-446655440000", "prod", "message", "hi"
        )
        answer = await http(pki, "POST", f"{prod.endpoint}/message", message.to_json())
        assert (answer.status, answer.code, answer.field) == (
            400, "INVALID_FORMAT", "sender.endpoint",
        )  # fmt: skip
        assert "--insecure" in answer.body["error"]["message"]
        # Nor does it join a swarm at a plain-HTTP endpoint.
        sid = dev.node.create("local").swarm_id
        with pytest.raises(SwarmError) as caught:
            await prod.node.join(dev.node.invite(sid).url)
        assert caught.value.code == "INVALID_TOKEN"


def _serve_insecure(home: Path, listen: str) -> subprocess.Popen[str]:
    command = [
        sys.executable, "-m", "apiary.cli.main", "swarm", "serve", "--home", str(home),
        "--listen", listen, "--insecure",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


async def test_swarm_serve_insecure_serves_plain_http_on_loopback(tmp_path: Path) -> None:
    runner = CliRunner()
    home = tmp_path / "dev"
    port = bind("127.0.0.1", 0)
    free = port.getsockname()[1]
    port.close()
    endpoint = f"http://127.0.0.1:{free}/swarm"
    refused = runner.invoke(app, ["swarm", "init", "--agent-id", "dev", "--endpoint", endpoint,
                                  "--home", str(home)])  # fmt: skip
    assert refused.exit_code == 1 and "--insecure" in refused.output
    made = runner.invoke(app, ["swarm", "init", "--agent-id", "dev", "--endpoint", endpoint,
                               "--insecure", "--home", str(home)])  # fmt: skip
    assert made.exit_code == 0, made.output

    bare = runner.invoke(app, ["swarm", "serve", "--home", str(home)])
    assert bare.exit_code == 2 and "--insecure" in bare.output
    for outside in ("0.0.0.0:0", "192.0.2.1:8443", "[::]:0"):
        with pytest.raises(SwarmFileError) as caught:
            listener_context(PeerSettings(home, outside, insecure=True))
        assert caught.value.field == "listen" and "loopback address only" in str(caught.value)

    process = _serve_insecure(home, f"127.0.0.1:{free}")
    try:
        ready = threading.Event()
        lines: list[str] = []

        def read() -> None:
            assert process.stdout is not None
            for line in process.stdout:
                lines.append(line)
                if line.startswith("swarm="):
                    ready.set()

        threading.Thread(target=read, daemon=True).start()
        assert ready.wait(60), lines
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{endpoint}/info") as response,
        ):
            info = await response.json()
        assert (response.status, info["agent_id"], info["endpoint"]) == (200, "dev", endpoint)
    finally:
        process.terminate()
        process.wait(30)
