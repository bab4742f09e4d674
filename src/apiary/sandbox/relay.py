"""The launcher's egress relay for EGRESS_RESTRICTED, running outside the tool's namespace.

It owns the listening sockets the tool's namespace created (one per allowlisted address:port)
and, for every connection accepted there, connects to that same address:port from the host
namespace and copies bytes both ways. It runs on asyncio in the launcher's only thread: the
launcher has entered a new PID namespace for its children, and Linux refuses new threads to
such a process. Addresses are IP literals, so asyncio never needs its resolver threads either.
The relay lives exactly as long as the launcher, which exits when the tool does.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
from collections.abc import Awaitable, Callable
from typing import Final

from apiary.sandbox.netns import Route

_CONNECT_TIMEOUT_S: Final = 10.0
_CHUNK: Final = 65536


def relay_until_exit(
    child: int,
    routes: list[Route],
    listeners: list[socket.socket],
    forward: Callable[[int, int], None],
    signals: tuple[signal.Signals, ...],
) -> int:
    """Relay until `child` exits; forward `signals` to it meanwhile; return its wait status.

    `signals` may be blocked on entry (held since the tool started): they are unblocked once
    the forwarding is in place, which delivers any that are pending."""
    loop = asyncio.new_event_loop()
    for signum in signals:
        loop.add_signal_handler(signum, forward, child, signum)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)
    loop.run_until_complete(_serve(child, routes, listeners))
    return os.waitpid(child, os.WNOHANG)[1]  # it has exited (its pidfd was readable)


async def _serve(child: int, routes: list[Route], listeners: list[socket.socket]) -> None:
    loop = asyncio.get_running_loop()
    servers = []
    for route, listener in zip(routes, listeners, strict=True):
        servers.append(await asyncio.start_server(_bridge_to(route), sock=listener))
    exited = asyncio.Event()
    pidfd = os.pidfd_open(child)
    loop.add_reader(pidfd, exited.set)
    await exited.wait()
    loop.remove_reader(pidfd)
    os.close(pidfd)
    for server in servers:
        server.close()


def _bridge_to(
    route: Route,
) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
    async def bridge(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _bridge(reader, writer, route)

    return bridge


async def _bridge(
    inner_r: asyncio.StreamReader, inner_w: asyncio.StreamWriter, route: Route
) -> None:
    for address in route.candidates:  # IP literals: asyncio needs no resolver thread
        try:
            async with asyncio.timeout(_CONNECT_TIMEOUT_S):
                outer_r, outer_w = await asyncio.open_connection(address, route.port)
            break
        except (OSError, TimeoutError):
            continue
    else:
        # The tool's connect already succeeded inside its namespace; a reset is the closest
        # thing to "refused" it can still see.
        inner_w.transport.abort()
        return
    await asyncio.gather(_pump(inner_r, outer_w), _pump(outer_r, inner_w))
    for writer in (inner_w, outer_w):
        writer.close()


async def _pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    try:
        while data := await source.read(_CHUNK):
            sink.write(data)
            await sink.drain()
    except ConnectionError:
        pass
    with contextlib.suppress(OSError):
        if sink.can_write_eof():
            sink.write_eof()
