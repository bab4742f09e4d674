"""`apiary serve`: run the coordinator until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

import typer

from apiary.errors import ValidationError
from apiary.server.config.loader import checked_serving, load_config
from apiary.server.config.server import ServerConfig, exposure_problem, secured
from apiary.server.coordinator import open_coordinator
from apiary.server.interpreter import tune_for_serving
from apiary.store.errors import SchemaVersionError, StoreOpenError

_STORE_HELP = (
    "Store URL: memory://, sqlite:///PATH.db, postgresql://...; SQLite takes ?synchronous=FULL"
    " and ?writer=process (sqlite:?writer=process for the data dir's file)"
)


def serve(
    data_dir: Path | None = typer.Option(None, "--data-dir", help="State directory [.apiary]"),
    grpc: str | None = typer.Option(None, "--grpc", help="gRPC HOST:PORT [127.0.0.1:50051]"),
    http: str | None = typer.Option(None, "--http", help="HTTP HOST:PORT [127.0.0.1:8080]"),
    store: str | None = typer.Option(None, "--store", help=_STORE_HELP),
    config: Path | None = typer.Option(None, "--config", help="TOML configuration file"),
    log_level: str | None = typer.Option(None, "--log-level", help="DEBUG|INFO|WARNING|ERROR"),
    tls_cert: Path | None = typer.Option(None, "--tls-cert", help="PEM certificate: TLS on"),
    tls_key: Path | None = typer.Option(None, "--tls-key", help="PEM key of --tls-cert"),
    tls_client_ca: Path | None = typer.Option(
        None, "--tls-client-ca", help="Require client certificates from this CA (mTLS)"
    ),
    secure: bool = typer.Option(
        False,
        "--secure",
        help="Secure mode: TLS, authentication, default-deny authorization and message "
        "signing together (docs/security.md)",
    ),
    insecure: bool = typer.Option(
        False,
        "--insecure",
        help="Serve a non-loopback address without TLS, authentication and signing (a "
        "trusted network only)",
    ),
) -> None:
    """Run the coordinator: every SW4RM service on one gRPC port, HTTP on another."""
    flags = {
        "data_dir": str(data_dir) if data_dir else None,
        "grpc": grpc,
        "http": http,
        "store": store,
        "log_level": log_level,
        "tls_cert": str(tls_cert) if tls_cert else None,
        "tls_key": str(tls_key) if tls_key else None,
        "tls_client_ca": str(tls_client_ca) if tls_client_ca else None,
    }
    try:
        settings = load_config(config, os.environ, flags)
        if secure and insecure:
            raise ValidationError("--secure and --insecure contradict each other")
        if secure or settings.auth.secure:
            settings = secured(settings)
        settings = checked_serving(settings)
    except ValidationError as exc:
        typer.echo(f"apiary serve: {exc.message}", err=True)
        raise typer.Exit(2) from None
    problem = exposure_problem(settings, insecure=insecure)
    if problem is not None:
        typer.echo(f"apiary serve: {problem}", err=True)
        raise typer.Exit(2)
    logging.basicConfig(
        level=settings.log_level, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s"
    )
    try:
        asyncio.run(_run(settings))
    except (StoreOpenError, SchemaVersionError) as exc:
        # The store cannot be used as it is: one line naming the file, the cause and the fix.
        typer.echo(f"apiary serve: {exc}", err=True)
        raise typer.Exit(2) from None
    except OSError as exc:
        typer.echo(f"apiary serve: {exc}", err=True)
        raise typer.Exit(1) from None


async def _run(settings: ServerConfig) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with open_coordinator(settings) as coordinator:
        tune_for_serving()
        # Scripts wait for these lines: they are printed only once both ports serve.
        print(f"grpc={coordinator.grpc_address}", flush=True)
        print(f"http={coordinator.http_address}", flush=True)
        await stop.wait()
        print("apiary: shutting down", file=sys.stderr, flush=True)
