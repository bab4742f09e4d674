"""`apiary serve`: its options. What it runs is in cli/serve_run.py, imported only when it
runs: the coordinator takes 2.5 s to import, which `apiary serve --help` does not need."""

from __future__ import annotations

from pathlib import Path

import typer

from apiary.cli.serve_log import LogFormat

_STORE_HELP = (
    "Store URL: memory://, sqlite:///PATH.db, postgresql://...; SQLite takes ?synchronous=FULL"
    " and ?writer=loop|thread|process (sqlite:?writer=process for the data dir's file)"
)


def serve(
    data_dir: Path | None = typer.Option(None, "--data-dir", help="State directory [.apiary]"),
    grpc: str | None = typer.Option(None, "--grpc", help="gRPC HOST:PORT [127.0.0.1:50051]"),
    http: str | None = typer.Option(None, "--http", help="HTTP HOST:PORT [127.0.0.1:8080]"),
    store: str | None = typer.Option(None, "--store", help=_STORE_HELP),
    config: Path | None = typer.Option(None, "--config", help="TOML configuration file"),
    log_level: str | None = typer.Option(
        None, "--log-level", metavar="LEVEL", help="DEBUG, INFO, WARNING or ERROR [INFO]"
    ),
    log_format: LogFormat = typer.Option(
        LogFormat.TEXT,
        "--log-format",
        help="text: a summary on the terminal, the log in DATA_DIR/apiary.log; json: every "
        "log line (events as JSON) on stderr",
    ),
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
    cluster: bool = typer.Option(
        False,
        "--cluster",
        help="Cluster mode ([cluster] enabled): one of several replicas sharing a "
        "PostgreSQL store (docs/cluster.md)",
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
    from apiary.cli.serve_run import run_serve  # noqa: PLC0415 - the coordinator: see above

    run_serve(flags, config, log_format, secure=secure, insecure=insecure, cluster=cluster)
