"""TLS on the coordinator's ports (DESIGN.md section 9): the gRPC server's credentials and
the HTTP server's context, from `[server] tls_cert`, `tls_key` and (mTLS) `tls_client_ca`."""

from __future__ import annotations

import ssl

import grpc

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
