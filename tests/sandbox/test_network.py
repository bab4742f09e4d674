"""Network policies enforced on real processes (RFC 18.5.2).

Every probe runs inside the sandbox and reports what it could do; the host side of each test
(echo servers on 127.0.0.1 in the host's namespace) shows the same thing is reachable from
outside, so a failure inside is the sandbox's doing.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Sequence

import pytest

from apiary.core.tools.policy import ExecutionPolicy, HostPort, NetworkPolicy, PrivilegeLevel
from apiary.errors import PermissionDeniedError
from apiary.sandbox import Outcome, SandboxSpec, run, start, wrap_argv
from tests.sandbox.conftest import lines, python, requires_root

pytestmark = requires_root

CONNECT = """
import socket, sys
def attempt(host, port):
    try:
        with socket.create_connection((host, int(port)), timeout=1) as s:
            s.sendall(b"ping")
            return "reply:" + s.recv(100).decode()
    except OSError as exc:
        return type(exc).__name__ + ":" + str(exc.errno)
for arg in sys.argv[1:]:
    host, _, port = arg.rpartition(":")
    print(arg, attempt(host.strip("[]"), port))
"""


def _connect_from_host(port: int) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
        sock.sendall(b"ping")
        return "reply:" + sock.recv(100).decode()


def _targets(*ports: int, host: str = "127.0.0.1") -> list[str]:
    return [f"{host}:{port}" for port in ports]


@pytest.mark.conformance(
    "tool.network.deny-all-blocks",
    "tool.network.deny-all-untrusted",
    "tool.security.deny-by-default",
)
async def test_deny_all_is_the_default_and_reaches_nothing(echo_ports: Sequence[int]) -> None:
    probe = (
        CONNECT
        + """
print("interfaces", ",".join(name for _, name in socket.if_nameindex()))
try:
    socket.getaddrinfo("example.com", 443)
    print("resolve ok")
except OSError as exc:
    print("resolve", type(exc).__name__)
"""
    )
    port = echo_ports[0]
    assert await asyncio.to_thread(_connect_from_host, port) == "reply:ping"  # from the host

    result = await run(SandboxSpec(python(probe, *_targets(port)), ExecutionPolicy()))

    seen = lines(result.stdout)
    assert result.outcome is Outcome.OK, result.stderr
    assert seen[f"127.0.0.1:{port}"] == "OSError:101"  # ENETUNREACH: no network at all
    assert seen["interfaces"] == "lo"  # and lo is down
    assert seen["resolve"] == "gaierror"


@pytest.mark.conformance("tool.network.deny-all-blocks")
async def test_deny_all_accepts_nothing_from_outside() -> None:
    # Hold a port in the host's namespace without listening on it, let the tool listen on the
    # same port inside its namespace, and connect from the host: nothing reaches the tool.
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    port = holder.getsockname()[1]
    probe = f"""
import socket
server = socket.create_server(("127.0.0.1", {port}))
print("listening", flush=True)
server.settimeout(5)
conn, _ = server.accept()
print("accepted", flush=True)
"""
    process = await start(SandboxSpec(python(probe), ExecutionPolicy()))
    async for chunk in process.chunks():
        if b"listening" in chunk:
            break

    with pytest.raises(ConnectionRefusedError):
        await asyncio.to_thread(socket.create_connection, ("127.0.0.1", port), 1)

    await process.cancel(grace_s=0)
    result = await process.wait()
    holder.close()
    assert result.stdout == b"listening\n"


@pytest.mark.conformance("tool.network.allowlist")
async def test_egress_restricted_reaches_only_the_allowlisted_port(
    echo_ports: Sequence[int],
) -> None:
    allowed, other = echo_ports
    policy = ExecutionPolicy(
        network=NetworkPolicy.EGRESS_RESTRICTED,
        allowlist=(HostPort("127.0.0.1", allowed), HostPort("localhost", allowed)),
    )
    targets = [*_targets(allowed, other), f"localhost:{allowed}", f"localhost:{other}"]
    assert await asyncio.to_thread(_connect_from_host, other) == "reply:ping"  # from the host

    result = await run(SandboxSpec(python(CONNECT, *targets), policy))

    seen = lines(result.stdout)
    assert seen[f"127.0.0.1:{allowed}"] == "reply:ping"
    assert seen[f"localhost:{allowed}"] == "reply:ping"  # the name resolves to the relay
    assert seen[f"127.0.0.1:{other}"] == "ConnectionRefusedError:111"
    assert seen[f"localhost:{other}"] == "ConnectionRefusedError:111"


def _non_loopback_ipv4() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent; this only picks a route
        except OSError:
            return None
        address = str(probe.getsockname()[0])
    return None if address.startswith("127.") else address


@pytest.mark.conformance("tool.network.allowlist")
async def test_egress_restricted_relays_an_address_that_is_not_loopback() -> None:
    # The allowlisted address is added to lo inside the namespace; the relay connects out.
    address = _non_loopback_ipv4()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    server = await asyncio.start_server(_echo_once, address, 0)
    port = server.sockets[0].getsockname()[1]
    policy = ExecutionPolicy(
        network=NetworkPolicy.EGRESS_RESTRICTED, allowlist=(HostPort(address, port),)
    )

    result = await run(SandboxSpec(python(CONNECT, f"{address}:{port}", f"{address}:1"), policy))

    server.close()
    seen = lines(result.stdout)
    assert seen[f"{address}:{port}"] == "reply:ping"
    assert seen[f"{address}:1"] == "ConnectionRefusedError:111"


async def _echo_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(await reader.read(100))
    await writer.drain()
    writer.close()


async def test_an_allowlist_entry_without_a_port_fails_closed() -> None:
    policy = ExecutionPolicy(
        network=NetworkPolicy.EGRESS_RESTRICTED, allowlist=(HostPort("example.com"),)
    )

    with pytest.raises(PermissionDeniedError, match="EGRESS_RESTRICTED"):
        await start(SandboxSpec(["true"], policy))
    with pytest.raises(PermissionDeniedError):
        wrap_argv(["true"], policy)


async def test_egress_unrestricted_connects_out_but_cannot_listen(
    echo_ports: Sequence[int],
) -> None:
    probe = (
        CONNECT
        + """
try:
    socket.create_server(("127.0.0.1", 0))
    print("listen ok")
except OSError as exc:
    print("listen", exc.errno)
"""
    )
    policy = ExecutionPolicy(network=NetworkPolicy.EGRESS_UNRESTRICTED)

    result = await run(SandboxSpec(python(probe, *_targets(echo_ports[0])), policy))

    seen = lines(result.stdout)
    assert seen[f"127.0.0.1:{echo_ports[0]}"] == "reply:ping"
    assert seen["listen"] == "1"  # EPERM: inbound TCP is refused by refusing listen(2)


async def test_full_access_accepts_inbound_connections() -> None:
    probe = """
import socket
server = socket.create_server(("127.0.0.1", 0))
print(server.getsockname()[1], flush=True)
conn, _ = server.accept()
conn.sendall(conn.recv(100))
"""
    policy = ExecutionPolicy(
        network=NetworkPolicy.FULL_ACCESS, privilege=PrivilegeLevel.PRIVILEGED, budget_wall_ms=5000
    )
    process = await start(SandboxSpec(python(probe), policy))
    port = int(await anext(aiter(process.chunks())))

    assert await asyncio.to_thread(_connect_from_host, port) == "reply:ping"
    assert (await process.wait()).outcome is Outcome.OK
