"""A private CA and a certificate for 127.0.0.1 and localhost signed by it, made for the tests
by the development CA that `apiary certs dev` uses (what docs/swarm.md walks through with
openssl for development)."""

from __future__ import annotations

import datetime as dt
import ssl
from dataclasses import dataclass
from pathlib import Path

from apiary.core.access.principal import Principal, PrincipalKind
from apiary.server.auth.devca import issue_dev_certificates
from apiary.swarm.tls import client_context, server_context


@dataclass(frozen=True, slots=True)
class Pki:
    ca_file: Path
    cert_file: Path
    key_file: Path
    client_cert: Path
    """A client certificate naming the agent `alice` (for mutual TLS)."""
    client_key: Path

    def server(self) -> ssl.SSLContext:
        return server_context(self.cert_file, self.key_file)

    def client(self) -> ssl.SSLContext:
        return client_context(self.ca_file)


def make_pki(directory: Path) -> Pki:
    issued = issue_dev_certificates(
        directory, [Principal(PrincipalKind.AGENT, "alice")], hosts=("localhost", "127.0.0.1"),
        days=1, now=dt.datetime.now(dt.UTC),
    )  # fmt: skip
    (alice,) = issued.clients
    return Pki(issued.ca_cert, issued.server_cert, issued.server_key, alice.cert, alice.key)
