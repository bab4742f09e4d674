"""`apiary agent run module:Class`: run one agent (an `apiary.Agent` subclass) in this process."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import signal
import sys
from pathlib import Path

import typer

from apiary.cli.calls import (
    COORDINATOR,
    COORDINATOR_HELP,
    SIGNING_KEY,
    Presented,
    coordinator_chosen,
    credentials_of,
    described,
    run_client,
    unreachable,
)
from apiary.cli.command_tree import COORDINATOR_FLAG
from apiary.core.access.principal import DEFAULT_TENANT
from apiary.errors import ApiaryError
from apiary.sdk.agent import Agent
from apiary.sdk.client import Client
from apiary.sdk.credentials import ClientCredentials
from apiary.sdk.errors import CoordinatorUnreachableError
from apiary.sdk.keys import load_signing_key, public_key_text, write_signing_key
from apiary.wire import pb

app = typer.Typer(no_args_is_help=True)  # help: cli/main.py SUBCOMMANDS


def load_agent_class(target: str) -> type[Agent]:
    """`package.module:ClassName` -> the class; ValueError naming what is wrong."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"TARGET must look like package.module:ClassName, not {target!r}")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))  # agents next to where they are started
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ValueError(f"cannot import module {module_name!r}: {exc}") from None
    found = getattr(module, attr, None)
    if found is None:
        raise ValueError(f"module {module_name!r} has no attribute {attr!r}")
    if not isinstance(found, type) or not issubclass(found, Agent):
        raise ValueError(f"{target} is not a subclass of apiary.Agent")
    return found


def connected_line(agent: Agent, address: str) -> str:
    """What `agent run` says once registered: the coordinator (and where its address came
    from), the agent and tenant it acts as, and the credentials its calls present (those
    read when the address was chosen, else `ClientCredentials.load()`)."""
    credentials = credentials_of(address)
    if credentials is None:
        try:
            credentials = ClientCredentials.load()
        except ApiaryError:
            credentials = ClientCredentials()
    presented = Presented.of(credentials)
    tenant = credentials.tenant or DEFAULT_TENANT
    proofs = "; its calls are signed with its key" if agent.proves_calls else ""
    return (
        f"apiary agent run: {agent.agent_id} connected to the coordinator at "
        f"{described(address)} as agent {agent.agent_id} of tenant {tenant}; "
        f"credentials: {presented.text}{proofs}"
    )


async def _run(agent: Agent, address: str) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, lambda: asyncio.ensure_future(agent.shutdown()))
    # stderr: an agent's stdout is its own (agents print what they do there).
    await agent.run(on_registered=lambda: typer.echo(connected_line(agent, address), err=True))


@app.command("run")
def run(
    target: str = typer.Argument(..., help="The agent class: package.module:ClassName"),
    coordinator: str = typer.Option(
        "",
        COORDINATOR_FLAG,
        "-c",
        metavar="HOST:PORT",
        callback=coordinator_chosen,
        help=COORDINATOR_HELP,
    ),
    agent_id: str = typer.Option("", "--id", help="Agent id (default: the class's agent_id)"),
    log_level: str = typer.Option("INFO", "--log-level", help="DEBUG, INFO, WARNING, ERROR"),
    signing_key: Path | None = SIGNING_KEY,
    verify_signatures: bool = typer.Option(
        False,
        "--verify-signatures",
        help="Refuse messages from agents whose signature does not verify (docs/security.md)",
    ),
) -> None:
    """Register the agent, run it until SIGTERM/SIGINT or a Scheduler shutdown, then
    shut it down gracefully (running work finishes within its grace period) and deregister."""
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        cls = load_agent_class(target)
        options: dict[str, object] = {"verify_signatures": verify_signatures}
        credentials = credentials_of(coordinator)
        if credentials is not None:
            options["credentials"] = credentials
        if signing_key is not None:
            options["signing_key"] = load_signing_key(signing_key)
        agent = cls(agent_id or None, coordinator=coordinator, **options)
    except ValueError as exc:
        typer.echo(f"apiary agent run: {exc}", err=True)
        raise typer.Exit(2) from None
    except ApiaryError as exc:
        typer.echo(f"apiary agent run: {exc.message}", err=True)
        raise typer.Exit(2) from None
    try:
        asyncio.run(_run(agent, coordinator))
    except CoordinatorUnreachableError:
        typer.echo(unreachable("agent run", coordinator), err=True)
        raise typer.Exit(1) from None
    except ApiaryError as exc:
        typer.echo(f"apiary agent run: {agent.agent_id}: {exc.code}: {exc.message}", err=True)
        raise typer.Exit(1) from None


@app.command("keygen")
def keygen(
    path: Path = typer.Argument(..., help="Where to write the private key (PEM, mode 0600)"),
    force: bool = typer.Option(False, "--force", help="Replace an existing file"),
) -> None:
    """Make an agent's Ed25519 signing key; prints its public key (base64)."""
    try:
        key = write_signing_key(path, overwrite=force)
    except ApiaryError as exc:
        hint = " (--force to replace it)" if path.exists() else ""
        typer.echo(f"apiary agent keygen: {exc.message}{hint}", err=True)
        raise typer.Exit(2) from None
    typer.echo(public_key_text(key))


def _control(action: str, agent_id: str, address: str) -> None:
    async def go(client: Client) -> str:
        request = pb.apiary_pb2.AgentControlRequest(agent_id=agent_id)
        control = client.agent_control
        reply = await (control.Suspend(request) if action == "suspend" else control.Resume(request))
        return str(reply.state)

    state = run_client(f"agent {action}", address, go, with_field=False)
    typer.echo(f"{agent_id}: {state}")


@app.command("suspend")
def suspend(
    agent_id: str = typer.Argument(..., help="The agent to suspend"),
    grpc_address: str = COORDINATOR,
) -> None:
    """Suspend an agent (RFC 8.1): its task holds at its next safe point, state kept."""
    _control("suspend", agent_id, grpc_address)


@app.command("resume")
def resume(
    agent_id: str = typer.Argument(..., help="The agent to resume"),
    grpc_address: str = COORDINATOR,
) -> None:
    """Resume a suspended agent."""
    _control("resume", agent_id, grpc_address)
