"""A swarm peer as a running service: the node of a swarm home, its hooks (the SW4RM bridge
when a router is given, the wake command) and, optionally, an HTTPS listener of its own
(plain HTTP on a loopback address for local development, with `insecure`).

`apiary swarm serve` runs one without a router; a coordinator with a [swarm] table runs one
with its router (the bridge) and also mounts the routes on its own HTTP app.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from apiary.core.clock import Clock
from apiary.core.ids import IdGenerator
from apiary.engine.notices import SWARM_BRIDGE, NoticeFactory
from apiary.engine.router.router import Router
from apiary.stopping import stop_tasks
from apiary.store.open import open_store
from apiary.store.protocols import SwarmStore
from apiary.swarm.bridge import SwarmBridge
from apiary.swarm.errors import SwarmFileError
from apiary.swarm.home import SwarmHome
from apiary.swarm.node import SwarmNode, open_swarm_node
from apiary.swarm.settings import NodeSettings, PeerSettings
from apiary.swarm.tls import server_context
from apiary.swarm.transport import bind, open_swarm_server, swarm_app
from apiary.swarm.wake import WakeHook
from apiary.swarm.wire import is_loopback_http
from apiary.system import SystemClock, UuidIds


@dataclass(slots=True)
class SwarmPeer:
    node: SwarmNode
    bridge: SwarmBridge | None = None
    address: tuple[str, int] | None = None
    """Where the listener is bound (None without one)."""


def listener_context(settings: PeerSettings) -> ssl.SSLContext | None:
    """The listener's TLS context; None for a plain-HTTP development listener (`insecure`
    without cert and key), which only a loopback address may serve."""
    if settings.insecure and not settings.cert and not settings.key:
        host, _ = parse_listen(settings.listen)
        if not is_loopback_http(f"http://{_bracketed(host)}/"):
            raise SwarmFileError("listen", f"plain HTTP (--insecure) is served on a loopback "
                                 f"address only, not {host}", "listen")  # fmt: skip
        return None
    if not settings.cert or not settings.key:
        raise SwarmFileError(
            settings.home, "a TLS listener needs cert and key files (or, for local development "
            "on a loopback address, --insecure to serve plain HTTP)", "cert",
        )  # fmt: skip
    try:
        return server_context(Path(settings.cert), Path(settings.key))
    except (OSError, ssl.SSLError) as exc:
        raise SwarmFileError(settings.cert, f"unusable certificate or key: {exc}") from None


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise SwarmFileError("listen", f"must be HOST:PORT, not {text!r}", "listen")
    return host.strip("[]"), int(port)


@asynccontextmanager
async def open_swarm_peer(
    settings: PeerSettings, store: SwarmStore, router: Router | None = None, *,
    clock: Clock | None = None, ids: IdGenerator | None = None,
    node_settings: NodeSettings | None = None, ssl_context: ssl.SSLContext | None = None,
    retries_when: Callable[[], bool] | None = None,
) -> AsyncIterator[SwarmPeer]:  # fmt: skip
    """Run the peer for the duration of the block. `ssl_context` is the client side's (peers'
    certificates); the listener's comes from `settings.cert` and `settings.key`.
    `retries_when`: the outbox's background retries run only while it returns True (a
    cluster's replicas share the outbox: its leader retries it); None: always."""
    clock = clock or SystemClock()
    ids = ids or UuidIds()
    home = SwarmHome(settings.home)
    config = home.config()
    config = replace(
        config, bridge_agent=settings.bridge_agent or config.bridge_agent,
        wake=settings.wake or config.wake,
    )  # fmt: skip
    context = listener_context(settings) if settings.listen else None
    async with AsyncExitStack() as stack:
        node = await stack.enter_async_context(
            open_swarm_node(
                config,
                home.identity(),
                home.states(),
                store,
                clock=clock,
                ids=ids,
                settings=node_settings,
                ssl_context=ssl_context,
            )
        )
        # Unreachable destinations are tried again for as long as the peer serves.
        rounds = node.courier.run(node.endpoint_of, retries_when)
        retries = asyncio.create_task(rounds, name="swarm-retries")
        stack.push_async_callback(_stop, retries)
        bridge = None
        if router is not None:
            notices = NoticeFactory(clock, ids, SWARM_BRIDGE)
            await notices.resume(router.last_sequence)
            bridge = SwarmBridge(node, router, notices, config.bridge_agent)
        if config.wake:
            node.add_hook(WakeHook(node, config.wake))
        address = None
        if settings.listen:
            sock = bind(*parse_listen(settings.listen))
            address = await stack.enter_async_context(
                open_swarm_server(swarm_app(node), sock, context)
            )
        yield SwarmPeer(node, bridge, address)


async def _stop(task: asyncio.Task[None]) -> None:
    await stop_tasks([task], "the swarm peer")


@asynccontextmanager
async def open_home_node(
    home: SwarmHome, *, settings: NodeSettings | None = None
) -> AsyncIterator[SwarmNode]:
    """The node of `home` over its own store (node.json's `store`, else SQLite in the home):
    what the CLI's commands use, next to a running `apiary swarm serve` of the same home."""
    config = home.config()
    async with (
        open_store(config.store or None, home.path) as store,
        open_swarm_node(
            config, home.identity(), home.states(), store.swarm, settings=settings
        ) as node,
    ):
        yield node


@asynccontextmanager
async def open_home_peer(
    settings: PeerSettings, *, node_settings: NodeSettings | None = None
) -> AsyncIterator[SwarmPeer]:
    """`open_swarm_peer` over the home's own store: `apiary swarm serve`."""
    config = SwarmHome(settings.home).config()
    async with (
        open_store(config.store or None, SwarmHome(settings.home).path) as store,
        open_swarm_peer(settings, store.swarm, node_settings=node_settings) as peer,
    ):
        yield peer
