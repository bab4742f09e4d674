"""Network addresses in the configuration: HOST:PORT, and which hosts are loopback."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from apiary.errors import ValidationError


@dataclass(frozen=True, slots=True)
class Address:
    host: str
    port: int

    @classmethod
    def parse(cls, text: str, field: str) -> Address:
        """'HOST:PORT' (IPv6 hosts in brackets); port 0 asks for a free port."""
        host, sep, port = text.rpartition(":")
        if not sep or not host or not port.isdigit() or int(port) > 65535:
            raise ValidationError(
                f"{field} must be HOST:PORT with a port 0-65535, not {text!r}", {"field": field}
            )
        return cls(host.strip("[]"), int(port))

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def is_loopback_host(host: str) -> bool:
    """127.0.0.0/8, ::1 or localhost."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
