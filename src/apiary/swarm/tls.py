"""TLS for the swarm's HTTPS: TLS 1.2 at least (the protocol's requirement), certificates
verified against the system's CAs or a given CA file (a private or development CA).

aiohttp speaks HTTP/1.1 only; ALPN offers "http/1.1" so that clients and proxies negotiating
HTTP/2 fall back cleanly (docs/swarm.md: putting an HTTP/2 or HTTP/3 proxy in front).
"""

from __future__ import annotations

import ssl
from pathlib import Path


def server_context(certificate: Path, key: Path) -> ssl.SSLContext:
    """The listener's context; OSError/ssl.SSLError when the files are unusable."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(certificate, key)
    context.set_alpn_protocols(["http/1.1"])
    return context


def client_context(ca_file: Path | str | None = None) -> ssl.SSLContext:
    """A verifying client context (hostname and chain): the system's CAs, or `ca_file`'s."""
    context = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["http/1.1"])
    return context
