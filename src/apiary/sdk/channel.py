"""How clients (agents, `apiary.Client`, every CLI command) reach a coordinator: one gRPC
channel factory, plain or TLS, that presents the client's credentials on every call.

What a client presents comes from one place, `ClientCredentials.load()` (sdk/credentials.py
says where it looks: arguments, then the environment, then `~/.config/apiary/client.toml`).
A coordinator serving TLS (`[server] tls_cert`/`tls_key`, DESIGN.md section 9) is reached
with the CA that signed its certificate, and, when it requires client certificates (mTLS,
`tls_client_ca`), with a certificate and key of the client's own:

    APIARY_TLS_CA=ca.pem                 # trust this CA (TLS on)
    APIARY_TLS_CERT=me.pem APIARY_TLS_KEY=me.key   # present this certificate (mTLS)
    APIARY_API_KEY=apk_...               # every call: authorization: Bearer <key>
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Callable, Sequence
from typing import Any

import grpc

from apiary.sdk.credentials import (
    TLS_CA_ENV,
    TLS_CERT_ENV,
    TLS_KEY_ENV,
    CallMetadata,
    ClientCredentials,
    ClientTls,
)
from apiary.sdk.tracing import call_metadata

__all__ = [
    "TLS_CA_ENV",
    "TLS_CERT_ENV",
    "TLS_KEY_ENV",
    "CallMetadata",
    "ClientCredentials",
    "ClientTls",
    "open_channel",
]


def open_channel(
    address: str,
    tls: ClientTls | None = None,
    credentials: ClientCredentials | None = None,
    *,
    per_call: Sequence[CallMetadata] = (),
) -> grpc.aio.Channel:
    """A channel to `address` presenting `credentials` (default: `ClientCredentials.load()`):
    TLS with `tls`, else the credentials' TLS settings, else plain; with an API key, every
    call carries `authorization: Bearer <key>` unless it sets `authorization` itself.

    `per_call` adds metadata to each call before the key is considered (an agent's per-call
    proofs, `CallProver`): a call that carries a proof does not carry the key too. Every call
    made within a span carries its W3C trace context (sdk/tracing.py)."""
    chosen = credentials if credentials is not None else ClientCredentials.load()
    chosen_tls = tls if tls is not None else chosen.tls
    sources = [*per_call, call_metadata]
    for source in (chosen.tenant_metadata(), chosen.bearer()):
        if source is not None:
            sources.append(source)
    interceptors = _interceptors(sources)
    target = channel_target(address)
    if chosen_tls is None:
        return grpc.aio.insecure_channel(target, interceptors=interceptors)
    return grpc.aio.secure_channel(target, chosen_tls.credentials(), interceptors=interceptors)


def channel_target(address: str) -> str:
    """The gRPC target of `address`: as given, or for several coordinator replicas listed
    `host:port,host:port` (IP literals), an `ipv4:`/`ipv6:` target, which gRPC's default
    pick_first policy connects to in order, moving to the next when one cannot be reached
    (an agent's stream then reconnects and registers there: docs/cluster.md). Replicas known
    by a host name go behind one DNS name that resolves to each of them."""
    if "," not in address or ":/" in address or address.startswith(("ipv4:", "ipv6:", "dns:")):
        return address
    parts = [part.strip() for part in address.split(",") if part.strip()]
    if all(part.startswith("[") for part in parts):
        return "ipv6:" + ",".join(parts)
    if all(_ipv4_with_port(part) for part in parts):
        return "ipv4:" + ",".join(parts)
    raise ValueError(
        f"coordinator: several addresses ({address[:200]!r}) must each be an IP address and "
        "port (127.0.0.1:50051,127.0.0.1:50052); put replicas known by host name behind one "
        "DNS name that resolves to each of them"
    )


def _ipv4_with_port(part: str) -> bool:
    host, _, port = part.rpartition(":")
    numbers = host.split(".")
    return (
        port.isdigit() and len(numbers) == 4
        and all(n.isdigit() and 0 <= int(n) <= 255 for n in numbers)
    )  # fmt: skip


class _Metadata:
    """Adds what `sources` give to the metadata of a call, each source seeing what the ones
    before it added."""

    def __init__(self, sources: Sequence[CallMetadata]) -> None:
        self._sources = tuple(sources)

    def details(self, given: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        method: Any = given.method
        name = method.decode() if isinstance(method, bytes) else str(method)
        pairs: list[tuple[str, str | bytes]] = list(given.metadata or ())
        before = len(pairs)
        for source in self._sources:
            pairs.extend(source(name, pairs))
        if len(pairs) == before:
            return given
        return grpc.aio.ClientCallDetails(
            given.method, given.timeout, grpc.aio.Metadata(*pairs), given.credentials,
            given.wait_for_ready,
        )  # fmt: skip


# grpc.aio files an interceptor under one call kind only, so each kind has its class (the
# ignores: grpc ships no type hints, so its base classes are Any to mypy).


class _UnaryUnary(_Metadata, grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    async def intercept_unary_unary(
        self, continuation: Callable[..., Any], client_call_details: Any, request: Any
    ) -> Any:
        return await continuation(self.details(client_call_details), request)


class _UnaryStream(_Metadata, grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[misc]
    async def intercept_unary_stream(
        self, continuation: Callable[..., Any], client_call_details: Any, request: Any
    ) -> Any:
        return await continuation(self.details(client_call_details), request)


class _StreamUnary(_Metadata, grpc.aio.StreamUnaryClientInterceptor):  # type: ignore[misc]
    async def intercept_stream_unary(
        self,
        continuation: Callable[..., Any],
        client_call_details: Any,
        request_iterator: AsyncIterable[Any] | None,
    ) -> Any:
        return await continuation(self.details(client_call_details), request_iterator)


class _StreamStream(_Metadata, grpc.aio.StreamStreamClientInterceptor):  # type: ignore[misc]
    async def intercept_stream_stream(
        self,
        continuation: Callable[..., Any],
        client_call_details: Any,
        request_iterator: AsyncIterable[Any] | None,
    ) -> Any:
        return await continuation(self.details(client_call_details), request_iterator)


def _interceptors(sources: Sequence[CallMetadata]) -> list[grpc.aio.ClientInterceptor]:
    kinds: tuple[type[_Metadata], ...] = (_UnaryUnary, _UnaryStream, _StreamUnary, _StreamStream)
    return [kind(sources) for kind in kinds]
