"""TLS on the coordinator's ports (DESIGN.md section 9): the gRPC server's credentials and
the HTTP server's context, from `[server] tls_cert`, `tls_key` and (mTLS) `tls_client_ca`;
and in cluster mode the credentials a replica reaches the others with (`[cluster]
client_cert` and `client_key`)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import grpc

from apiary.server.config.address import Address
from apiary.server.config.server import ServerConfig


def grpc_credentials(config: ServerConfig) -> grpc.ServerCredentials | None:
    """The gRPC port's TLS credentials; None when TLS is off."""
    if config.tls_cert is None or config.tls_key is None:
        return None
    ca = config.tls_client_ca.read_bytes() if config.tls_client_ca is not None else None
    return grpc.ssl_server_credentials(
        [(config.tls_key.read_bytes(), config.tls_cert.read_bytes())],
        root_certificates=ca,
        require_client_auth=ca is not None,
    )


def http_context(config: ServerConfig) -> ssl.SSLContext | None:
    """The HTTP port's TLS context; None when TLS is off."""
    if config.tls_cert is None or config.tls_key is None:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(config.tls_cert, config.tls_key)
    if config.tls_client_ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(config.tls_client_ca)
    return context


PROBE_S: Final = 2.0
"""How long a diagnosis of a refused handshake waits for the leader (`ReplicaTls.refusal`)."""


@dataclass(frozen=True, slots=True)
class ReplicaTls:
    """How a replica reaches the others over TLS (docs/cluster.md, "The leader"): it trusts
    the certificate it serves itself (so every replica's must be signed alike and name the
    address the replica records), and presents `cert` to a leader that requires client
    certificates (`tls_client_ca`)."""

    root: bytes
    cert: Path
    key: Path
    setting: str
    """Where `cert` was configured, for errors: `cluster.client_cert` or `tls_cert`."""

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.root,
            private_key=self.key.read_bytes(),
            certificate_chain=self.cert.read_bytes(),
        )

    async def refusal(self, address: str) -> str | None:
        """Why the replica at `address` refuses this one's client certificate, or None when
        it takes it or cannot be reached. gRPC reports such a refusal as a closed socket, as
        it does a replica that went away; this handshake, made for the diagnosis only, tells
        them apart: a gRPC server that takes the certificate speaks first (HTTP/2 settings),
        one that refuses it closes the connection (TLS 1.3 judges the client's certificate
        once the handshake completed on the client's side) or fails the handshake (TLS 1.2).
        It does not check the peer's certificate: it sends nothing but its own, which is
        public."""
        target = Address.parse(address, "leader address")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        context.set_alpn_protocols(["h2"])
        context.load_cert_chain(self.cert, self.key)
        try:
            async with asyncio.timeout(PROBE_S):
                reader, writer = await asyncio.open_connection(
                    target.host, target.port, ssl=context, server_hostname=target.host
                )
                try:
                    if not await reader.read(1):
                        return "it closed the connection once it saw the certificate"
                finally:
                    writer.close()
                    with contextlib.suppress(OSError):
                        await writer.wait_closed()
        except ssl.SSLError as exc:
            return f"the TLS handshake failed: {exc.reason or exc}"
        except (OSError, TimeoutError):
            return None
        return None


def replica_tls(config: ServerConfig) -> ReplicaTls | None:
    """How this replica reaches the others; None without TLS (plain channels)."""
    if config.tls_cert is None or config.tls_key is None:
        return None
    cluster = config.cluster
    if cluster.client_cert is not None and cluster.client_key is not None:
        cert, key, setting = cluster.client_cert, cluster.client_key, "cluster.client_cert"
    else:
        cert, key, setting = config.tls_cert, config.tls_key, "tls_cert"
    return ReplicaTls(config.tls_cert.read_bytes(), cert, key, setting)
