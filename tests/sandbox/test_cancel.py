"""Cancellation: partial output, and nothing left behind (RFC 18.6)."""

from __future__ import annotations

import asyncio
import glob
import os
import signal
import tempfile
from collections.abc import Sequence

import pytest

from apiary.core.tools.policy import ExecutionPolicy, HostPort, NetworkPolicy, PrivilegeLevel
from apiary.errors import CallCancelledError
from apiary.sandbox import Outcome, SandboxedProcess, SandboxSpec, error_for, run, start
from apiary.sandbox.mounts import PRIVATE_WORKDIR
from apiary.sandbox.proctree import descendants
from tests.sandbox.conftest import alive, python, requires_root

pytestmark = requires_root

TICKER = """
import itertools, os, sys, time
print("cwd", os.getcwd(), flush=True)
for n in itertools.count():
    print("tick", n, flush=True)
    time.sleep(0.02)
"""


async def _read_until(process: SandboxedProcess, needle: bytes) -> bytes:
    seen = b""
    async for chunk in process.chunks():
        seen += chunk
        if needle in seen:
            break
    return seen


def _temp_dirs() -> set[str]:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "apiary-sandbox-*")))


async def _cancel_and_check(process: SandboxedProcess, *, grace_s: float) -> bytes:
    """Cancel, then show the partial result and that no process of the tree survived."""
    tree = [process.pid, *descendants(process.pid)]
    assert len(tree) >= 2  # the launcher and the tool (and PID 1 when confined)

    await process.cancel(grace_s=grace_s)
    result = await process.wait()

    assert result.outcome is Outcome.CANCELLED
    assert b"tick 2" in result.stdout  # the partial result is kept
    assert not [pid for pid in tree if alive(pid)]
    error = error_for(result)
    assert isinstance(error, CallCancelledError)
    assert error.details["partial_result"] == "true"
    return result.stdout


async def test_cancel_keeps_partial_output_and_kills_the_tree() -> None:
    before = _temp_dirs()
    process = await start(SandboxSpec(python(TICKER), ExecutionPolicy()))
    await _read_until(process, b"tick 2\n")

    stdout = await _cancel_and_check(process, grace_s=2.0)

    assert stdout.startswith(f"cwd {PRIVATE_WORKDIR}\n".encode())  # in the private tmpfs
    assert _temp_dirs() == before


async def test_cancel_removes_the_private_temporary_directory() -> None:
    # ELEVATED and PRIVILEGED without a cwd work in a real temporary directory on the host.
    before = _temp_dirs()
    policy = ExecutionPolicy(privilege=PrivilegeLevel.PRIVILEGED, network=NetworkPolicy.FULL_ACCESS)
    process = await start(SandboxSpec(python(TICKER), policy))
    seen = await _read_until(process, b"tick 2\n")
    workdir = seen.split(b"\n")[0].split()[1].decode()
    assert workdir in _temp_dirs() - before

    await _cancel_and_check(process, grace_s=2.0)

    assert _temp_dirs() == before  # the working directory is gone


async def test_cancel_stops_the_relay(echo_ports: Sequence[int]) -> None:
    policy = ExecutionPolicy(
        network=NetworkPolicy.EGRESS_RESTRICTED, allowlist=(HostPort("127.0.0.1", echo_ports[0]),)
    )
    process = await start(SandboxSpec(python(TICKER), policy))
    await _read_until(process, b"tick 2\n")
    relay = process.pid  # the launcher holds the relay's sockets
    sockets = [fd for fd in os.listdir(f"/proc/{relay}/fd") if _is_socket(relay, fd)]
    assert sockets

    await _cancel_and_check(process, grace_s=2.0)

    assert not alive(relay)


def _is_socket(pid: int, fd: str) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
    except OSError:
        return False


@pytest.mark.parametrize(
    "network", [NetworkPolicy.DENY_ALL, NetworkPolicy.EGRESS_RESTRICTED], ids=["plain", "relay"]
)
async def test_a_cancel_right_after_start_reaches_the_tool(
    network: NetworkPolicy, echo_ports: Sequence[int]
) -> None:
    # A cancel may come before the launcher has its forwarding in place (with the relay it
    # still imports asyncio then). The launcher is stopped as soon as start() returns and
    # resumed with the SIGTERM pending: the signal must reach the tool, not kill the launcher
    # (which would leave the tool to a SIGKILL and its PID 1 exiting after the launcher).
    allow = (
        (HostPort("127.0.0.1", echo_ports[0]),)
        if network is NetworkPolicy.EGRESS_RESTRICTED
        else ()
    )
    graceful = (  # the handler writes with os.write: print may be inside print already
        "import os, signal, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: (os.write(1, b'graceful\\n'), os._exit(3)))\n"
        "print('ready', flush=True)\n"
        "time.sleep(30)\n"
    )
    process = await start(
        SandboxSpec(python(graceful), ExecutionPolicy(network=network, allowlist=allow))
    )
    os.kill(process.pid, signal.SIGSTOP)
    await _read_until(process, b"ready\n")
    os.kill(process.pid, signal.SIGTERM)  # what cancel() sends first
    os.kill(process.pid, signal.SIGCONT)

    result = await process.wait()

    assert b"graceful" in result.stdout
    assert result.exit_code == 3


async def test_a_tool_that_ignores_sigterm_is_killed_after_the_grace_period() -> None:
    stubborn = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" + TICKER
    process = await start(SandboxSpec(python(stubborn), ExecutionPolicy()))
    await _read_until(process, b"tick 2\n")

    loop = asyncio.get_running_loop()
    began = loop.time()
    await _cancel_and_check(process, grace_s=0.2)

    assert 0.2 <= loop.time() - began < 1.0


async def test_background_processes_die_with_the_tool() -> None:
    # DEFAULT may spawn; a daemon that detaches (new session, double fork) still goes when
    # the tool exits: it cannot leave the tool's PID namespace.
    daemon = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        print(os.getpid(), flush=True)\n"
        "        time.sleep(30)\n"
        "    os._exit(0)\n"
        "os.wait()\n"
        "time.sleep(0.2)\n"
    )
    policy = ExecutionPolicy(privilege=PrivilegeLevel.DEFAULT)
    process = await start(SandboxSpec(python(daemon), policy))
    await _read_until(process, b"\n")
    tree = descendants(process.pid)
    assert len(tree) >= 3  # PID 1, the tool, the detached daemon

    result = await process.wait()

    assert result.outcome is Outcome.OK
    assert not [pid for pid in tree if alive(pid)]


async def test_cancel_after_the_end_changes_nothing() -> None:
    process = await start(SandboxSpec(["true"], ExecutionPolicy()))
    first = await process.wait()

    await process.cancel()

    assert (await process.wait()) == first
    assert first.outcome is Outcome.OK


async def test_cancelling_run_kills_the_process() -> None:
    # Processes of earlier tests still winding down are not this run's.
    earlier = set(descendants(os.getpid()))
    task = asyncio.ensure_future(run(SandboxSpec(python(TICKER), ExecutionPolicy())))
    tree: list[int] = []
    for _ in range(200):  # until the launcher, PID 1 and the tool are all up (at most 2 s)
        await asyncio.sleep(0.01)
        tree = [pid for pid in descendants(os.getpid()) if pid not in earlier]
        if len(tree) >= 3:
            break
    assert len(tree) >= 3

    task.cancel()
    await asyncio.gather(task, return_exceptions=True)

    assert task.cancelled()
    assert not [pid for pid in tree if alive(pid)]
