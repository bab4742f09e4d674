"""Real swarm peers on 127.0.0.1 for the tests: a home directory each, an in-memory store,
the node, and its HTTPS listener (certificate from the tests' private CA)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from apiary.core.clock import Clock
from apiary.store.memory.store import open_memory_store
from apiary.store.protocols import Store
from apiary.swarm.home import NodeConfig, SwarmHome
from apiary.swarm.node import SwarmNode, open_swarm_node
from apiary.swarm.settings import NodeSettings
from apiary.swarm.transport import bind, open_swarm_server, swarm_app
from tests.swarm.pki import Pki

FAST = NodeSettings(retry_delays=())
"""No delivery retries: a test that refuses a delivery sees it fail at once."""


@dataclass(slots=True)
class Peer:
    node: SwarmNode
    store: Store
    home: SwarmHome

    @property
    def agent_id(self) -> str:
        return self.node.agent_id

    @property
    def endpoint(self) -> str:
        return self.node.config.endpoint

    def members(self, swarm_id: str) -> list[str]:
        state = self.node.state
        if swarm_id not in state.swarms:
            return []
        return sorted(m.agent_id for m in state.swarm(swarm_id).members)


@asynccontextmanager
async def open_peer(
    root: Path, agent_id: str, pki: Pki, *, clock: Clock | None = None,
    settings: NodeSettings = FAST, port: int = 0,
) -> AsyncIterator[Peer]:  # fmt: skip
    """A peer; `port` brings one back where it was (its home, key and swarms are kept)."""
    sock = bind("127.0.0.1", port)
    endpoint = f"https://127.0.0.1:{sock.getsockname()[1]}/swarm"
    home = SwarmHome(root / agent_id)
    home.init(NodeConfig(agent_id, endpoint, ca_file=str(pki.ca_file)))
    async with (
        open_memory_store() as store,
        open_swarm_node(
            home.config(), home.identity(), home.states(), store.swarm, clock=clock,
            settings=settings,
        ) as node,
        open_swarm_server(swarm_app(node), sock, pki.server()),
    ):  # fmt: skip
        yield Peer(node, store, home)


async def until(condition: Callable[[], Any], timeout_s: float = 10.0) -> None:
    """Wait (bounded) until `condition()` (sync, or returning an awaitable) is truthy."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        result = condition()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if loop.time() > deadline:
            raise AssertionError("condition never held")
        await asyncio.sleep(0.01)


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: dict[str, Any]
    headers: dict[str, str]

    @property
    def code(self) -> str:
        return str(self.body.get("error", {}).get("code", ""))

    @property
    def field(self) -> str:
        return str(self.body.get("error", {}).get("details", {}).get("field", ""))


async def http(
    pki: Pki, method: str, url: str, body: object = None, *, raw: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> Answer:  # fmt: skip
    """One request, as any other implementation would make it."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    connector = aiohttp.TCPConnector(ssl=pki.client())
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.request(
            method, url, data=data,
            headers={"Content-Type": "application/json", **(headers or {})},
        ) as response,
    ):  # fmt: skip
        text = await response.read()
        try:
            parsed = json.loads(text) if text else {}
        except ValueError:
            parsed = {"raw": text.decode("utf-8", "replace")}
        return Answer(response.status, parsed, dict(response.headers))
