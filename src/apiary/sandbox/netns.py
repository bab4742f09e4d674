"""Inside a fresh network namespace: loopback up, allowlisted addresses on it, their listeners.

EGRESS_RESTRICTED works like this: the launcher resolves each allowlisted host:port in the host
namespace, then (in the tool's new namespace) brings `lo` up, adds every resolved address to it
and listens on address:port there. The listening sockets are handed to the launcher's relay
outside the namespace (SCM_RIGHTS over a socketpair); it accepts on them and connects to the
real destination. The namespace has no other interface and no route, so an address:port that is
not on the allowlist has nothing to answer it: a connect is refused (loopback) or unreachable.
"""

from __future__ import annotations

import errno
import fcntl
import ipaddress
import socket
import struct
from dataclasses import dataclass
from typing import Final

from apiary.core.tools.policy import HostPort

_SIOCGIFFLAGS: Final = 0x8913
_SIOCSIFFLAGS: Final = 0x8914
_IFF_UP: Final = 0x1
_RTM_NEWADDR: Final = 20
_NLMSG_ERROR: Final = 2
_NLM_F_REQUEST_ACK_CREATE: Final = 0x1 | 0x4 | 0x400
_IFA_ADDRESS: Final = 1
_IFA_LOCAL: Final = 2
_IFA_F_NODAD: Final = 0x02
_RT_SCOPE_HOST: Final = 254


@dataclass(frozen=True, slots=True)
class Route:
    """One relayed destination: the tool connects to address:port inside its namespace."""

    host: str
    address: str
    port: int
    candidates: tuple[str, ...]
    """Every address `host` resolved to: the relay tries `address` first, then the others,
    so a name with an unreachable address still connects (the tool's own fallback cannot
    work, since its connect to the listener always succeeds)."""


def resolve(allowlist: tuple[HostPort, ...]) -> list[Route]:
    """Resolve the allowlist in the host namespace; unresolvable names are left out."""
    routes: dict[tuple[str, int], Route] = {}
    for entry in allowlist:
        try:
            infos = socket.getaddrinfo(entry.host, entry.port, type=socket.SOCK_STREAM)
        except OSError:
            continue
        addresses = tuple(dict.fromkeys(str(info[4][0]) for info in infos))
        for address in addresses:
            others = tuple(a for a in addresses if a != address)
            routes.setdefault(
                (address, entry.port), Route(entry.host, address, entry.port, (address, *others))
            )
    return list(routes.values())


def hosts_file(routes: list[Route], original: str) -> str:
    """/etc/hosts for the namespace: the allowlisted names first, so they win."""
    lines = [f"{r.address} {r.host}" for r in routes if not is_ip(r.host)]
    return "\n".join([*lines, original]) if lines else original


def loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sh22x", b"lo", 0)
        flags = struct.unpack("16sh", fcntl.ioctl(sock, _SIOCGIFFLAGS, request)[:18])[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sh22x", b"lo", flags | _IFF_UP))


def add_address(address: str) -> None:
    """Add address/32 (or /128) to lo with rtnetlink; already present is fine."""
    ip = ipaddress.ip_address(address)
    family = socket.AF_INET if ip.version == 4 else socket.AF_INET6
    raw = ip.packed
    body = struct.pack(
        "BBBBI", family, ip.max_prefixlen, _IFA_F_NODAD, _RT_SCOPE_HOST, socket.if_nametoindex("lo")
    )
    for kind in (_IFA_LOCAL, _IFA_ADDRESS):
        body += struct.pack("HH", 4 + len(raw), kind) + raw
    message = struct.pack("IHHII", 16 + len(body), _RTM_NEWADDR, _NLM_F_REQUEST_ACK_CREATE, 1, 0)
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as sock:
        sock.send(message + body)
        reply = sock.recv(4096)
    kind = struct.unpack("IHHII", reply[:16])[1]
    if kind == _NLMSG_ERROR:
        code = -struct.unpack("i", reply[16:20])[0]
        if code not in (0, errno.EEXIST):
            raise OSError(code, f"add {address} to lo")


def listeners(routes: list[Route]) -> list[socket.socket]:
    """Set up lo and one listening socket per route, in the current (new) namespace."""
    loopback_up()
    sockets = []
    for route in routes:
        if not ipaddress.ip_address(route.address).is_loopback:
            add_address(route.address)
        family = socket.AF_INET6 if ":" in route.address else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((route.address, route.port))
        sock.listen(64)
        sockets.append(sock)
    return sockets


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
