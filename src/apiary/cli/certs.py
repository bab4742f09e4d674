"""`apiary certs dev`: a local CA, a server certificate and client certificates, to try
the secure mode (mTLS) on one machine (DESIGN.md section 9; server/auth/devca.py).

    apiary certs dev --agent worker-1 --operator alice:admin --application ci

Each client certificate names its principal by its apiary:// SAN URI, so the coordinator
needs only the three `[server]` lines the command prints. Running it again over the same
directory adds certificates signed by the same CA.
"""

from __future__ import annotations

import datetime as dt
import json
import shlex
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from apiary.cli.output import console_for_output
from apiary.core.access.principal import DEFAULT_TENANT, Principal, PrincipalKind
from apiary.errors import ValidationError
from apiary.sdk.channel import TLS_CA_ENV, TLS_CERT_ENV, TLS_KEY_ENV
from apiary.server.auth.devca import DEFAULT_HOSTS, DevCertificates, issue_dev_certificates
from apiary.server.config.data_dir import DATA_DIR_ENV, DEFAULT_DATA_DIR

app = typer.Typer(no_args_is_help=True)  # help: cli/main.py SUBCOMMANDS


@app.command()
def dev(
    directory: Path | None = typer.Option(
        None, "--dir", metavar="DIR", help="Where to write them [<data-dir>/certs]"
    ),
    data_dir: Path = typer.Option(
        DEFAULT_DATA_DIR,
        "--data-dir",
        metavar="DIR",
        envvar=DATA_DIR_ENV,
        help="State directory",
    ),
    agent: list[str] = typer.Option(
        [], "--agent", metavar="NAME", help="An agent's name (repeatable)"
    ),
    operator: list[str] = typer.Option(
        [],
        "--operator",
        metavar="NAME[:ROLES]",
        help="NAME[:role,role] (repeatable); the last ':' starts the roles, so a name "
        "with ':' and no roles ends with ':'",
    ),
    application: list[str] = typer.Option(
        [], "--application", metavar="NAME", help="An application's name (repeatable)"
    ),
    tenant: str = typer.Option(
        DEFAULT_TENANT, "--tenant", metavar="TENANT", help="Tenant of every principal"
    ),
    host: list[str] = typer.Option(
        [],
        "--host",
        metavar="HOST",
        help=f"Server DNS name or IP (repeatable; default {', '.join(DEFAULT_HOSTS)})",
    ),
    days: int = typer.Option(
        30, "--days", metavar="N", help="Validity of the certificates, in days"
    ),
) -> None:
    """Make (or reuse) a local CA and issue the server's and each principal's certificate."""
    target = directory if directory is not None else data_dir / "certs"
    try:
        principals = [
            *(Principal(PrincipalKind.AGENT, n, tenant) for n in agent),
            *(_operator(spec, tenant) for spec in operator),
            *(Principal(PrincipalKind.APPLICATION, n, tenant) for n in application),
        ]
        issued = issue_dev_certificates(
            target,
            principals,
            hosts=tuple(host) or DEFAULT_HOSTS,
            days=days,
            now=dt.datetime.now(dt.UTC),
        )
    except ValidationError as exc:
        typer.echo(f"apiary certs dev: {exc.message}", err=True)
        raise typer.Exit(2) from None
    _report(issued)


def _operator(spec: str, tenant: str) -> Principal:
    name, sep, roles = spec.rpartition(":")
    if not sep:
        name, roles = spec, ""
    return Principal(
        PrincipalKind.OPERATOR,
        name,
        tenant,
        frozenset(r.strip() for r in roles.split(",") if r.strip()),
    )


def _report(issued: DevCertificates) -> None:
    console = console_for_output()
    ca = "reused" if not issued.ca_created else "new"
    table = Table(title=escape(f"Certificates in {issued.directory} (CA: {ca})"))
    for column in ("file", "what", "identity"):
        table.add_column(column, overflow="fold")
    rows = [
        (issued.ca_cert, "CA certificate", "tls_client_ca; clients trust it"),
        (issued.ca_key, "CA key (0600)", "keep private"),
        (issued.server_cert, "server certificate", "tls_cert"),
        (issued.server_key, "server key (0600)", "tls_key"),
    ]
    for client in issued.clients:
        kind = client.principal.kind.value
        rows.append((client.cert, f"{kind} certificate", client.uri))
        rows.append((client.key, f"{kind} key (0600)", ""))
    for path, what, identity in rows:
        table.add_row(escape(path.name), what, escape(identity))
    console.print(table)
    typer.echo("\nCoordinator configuration (or --tls-cert, --tls-key, --tls-client-ca):\n")
    typer.echo("[server]")
    for key, path in (
        ("tls_cert", issued.server_cert),
        ("tls_key", issued.server_key),
        ("tls_client_ca", issued.ca_cert),
    ):
        typer.echo(f"{key} = {_toml_string(path)}")
    for client in issued.clients:
        typer.echo(f"\n# clients acting as {client.principal.label}")
        for name, path in (
            (TLS_CA_ENV, issued.ca_cert),
            (TLS_CERT_ENV, client.cert),
            (TLS_KEY_ENV, client.key),
        ):
            typer.echo(f"export {name}={shlex.quote(str(path.absolute()))}")


def _toml_string(path: Path) -> str:
    # A JSON string with non-ASCII kept is a valid TOML basic string.
    return json.dumps(str(path.absolute()), ensure_ascii=False)
