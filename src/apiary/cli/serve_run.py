"""`apiary serve` run (cli/serve.py has its options): the coordinator until SIGTERM or SIGINT.

Once both ports serve, it records the addresses in the data directory (cli/serving.py) so
that client commands run there find the coordinator, then prints `grpc=HOST:PORT` and
`http=HOST:PORT` (scripts wait for these lines, and a client started then finds the
record), then a short summary for people (addresses, console, store, mode, data directory,
log); the record is removed when it stops. Logging: cli/serve_log.py.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlsplit

import typer

from apiary import __version__, stopping
from apiary.cli.serve_log import LogFormat, LogTarget, configure_logging
from apiary.cli.serving import Serving, forget, reachable_address, record
from apiary.errors import ValidationError
from apiary.server import stall_report
from apiary.server.config.loader import checked_serving, load_config
from apiary.server.config.server import ServerConfig, exposure_problem, secured
from apiary.server.coordinator import Coordinator, open_coordinator
from apiary.server.interpreter import tune_for_serving
from apiary.store.claim import StoreClaimedError
from apiary.store.errors import SchemaVersionError, StoreOpenError
from apiary.store.open import sqlite_location


def run_serve(
    flags: dict[str, str | None],
    config: Path | None,
    log_format: LogFormat,
    *,
    secure: bool,
    insecure: bool,
    cluster: bool,
) -> None:
    """`apiary serve` with its options read (`flags`: the [server] keys they set)."""
    try:
        settings = load_config(config, os.environ, flags)
        if secure and insecure:
            raise ValidationError("--secure and --insecure contradict each other")
        if secure or settings.auth.secure:
            settings = secured(settings)
        if cluster:
            settings = replace(settings, cluster=replace(settings.cluster, enabled=True))
        settings = checked_serving(settings)
    except ValidationError as exc:
        typer.echo(f"apiary serve: {exc.message}", err=True)
        raise typer.Exit(2) from None
    problem = exposure_problem(settings, insecure=insecure)
    if problem is not None:
        typer.echo(f"apiary serve: {problem}", err=True)
        raise typer.Exit(2)
    log = configure_logging(settings.log_level, settings.data_dir, log_format)
    try:
        # (stopping.run: asyncio.run whose cleanup cannot hang on a task that does not end)
        taken = stopping.run(_run(settings, log, summary=log_format is LogFormat.TEXT))
        stall_report.stopped()
    except (StoreOpenError, SchemaVersionError, StoreClaimedError) as exc:
        # The store cannot be used as it is: one line naming the file, the cause and the fix.
        typer.echo(f"apiary serve: {exc}", err=True)
        raise typer.Exit(2) from None
    except OSError as exc:
        typer.echo(f"apiary serve: {exc}", err=True)
        raise typer.Exit(1) from None
    if taken:
        typer.echo(
            "apiary serve: another coordinator took this one's claim on the store while the "
            "database had dropped its connection; stopped, so that two coordinators never "
            "serve one store (the log names the other)",
            err=True,
        )
        raise typer.Exit(2)


async def _run(settings: ServerConfig, log: LogTarget, *, summary: bool) -> bool:
    """Serve until SIGTERM or SIGINT; True when it stopped because another coordinator took
    the store's claim."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    stall_report.report_on_signal(loop)
    async with open_coordinator(settings) as coordinator:
        tune_for_serving()
        grpc_at, http_at = coordinator.grpc_address, coordinator.http_address
        serving = Serving(
            reachable_address(grpc_at.host, grpc_at.port),
            reachable_address(http_at.host, http_at.port),
            os.getpid(),
            settings.tls_cert is not None,
        )
        try:
            recorded = f"address recorded in {record(settings.data_dir, serving)}"
        except OSError as exc:
            recorded = f"address not recorded: {exc.strerror or exc}"
        try:
            # Scripts wait for these lines: they are printed only once both ports serve and
            # the address is recorded (a client command started on them finds it).
            print(f"grpc={grpc_at}", flush=True)
            print(f"http={http_at}", flush=True)
            if summary:
                print("\n".join(summary_lines(coordinator, serving, log, recorded)), flush=True)
            signalled = asyncio.ensure_future(stop.wait())
            taken = asyncio.ensure_future(coordinator.claim_taken.wait())
            lost = asyncio.ensure_future(coordinator.leadership_lost.wait())
            await asyncio.wait({signalled, taken, lost}, return_when=asyncio.FIRST_COMPLETED)
            for waiter in (signalled, taken, lost):
                waiter.cancel()
        finally:
            forget(settings.data_dir, serving.pid)
        print("apiary: shutting down", file=sys.stderr, flush=True)
        stall_report.report_if_stopping_slowly()
    if coordinator.leadership_lost.is_set():
        print(
            "apiary serve: this replica's term as the cluster's leader ran out before it was "
            "renewed (the database was out of reach?); stopped, so that two replicas never "
            "lead at once: start it again",
            file=sys.stderr, flush=True,
        )  # fmt: skip
        raise SystemExit(2)
    return coordinator.claim_taken.is_set()


def summary_lines(
    coordinator: Coordinator, serving: Serving, log: LogTarget, recorded: str
) -> list[str]:
    """What `apiary serve` tells a person once it serves."""
    settings = coordinator.config
    where = f"{log.file}" if log.file is not None else f"stderr ({log.problem})"
    node = coordinator.cluster
    cluster = (
        []
        if node is None
        else [
            f"  cluster   replica {node.keeper.replica_id} ({node.keeper.settings.partitions} "
            f"partitions, lease {node.keeper.settings.lease_s:g} s; `apiary cluster status`)"
        ]
    )
    return [
        f"Apiary {__version__} is serving:",
        f"  gRPC      {serving.grpc}",
        f"  HTTP      {serving.http_url}",
        f"  console   {serving.console_url}",
        f"  store     {_store_text(settings, coordinator.store.backend)}",
        f"  mode      {_mode_text(settings)}",
        *cluster,
        f"  data dir  {settings.data_dir} ({recorded})",
        f"  log       {where}",
        "Client commands run with this data directory find it (try `apiary status`). "
        "Ctrl-C stops it.",
    ]


def _store_text(settings: ServerConfig, backend: str) -> str:
    """The store, never with a password a URL may hold."""
    if backend == "memory":
        return "memory (nothing is kept after it stops)"
    if backend == "postgresql":
        # The hosts as written, ports not parsed: a URL may name several (h1:5432,h2:5433).
        parts = urlsplit(settings.store)
        hosts = parts.netloc.rpartition("@")[2] or "localhost"
        return f"PostgreSQL {hosts}{parts.path}"
    path, _ = sqlite_location(settings.store, settings.data_dir)
    return f"SQLite {path}"


def _mode_text(settings: ServerConfig) -> str:
    if settings.auth.secure:
        return "secure: TLS, authentication, default-deny authorization, message signing"
    tls = "TLS" if settings.tls_cert is not None else "no TLS"
    return f"development: {tls}, calls without credentials are allowed"
