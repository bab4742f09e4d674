"""What the CLI's commands share when they call a coordinator: a call through an
`apiary.Client`, a refusal said the same way (`apiary <command>: <code>: <message>`), and
what the calls present (`Presented`): every command takes its credentials from
`ClientCredentials.load()` (sdk/credentials.py), and a refusal as unauthenticated or
permission_denied says whom the command acted as."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import typer

from apiary.core.access.principal import Principal
from apiary.errors import ApiaryError
from apiary.sdk.client import Client
from apiary.sdk.credentials import ClientCredentials
from apiary.sdk.keys import SIGNING_KEY_ENV
from apiary.server.auth.certificates import principal_from_pem, principal_uri

T = TypeVar("T")
SIGNING_KEY = typer.Option(
    None,
    "--signing-key",
    envvar=SIGNING_KEY_ENV,
    help="Ed25519 key (apiary agent keygen) when the coordinator requires signing",
)
"""The `--signing-key` option of the commands that speak as an agent."""
TOKEN_SOURCE = "--token or APIARY_TOKEN"
WHO_CODES = frozenset({"unauthenticated", "permission_denied"})
"""The refusals whose line says whom the command acted as."""


@dataclass(frozen=True, slots=True)
class Presented:
    """What a command's calls present, as the client knows it (the coordinator has no
    who-am-I call): the credential, where it came from, and the principal when the
    credential itself names one (an apiary:// client certificate)."""

    kind: str
    """api_key, operator_token, client_certificate, none, or unreadable."""
    what: str
    """`API key <key id>`, `client certificate apiary://...`, ...: never a secret."""
    source: str = ""
    key_id: str = ""
    certificate: str = ""
    principal: Principal | None = None
    audience: str = ""

    @classmethod
    def of(cls, credentials: ClientCredentials, token: str = "") -> Presented:
        """What calls with `credentials` present; an operator `token` given for the calls
        (`--token`) wins over their API key."""
        certificate = credentials.client_certificate
        extra: dict[str, Any] = {
            "certificate": str(certificate or ""), "audience": credentials.audience,
        }  # fmt: skip
        if token:
            return cls("operator_token", "an operator token", TOKEN_SOURCE, **extra)
        what, source = credentials.presented()
        if credentials.api_key:
            kind = "api_key" if credentials.key_id else "operator_token"
            return cls(kind, what, source, key_id=credentials.key_id, **extra)
        if certificate is not None:
            principal, named = _certificate_principal(certificate)
            return cls("client_certificate", f"client certificate {named}", source,
                       principal=principal, **extra)  # fmt: skip
        return cls("none", "anonymous, with no credential", **extra)

    @classmethod
    def load(cls, token: str = "") -> Presented:
        """What the calls of a command present, from `ClientCredentials.load()`."""
        try:
            return cls.of(ClientCredentials.load(), token)
        except ApiaryError as exc:
            return cls("unreadable", f"unknown: the credentials cannot be loaded: {exc.message}")

    @property
    def text(self) -> str:
        """One line for people: `API key k3y (from APIARY_API_KEY)`, ..."""
        if self.kind == "none":
            return "none (anonymous; dev mode only)"
        line = f"{self.what} (from {self.source})" if self.source else self.what
        if self.principal is not None:
            line += f"; acts as {self.principal.label}, tenant {self.principal.tenant}"
        return line

    @property
    def acting_as(self) -> str:
        """`API key k3y from APIARY_API_KEY`: the end of a refusal's line."""
        return f"{self.what} from {self.source}" if self.source else self.what

    def to_json(self) -> dict[str, Any]:
        principal = self.principal
        return {
            "presents": self.kind, "text": self.text, "source": self.source,
            "key_id": self.key_id, "certificate": self.certificate,
            "principal": principal.label if principal else None,
            "tenant": principal.tenant if principal else None,
            "audience": self.audience,
        }  # fmt: skip


def _certificate_principal(path: Path) -> tuple[Principal | None, str]:
    """The principal a client certificate names by its apiary:// URI, and how to name the
    certificate (its URI, else the file and why no principal shows)."""
    try:
        principal = principal_from_pem(path.read_bytes(), ())
    except OSError as exc:
        return None, f"{path} (cannot be read: {exc.strerror})"
    except ApiaryError as exc:
        return None, f"{path} ({exc.message})"
    if principal is None:
        return None, f"{path} (no apiary:// URI: the coordinator's [[auth.certificates]] decide)"
    return principal, principal_uri(principal)


def refusal(program: str, exc: ApiaryError, *, with_field: bool = True, token: str = "") -> str:
    """The line a refused call prints; the field it names is added when the message does
    not start with it already, and whom the command acted as when it was refused as
    unauthenticated or permission_denied (`token`: the operator token the calls carried)."""
    field = exc.details.get("field") if with_field else None
    where = f" (field {field})" if field and not exc.message.startswith(f"{field}:") else ""
    line = f"apiary {program}: {exc.code}: {exc.message}{where}"
    if exc.code in WHO_CODES:
        line += f" (acting as {Presented.load(token).acting_as})"
    return line


def run_client(
    program: str, address: str, call: Callable[[Client], Awaitable[T]], *,
    token: str = "", with_field: bool = True,
) -> T:  # fmt: skip
    """`call` with a Client of `address` (as the operator of `token` when given); a refusal
    is printed (`refusal`) and ends the command with exit code 1."""
    metadata = {"authorization": f"Bearer {token}"} if token else None

    async def go() -> T:
        async with Client(address, metadata=metadata) as client:
            return await call(client)

    try:
        return asyncio.run(go())
    except ApiaryError as exc:
        typer.echo(refusal(program, exc, with_field=with_field, token=token), err=True)
        raise typer.Exit(1) from None
