"""What the CLI's commands share when they call a coordinator: one way to name it
(`--coordinator`, `COORDINATOR`), a call through an `apiary.Client`, a refusal said the same
way (`apiary <command>: <code>: <message>`, or `cannot reach the coordinator at X`), and
what the calls present (`Presented`): every command takes its credentials from
`ClientCredentials.load()` (sdk/credentials.py), and a refusal as unauthenticated or
permission_denied says whom the command acted as.

The coordinator a command calls is the first of: `--coordinator HOST:PORT`;
`APIARY_COORDINATOR`; the client configuration's profile (`--profile NAME` or
`APIARY_PROFILE`, else its `[client]` table); the address a running `apiary serve` recorded
in the data directory (`APIARY_DATA_DIR`, else `./.apiary`; cli/serving.py); else
127.0.0.1:50051. Every command that takes `--coordinator` takes `--profile` too, and
`--grpc`, the older spelling of `--coordinator`, hidden from help (cli/command_tree.py adds
both)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

import typer

from apiary.cli.command_tree import COORDINATOR_FLAG
from apiary.cli.serving import SERVING_FILE, client_data_dir, recorded
from apiary.core.access.principal import Principal
from apiary.errors import ApiaryError
from apiary.sdk.client import Client
from apiary.sdk.credentials import ARGUMENT, DEFAULT_COORDINATOR, PROFILE_ENV, ClientCredentials
from apiary.sdk.errors import CoordinatorUnreachableError
from apiary.sdk.keys import SIGNING_KEY_ENV
from apiary.server.auth.certificates import principal_from_pem, principal_uri

T = TypeVar("T")
OLD_COORDINATOR_FLAG: Final = "--grpc"
PROFILE_FLAG: Final = "--profile"
DEFAULT_SOURCE: Final = "the default"
_OLD_FLAG_KEY: Final = "apiary.coordinator.old_flag"
"""Where the hidden `--grpc` leaves its value for `--coordinator` (the context's meta)."""


class CoordinatorAddress(str):
    """HOST:PORT of the coordinator a command calls (a `str`), where it came from:
    `--coordinator`, `APIARY_COORDINATOR`, a configuration file (and profile), the record of
    `apiary serve`, or the default; and the client credentials read to choose it, which the
    command's calls present (`credentials_of`), so the configuration is read once."""

    source: str
    credentials: ClientCredentials | None

    def __new__(
        cls, address: str, source: str, credentials: ClientCredentials | None = None
    ) -> CoordinatorAddress:
        made = super().__new__(cls, address)
        made.source = source
        made.credentials = credentials
        return made


def credentials_of(address: str) -> ClientCredentials | None:
    """The credentials read when `address` was chosen (a `CoordinatorAddress`), else None:
    a client given None reads them itself (`ClientCredentials.load()`)."""
    return getattr(address, "credentials", None)


def coordinator_address(
    given: str = "", env: Mapping[str, str] | None = None
) -> CoordinatorAddress:
    """The coordinator to call: `given` (a flag), else the environment, the configuration
    file's profile, the data directory's record of `apiary serve`, else the default. A bad
    address or configuration raises ValidationError naming the setting and its source."""
    credentials = ClientCredentials.load(env, coordinator=given or None)
    if credentials.coordinator:
        source = credentials.sources.get("coordinator", ARGUMENT)
        return CoordinatorAddress(
            credentials.coordinator, COORDINATOR_FLAG if source == ARGUMENT else source,
            credentials,
        )  # fmt: skip
    data_dir = client_data_dir(env)
    serving = recorded(data_dir)
    if serving is not None:
        where = data_dir / SERVING_FILE
        return CoordinatorAddress(
            serving.grpc, f"the address `apiary serve` recorded in {where}", credentials
        )
    return CoordinatorAddress(DEFAULT_COORDINATOR, DEFAULT_SOURCE, credentials)


def coordinator_chosen(ctx: typer.Context, value: str) -> str:
    """The callback of a `--coordinator` option: its value becomes the `CoordinatorAddress`
    chosen; a bad address or configuration ends the command (exit code 2)."""
    if ctx.resilient_parsing:
        return value
    try:
        return coordinator_address(value or ctx.meta.get(_OLD_FLAG_KEY, ""))
    except ApiaryError as exc:
        # `apiary dlq list`, however the program was started (`python -m apiary.cli.main`).
        root = ctx.find_root().command_path
        typer.echo(f"apiary{ctx.command_path.removeprefix(root)}: {exc.message}", err=True)
        raise typer.Exit(2) from None


def _old_flag(ctx: typer.Context, value: str) -> None:
    if value:
        ctx.meta[_OLD_FLAG_KEY] = value


def _profile_chosen(ctx: typer.Context, value: str) -> None:
    """`--profile NAME` is `APIARY_PROFILE=NAME` for the command: every credential it loads
    (and any process it starts) takes that profile; the variable is restored after it."""
    if not value or ctx.resilient_parsing:
        return
    before = os.environ.get(PROFILE_ENV)
    os.environ[PROFILE_ENV] = value

    def restore() -> None:
        if before is None:
            os.environ.pop(PROFILE_ENV, None)
        else:
            os.environ[PROFILE_ENV] = before

    ctx.call_on_close(restore)


COORDINATOR_HELP: Final = (
    "The coordinator to call [else APIARY_COORDINATOR, the client profile's coordinator, "
    "the address `apiary serve` recorded in the data directory (APIARY_DATA_DIR or "
    "./.apiary), else 127.0.0.1:50051]"
)
COORDINATOR = typer.Option(
    "", COORDINATOR_FLAG, metavar="HOST:PORT", callback=coordinator_chosen, help=COORDINATOR_HELP
)
"""The `--coordinator` option of every command that calls a coordinator: its value is the
`CoordinatorAddress` chosen."""
PROFILE = typer.Option(
    "",
    PROFILE_FLAG,
    metavar="NAME",
    is_eager=True,
    expose_value=False,
    callback=_profile_chosen,
    help="The client configuration's profile to use ([profiles.NAME] in "
    "~/.config/apiary/client.toml) [else APIARY_PROFILE, else its [client] table]",
)
"""`--profile`: added beside `--coordinator` by cli/command_tree.py."""
OLD_COORDINATOR = typer.Option(
    "",
    OLD_COORDINATOR_FLAG,
    hidden=True,
    is_eager=True,
    expose_value=False,
    callback=_old_flag,
    help="Deprecated spelling of --coordinator",
)
"""`--grpc`: the older spelling of `--coordinator`, hidden from help."""
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


def described(address: str) -> str:
    """`address` and where it came from, when it is a `CoordinatorAddress`:
    `127.0.0.1:50051 (the default)`, `10.0.0.5:50051 (from APIARY_COORDINATOR)`."""
    source = getattr(address, "source", "")
    if not source:
        return str(address)
    return f"{address} ({source})" if source == DEFAULT_SOURCE else f"{address} (from {source})"


def unreachable(program: str, address: str) -> str:
    """The line of a command whose coordinator did not answer at `address`."""
    line = f"apiary {program}: cannot reach the coordinator at {described(address)}"
    if getattr(address, "source", "") == DEFAULT_SOURCE:
        line += f"; start one with `apiary serve`, or name one with {COORDINATOR_FLAG}"
    return line


def refusal(
    program: str, exc: ApiaryError, *, with_field: bool = True, token: str = "",
    address: str = "",
) -> str:  # fmt: skip
    """The line a refused call prints; the field it names is added when the message does
    not start with it already, and whom the command acted as when it was refused as
    unauthenticated or permission_denied (`token`: the operator token the calls carried).
    A call that never reached the coordinator at `address` says so (`unreachable`)."""
    if address and isinstance(exc, CoordinatorUnreachableError):
        return unreachable(program, address)
    field = exc.details.get("field") if with_field else None
    where = f" (field {field})" if field and not exc.message.startswith(f"{field}:") else ""
    line = f"apiary {program}: {exc.code}: {exc.message}{where}"
    if exc.code in WHO_CODES:
        known = credentials_of(address)
        presented = Presented.load(token) if known is None else Presented.of(known, token)
        line += f" (acting as {presented.acting_as})"
    return line


def run_client(
    program: str, address: str, call: Callable[[Client], Awaitable[T]], *,
    token: str = "", with_field: bool = True,
) -> T:  # fmt: skip
    """`call` with a Client of `address` (as the operator of `token` when given); a refusal
    is printed (`refusal`) and ends the command with exit code 1."""
    metadata = {"authorization": f"Bearer {token}"} if token else None

    async def go() -> T:
        async with Client(address, metadata=metadata, credentials=credentials_of(address)) as c:
            return await call(c)

    try:
        return asyncio.run(go())
    except ApiaryError as exc:
        line = refusal(program, exc, with_field=with_field, token=token, address=address)
        typer.echo(line, err=True)
        raise typer.Exit(1) from None
