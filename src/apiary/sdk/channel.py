"""How clients (agents, `apiary.Client`, every CLI command) reach a coordinator: one gRPC
channel factory, plain or TLS.

A coordinator serving TLS (`[server] tls_cert`/`tls_key`, DESIGN.md section 9) is reached
with the CA that signed its certificate, and, when it requires client certificates (mTLS,
`tls_client_ca`), with a certificate and key of the client's own. Either pass a `ClientTls`,
or set the environment for every tool at once:

    APIARY_TLS_CA=ca.pem                 # trust this CA (TLS on)
    APIARY_TLS_CERT=me.pem APIARY_TLS_KEY=me.key   # present this certificate (mTLS)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc

from apiary.errors import ValidationError

TLS_CA_ENV = "APIARY_TLS_CA"
TLS_CERT_ENV = "APIARY_TLS_CERT"
TLS_KEY_ENV = "APIARY_TLS_KEY"


@dataclass(frozen=True, slots=True)
class ClientTls:
    """TLS towards the coordinator: the CA to trust (None: the system's roots) and, for
    mTLS, this client's certificate and key (both or neither)."""

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise ValidationError.for_field(
                "cert" if self.cert is None else "key",
                "a client certificate and its key go together (mTLS needs both)",
            )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ClientTls | None:
        """From APIARY_TLS_CA / APIARY_TLS_CERT / APIARY_TLS_KEY; None when none is set."""
        env = os.environ if env is None else env
        values = {name: env.get(name, "") for name in (TLS_CA_ENV, TLS_CERT_ENV, TLS_KEY_ENV)}
        if not any(values.values()):
            return None
        if bool(values[TLS_CERT_ENV]) != bool(values[TLS_KEY_ENV]):
            missing = TLS_CERT_ENV if not values[TLS_CERT_ENV] else TLS_KEY_ENV
            raise ValidationError.for_field(missing, "is needed too: mTLS takes both")
        ca, cert, key = (Path(v) if v else None for v in values.values())
        return cls(ca, cert, key)

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca, TLS_CA_ENV),
            private_key=_read(self.key, TLS_KEY_ENV),
            certificate_chain=_read(self.cert, TLS_CERT_ENV),
        )


def open_channel(address: str, tls: ClientTls | None = None) -> grpc.aio.Channel:
    """A channel to `address`: TLS with `tls`, else with the environment's TLS settings,
    else plain."""
    chosen = tls if tls is not None else ClientTls.from_env()
    if chosen is None:
        return grpc.aio.insecure_channel(address)
    return grpc.aio.secure_channel(address, chosen.credentials())


def _read(path: Path | None, field: str) -> bytes | None:
    if path is None:
        return None
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ValidationError.for_field(field, f"cannot read {path}: {exc.strerror}") from None
