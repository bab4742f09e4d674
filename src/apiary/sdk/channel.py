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

from collections.abc import Sequence
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
    target = channel_target(address)
    if chosen_tls is None:
        channel = grpc.aio.insecure_channel(target)
    else:
        channel = grpc.aio.secure_channel(target, chosen_tls.credentials())
    return _MetadataChannel(channel, _Metadata(sources))


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

    def pairs(self, method: str, given: Any) -> Any:
        """The metadata of a call of `method` that was given `given` (None: none)."""
        pairs: list[tuple[str, str | bytes]] = list(given or ())
        before = len(pairs)
        for source in self._sources:
            pairs.extend(source(method, pairs))
        if len(pairs) == before:
            return given
        return grpc.aio.Metadata(*pairs)


class _Call:
    """One method's multi-callable of the channel, its calls' metadata completed first.

    Not a client interceptor: grpc.aio runs an intercepted call behind a queue and a task of
    its own per call and per streamed message (measured here: 90-150 us more CPU per
    message round trip on a stream), where this only adds the metadata."""

    __slots__ = ("_call", "_metadata", "_method")

    def __init__(self, call: Any, method: str, metadata: _Metadata) -> None:
        self._call = call
        self._method = method
        self._metadata = metadata

    def __call__(self, *args: Any, metadata: Any = None, **kwargs: Any) -> Any:
        return self._call(*args, metadata=self._metadata.pairs(self._method, metadata), **kwargs)


class _MetadataChannel(grpc.aio.Channel):  # type: ignore[misc]
    """A channel whose every call carries what `metadata` adds (`open_channel`)."""

    def __init__(self, channel: grpc.aio.Channel, metadata: _Metadata) -> None:
        self._channel = channel
        self._metadata = metadata

    def _wrap(self, method: Any, call: Any) -> _Call:
        name = method.decode() if isinstance(method, bytes) else str(method)
        return _Call(call, name, self._metadata)

    def unary_unary(self, method: Any, *args: Any, **kwargs: Any) -> Any:
        return self._wrap(method, self._channel.unary_unary(method, *args, **kwargs))

    def unary_stream(self, method: Any, *args: Any, **kwargs: Any) -> Any:
        return self._wrap(method, self._channel.unary_stream(method, *args, **kwargs))

    def stream_unary(self, method: Any, *args: Any, **kwargs: Any) -> Any:
        return self._wrap(method, self._channel.stream_unary(method, *args, **kwargs))

    def stream_stream(self, method: Any, *args: Any, **kwargs: Any) -> Any:
        return self._wrap(method, self._channel.stream_stream(method, *args, **kwargs))

    async def __aenter__(self) -> _MetadataChannel:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._channel.close(None)

    async def close(self, grace: float | None = None) -> None:
        await self._channel.close(grace)

    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        return self._channel.get_state(try_to_connect)

    async def wait_for_state_change(self, last_observed_state: grpc.ChannelConnectivity) -> None:
        await self._channel.wait_for_state_change(last_observed_state)

    async def channel_ready(self) -> None:
        await self._channel.channel_ready()
