"""Shared helpers for the sandbox tests: real subprocesses, real namespaces.

The namespaces need root (CI runs as root); elsewhere the tests that need them are skipped
with the reason shown. Every test keeps its own budget well under two seconds.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Sequence

import pytest

requires_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="the sandbox's namespaces need root here (CI runs as root)"
)


def python(code: str, *args: str) -> list[str]:
    """argv running `code` in this interpreter (also reachable by the sandbox's user)."""
    return [sys.executable, "-c", code, *args]


def lines(stdout: bytes) -> dict[str, str]:
    """'key value' lines printed by a probe, as a dict."""
    out = {}
    for line in stdout.decode().splitlines():
        key, _, value = line.partition(" ")
        out[key] = value
    return out


def alive(pid: int) -> bool:
    """Whether `pid` is a live process (not gone, not a zombie, not dead and being released)."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            return file.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(await reader.read(100))
    await writer.drain()
    writer.close()


@pytest.fixture
async def echo_ports() -> AsyncIterator[Sequence[int]]:
    """Two echo servers on 127.0.0.1 in the host's network namespace."""
    servers = [await asyncio.start_server(_echo, "127.0.0.1", 0) for _ in range(2)]
    yield [server.sockets[0].getsockname()[1] for server in servers]
    for server in servers:
        server.close()
        await server.wait_closed()
