"""`apiary swarm ...`: the Agent Swarm Protocol from the command line (docs/swarm.md).

Every command works on a swarm home (`--home`, $APIARY_SWARM_HOME, default ~/.swarm) and may
run next to `apiary swarm serve` of the same home: the state file is shared under a lock.
Refusals print the protocol's code and the field at fault and exit 1.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.table import Table

from apiary.cli.output import console_for_output
from apiary.core.swarm_mail import INBOX_STATUSES, OUTBOX_STATUSES, InboxEntry, OutboxEntry
from apiary.swarm import membership as ms
from apiary.swarm.errors import SwarmError, SwarmFileError
from apiary.swarm.home import HOME_ENV, NodeConfig, SwarmHome
from apiary.swarm.node import SwarmNode
from apiary.swarm.peer import open_home_node, open_home_peer
from apiary.swarm.private_file import write_private
from apiary.swarm.settings import PeerSettings
from apiary.swarm.statefile import ImportMode, export_state, import_state
from apiary.swarm.wire import BROADCAST, format_timestamp

app = typer.Typer(no_args_is_help=True)  # help: cli/main.py SUBCOMMANDS
T = TypeVar("T")
HOME = typer.Option(None, "--home", envvar=HOME_ENV, help="Swarm home [~/.swarm]")
JSON = typer.Option(False, "--json", help="Machine-readable output")
SWARM = typer.Argument(..., help="The swarm's id")
MEMBER = typer.Argument(..., help="The member's agent id")


def _fail(problem: str, code: int = 1) -> typer.Exit:
    typer.echo(f"apiary swarm: {problem}", err=True)
    return typer.Exit(code)


def _explain(exc: SwarmError) -> str:
    where = f" (field {exc.field})" if exc.field else ""
    wait = f"; retry in {exc.retry_after_s} s" if exc.retry_after_s else ""
    return f"{exc.code}: {exc.message}{where}{wait}"


def _guard(work: Callable[[], T]) -> T:
    try:
        return work()
    except SwarmError as exc:
        raise _fail(_explain(exc)) from None
    except SwarmFileError as exc:
        raise _fail(str(exc)) from None


def _with_node(home: Path | None, work: Callable[[SwarmNode], Awaitable[T]]) -> T:
    async def go() -> T:
        async with open_home_node(SwarmHome(home)) as node:
            return await work(node)

    return _guard(lambda: asyncio.run(go()))


def _echo_json(value: Any) -> None:
    typer.echo(json.dumps(value, ensure_ascii=False))


def _deliveries(rows: Iterable[OutboxEntry]) -> None:
    for row in rows:
        outcome = row.status if not row.error else f"{row.status}: {row.error}"
        if row.status == "retrying":
            outcome += (
                f" (tried again from {format_timestamp(row.next_attempt_at)} by a serving peer:"
                " apiary swarm serve, or a coordinator with [swarm])"
            )
        typer.echo(f"  {row.destination}: {outcome}")


@app.command()
def init(
    agent_id: str = typer.Option(..., "--agent-id", help="This agent's id in every swarm"),
    endpoint: str = typer.Option(
        ..., "--endpoint", help="Public HTTPS endpoint with /swarm: https://host:port/swarm"
    ),
    ca: Path | None = typer.Option(None, "--ca", help="CA file to trust for peers' TLS"),
    store: str = typer.Option("", "--store", help="Inbox/outbox store URL [home/apiary.db]"),
    wake: str = typer.Option("", "--wake", help="Command run per message (JSON on stdin)"),
    bridge_agent: str = typer.Option(
        "", "--bridge-agent", help="Local agent for messages naming none (in a coordinator)"
    ),
    force: bool = typer.Option(False, "--force", help="Start over: new key, empty state"),
    insecure: bool = typer.Option(
        False,
        "--insecure",
        help="Local development: a plain http:// endpoint on a loopback "
        "address (http://127.0.0.1:PORT/swarm), and loopback http:// peers",
    ),
    home: Path | None = HOME,
) -> None:
    """Create a swarm home: identity key, configuration and empty state."""
    config = NodeConfig(agent_id, endpoint.rstrip("/"), str(ca.resolve()) if ca else "", store,
                        wake, bridge_agent, insecure)  # fmt: skip
    place = SwarmHome(home)
    identity = _guard(lambda: place.init(config, force=force))
    typer.echo(f"agent {agent_id} at {config.endpoint}")
    typer.echo(f"home {place.path}")
    typer.echo(f"public key {identity.public_key}")


@app.command()
def create(
    name: str = typer.Argument(..., help="The swarm's name"),
    allow_member_invite: bool = typer.Option(
        False, "--allow-member-invite", help="Members may invite others, not only the master"
    ),
    require_approval: bool = typer.Option(
        False, "--require-approval", help="The master approves each join"
    ),
    as_json: bool = JSON,
    home: Path | None = HOME,
) -> None:
    """Create a swarm with this agent as its master."""
    settings = ms.Settings(allow_member_invite, require_approval)

    async def work(node: SwarmNode) -> ms.Swarm:
        return node.create(name, settings)

    swarm = _with_node(home, work)
    if as_json:
        _echo_json({"swarm_id": swarm.swarm_id, "name": swarm.name, "master": swarm.master})
    else:
        typer.echo(swarm.swarm_id)


@app.command()
def invite(
    swarm_id: str = SWARM,
    expires_in: int = typer.Option(86_400, "--expires-in", help="Seconds (60 to 2592000)"),
    max_uses: int | None = typer.Option(None, "--max-uses", help="Joins allowed [unlimited]"),
    as_json: bool = JSON,
    home: Path | None = HOME,
) -> None:
    """Print an invite URL for a swarm."""

    async def work(node: SwarmNode) -> Any:
        return node.invite(swarm_id, expires_in, max_uses)

    made = _with_node(home, work)
    if as_json:
        _echo_json({"invite_url": made.url, "token": made.token, "expires_at": made.expires_at,
                    "max_uses": made.max_uses})  # fmt: skip
    else:
        typer.echo(made.url)


@app.command()
def join(
    invite_url: str = typer.Argument(..., help="The invite URL (swarm invite printed it)"),
    home: Path | None = HOME,
) -> None:
    """Join a swarm with an invite URL (swarm://<swarm_id>@<host:port>?token=...)."""

    async def work(node: SwarmNode) -> Any:
        return await node.join(invite_url)

    result = _with_node(home, work)
    if result.status == "pending":
        typer.echo(f"{result.swarm_id}: pending the master's approval; join again afterwards")
        return
    swarm = result.swarm
    typer.echo(f"joined {swarm.name} ({swarm.swarm_id}): {len(swarm.members)} members")


@app.command()
def leave(swarm_id: str = SWARM, home: Path | None = HOME) -> None:
    """Leave a swarm (a master with members must transfer it first)."""
    rows = _with_node(home, lambda node: node.leave(swarm_id))
    typer.echo(f"left {swarm_id}")
    _deliveries(rows)


@app.command()
def kick(
    swarm_id: str = SWARM,
    agent_id: str = MEMBER,
    reason: str = typer.Option("", "--reason", "-r", help="Why, told to the members"),
    home: Path | None = HOME,
) -> None:
    """Remove a member (master only)."""
    rows = _with_node(home, lambda node: node.kick(swarm_id, agent_id, reason))
    typer.echo(f"kicked {agent_id} from {swarm_id}")
    _deliveries(rows)


@app.command()
def transfer(swarm_id: str = SWARM, agent_id: str = MEMBER, home: Path | None = HOME) -> None:
    """Hand the master role to another member."""
    rows = _with_node(home, lambda node: node.transfer(swarm_id, agent_id))
    typer.echo(f"{agent_id} is now the master of {swarm_id}")
    _deliveries(rows)


@app.command()
def approve(swarm_id: str = SWARM, agent_id: str = MEMBER, home: Path | None = HOME) -> None:
    """Approve a pending join (swarms created with --require-approval)."""
    rows = _with_node(home, lambda node: node.approve(swarm_id, agent_id))
    typer.echo(f"{agent_id} joined {swarm_id}")
    _deliveries(rows)


def _mute(
    muted: bool, swarm: str, agent: str, announce: str, reason: str, home: Path | None
) -> None:
    if bool(swarm) == bool(agent):
        raise _fail("name exactly one of --swarm or --agent", 2)

    async def work(node: SwarmNode) -> list[OutboxEntry]:
        if swarm:
            node.mute_swarm(swarm, muted)
            return []
        return await node.mute_agent(agent, muted, announce, reason)

    rows = _with_node(home, work)
    typer.echo(f"{'muted' if muted else 'unmuted'} {swarm or agent}")
    _deliveries(rows)


@app.command()
def mute(
    swarm: str = typer.Option("", "--swarm", help="Drop every message of this swarm"),
    agent: str = typer.Option("", "--agent", help="Drop every message of this agent"),
    announce: str = typer.Option("", "--announce-in", help="Tell this swarm (member_muted)"),
    reason: str = typer.Option("", "--reason", "-r", help="Why, in the announcement"),
    home: Path | None = HOME,
) -> None:
    """Silently drop a swarm's or an agent's messages (answered 200, never recorded)."""
    _mute(True, swarm, agent, announce, reason, home)


@app.command()
def unmute(
    swarm: str = typer.Option("", "--swarm", help="Hear this swarm again"),
    agent: str = typer.Option("", "--agent", help="Hear this agent again"),
    announce: str = typer.Option("", "--announce-in", help="Tell this swarm (member_unmuted)"),
    home: Path | None = HOME,
) -> None:
    """Hear a muted swarm or agent again."""
    _mute(False, swarm, agent, announce, "", home)


def _metadata(pairs: list[str]) -> dict[str, str]:
    found = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise _fail(f"--meta takes KEY=VALUE, not {pair!r}", 2)
        found[key] = value
    return found


@app.command()
def send(
    swarm_id: str = SWARM,
    recipient: str = typer.Argument(..., help=f"An agent_id, or {BROADCAST}"),
    content: str = typer.Argument(..., help="The text; - reads it from stdin"),
    kind: str = typer.Option("message", "--type", help="message or notification"),
    thread: str = typer.Option("", "--thread", help="thread_id"),
    reply_to: str = typer.Option("", "--reply-to", help="in_reply_to (a message_id)"),
    priority: str = typer.Option("normal", "--priority", help="low, normal or high"),
    expires_in: float = typer.Option(0.0, "--expires-in", help="Seconds until it expires"),
    meta: list[str] = typer.Option([], "--meta", help="metadata KEY=VALUE (repeatable)"),
    as_json: bool = JSON,
    home: Path | None = HOME,
) -> None:
    """Sign and send a message to a member or to the whole swarm."""
    text = sys.stdin.read() if content == "-" else content
    optional: dict[str, Any] = {"priority": priority, "metadata": _metadata(meta)}
    if thread:
        optional["thread_id"] = thread
    if reply_to:
        optional["in_reply_to"] = reply_to

    async def work(node: SwarmNode) -> Any:
        if expires_in > 0:
            optional["expires_at"] = format_timestamp(node.clock.now() + expires_in)
        return await node.send(swarm_id, recipient, text, kind=kind, **optional)

    message, rows = _with_node(home, work)
    if as_json:
        _echo_json({"message_id": message.message_id,
                    "deliveries": {r.destination: r.status for r in rows}})  # fmt: skip
        return
    typer.echo(message.message_id)
    _deliveries(rows)
    if any(r.status != "delivered" for r in rows):
        raise typer.Exit(1)


@app.command()
def retry(
    message_id: str = typer.Argument(..., help="The outbox message to deliver again"),
    to: str = typer.Option("", "--to", help="Only this destination"),
    home: Path | None = HOME,
) -> None:
    """Deliver an outbox message again now (failed or retrying rows; one attempt each)."""
    rows = _with_node(home, lambda node: node.retry(message_id, to))
    _deliveries(rows)
    if any(r.status != "delivered" for r in rows):
        raise typer.Exit(1)


def _inbox_doc(entry: InboxEntry) -> dict[str, Any]:
    mail = entry.mail
    return {
        "message_id": mail.message_id, "swarm_id": mail.swarm_id, "from": mail.sender_id,
        "recipient": mail.recipient_id, "type": mail.message_type, "content": mail.content,
        "timestamp": mail.sent_at, "status": entry.status,
        "received_at": format_timestamp(entry.received_at), "thread_id": mail.thread_id,
        "in_reply_to": mail.in_reply_to, "priority": mail.priority,
        "expires_at": mail.expires_at, "references": list(mail.references),
        "attachments": list(mail.attachments), "metadata": mail.metadata,
    }  # fmt: skip


def _outbox_doc(entry: OutboxEntry) -> dict[str, Any]:
    mail = entry.mail
    return {
        "message_id": mail.message_id, "swarm_id": mail.swarm_id, "to": entry.destination,
        "recipient": mail.recipient_id, "type": mail.message_type, "content": mail.content,
        "status": entry.status, "attempts": entry.attempts, "error": entry.error,
        "created_at": format_timestamp(entry.created_at),
        "next_attempt_at": (
            format_timestamp(entry.next_attempt_at) if entry.status == "retrying" else None
        ),
    }  # fmt: skip


@app.command()
def messages(
    swarm_id: str = typer.Option("", "--swarm", help="Only this swarm"),
    status: list[str] = typer.Option(
        [],
        "--status",
        help=f"{', '.join(INBOX_STATUSES)} (with --outbox: {', '.join(OUTBOX_STATUSES)})",
    ),
    limit: int = typer.Option(50, "--limit", help="At most (100 at most)"),
    outbox: bool = typer.Option(False, "--outbox", help="What was sent, not received"),
    mark_read: bool = typer.Option(False, "--mark-read", help="Mark the listed unread read"),
    as_json: bool = JSON,
    home: Path | None = HOME,
) -> None:
    """Recent messages, newest first (deleted ones left out unless asked for)."""
    statuses = frozenset(status) if status else None

    async def work(node: SwarmNode) -> list[dict[str, Any]]:
        try:
            if outbox:
                rows = await node.store.outbox_recent(swarm_id or None, limit, statuses)
                return [_outbox_doc(r) for r in rows]
            entries = await node.store.list_recent(swarm_id or None, limit, statuses)
        except ValueError as exc:
            raise SwarmError(400, "INVALID_FORMAT", str(exc), field="status") from None
        if mark_read:
            for entry in entries:
                if entry.status == "unread":
                    await node.mark(entry.mail.message_id, "read")
        return [_inbox_doc(e) for e in entries]

    docs = _with_node(home, work)
    if as_json:
        for doc in docs:
            _echo_json(doc)
        return
    columns = ("to", "status", "attempts") if outbox else ("from", "type", "status")
    table = Table(title=f"{'outbox' if outbox else 'inbox'} ({len(docs)})")
    for column in ("id", *columns, "content"):
        table.add_column(column, overflow="fold")
    for doc in docs:
        table.add_row(doc["message_id"][:8], *(str(doc[c]) for c in columns), doc["content"])
    console_for_output().print(table)


@app.command()
def members(swarm_id: str = SWARM, as_json: bool = JSON, home: Path | None = HOME) -> None:
    """A swarm's members (and joins pending approval)."""
    swarm = _guard(lambda: SwarmHome(home).states().load().swarm(swarm_id))
    rows = [(m, "member") for m in swarm.members] + [(m, "pending") for m in swarm.pending]
    if as_json:
        for member, kind in rows:
            _echo_json({**member.to_json(), "master": member.agent_id == swarm.master,
                        "status": kind})  # fmt: skip
        return
    table = Table(title=f"{swarm.name} ({swarm.swarm_id})")
    for column in ("agent", "role", "endpoint", "joined"):
        table.add_column(column)
    for member, kind in rows:
        role = "master" if member.agent_id == swarm.master else kind
        table.add_row(member.agent_id, role, member.endpoint, member.joined_at)
    console_for_output().print(table)


@app.command()
def status(as_json: bool = JSON, home: Path | None = HOME) -> None:
    """Who this agent is and where it belongs."""
    place = SwarmHome(home)
    config = _guard(place.config)
    identity = _guard(place.identity)
    state = _guard(lambda: place.states().load())
    doc = {
        "agent_id": config.agent_id, "endpoint": config.endpoint, "home": str(place.path),
        "public_key": identity.public_key,
        "swarms": [
            {"swarm_id": s.swarm_id, "name": s.name, "master": s.master,
             "members": len(s.members), "pending": len(s.pending)}
            for s in state.swarms.values()
        ],
        "muted_swarms": sorted(state.muted_swarms), "muted_agents": sorted(state.muted_agents),
    }  # fmt: skip
    if as_json:
        _echo_json(doc)
        return
    typer.echo(f"agent {config.agent_id} at {config.endpoint}")
    typer.echo(f"public key {identity.public_key}")
    table = Table(title=f"swarms ({len(doc['swarms'])})")
    for column in ("swarm", "name", "master", "members", "pending"):
        table.add_column(column)
    for s in state.swarms.values():
        table.add_row(s.swarm_id, s.name, s.master, str(len(s.members)), str(len(s.pending)))
    console_for_output().print(table)
    if state.muted_swarms or state.muted_agents:
        typer.echo(f"muted: {', '.join(sorted(state.muted_swarms | state.muted_agents))}")


@app.command("export")
def export_command(
    output: Path | None = typer.Option(None, "--output", "-o", help="File [stdout]"),
    home: Path | None = HOME,
) -> None:
    """Export the membership state (with exported_at) for backup or migration."""
    state = _guard(lambda: SwarmHome(home).states().load())
    text = json.dumps(export_state(state, time.time()), indent=2, ensure_ascii=False) + "\n"
    if output is None:
        typer.echo(text, nl=False)
        return
    write_private(output, text.encode("utf-8"))
    typer.echo(f"exported {len(state.swarms)} swarm(s) to {output}")


@app.command("import")
def import_command(
    source: Path = typer.Argument(..., help="The file `swarm export` wrote"),
    replace: bool = typer.Option(False, "--replace", help="Replace instead of merging"),
    home: Path | None = HOME,
) -> None:
    """Import an exported state: merged into the current one (or replacing it)."""
    try:
        data = source.read_bytes()
    except OSError as exc:
        raise _fail(f"{source}: {exc.strerror}") from None
    states = SwarmHome(home).states()
    mode: ImportMode = "replace" if replace else "merge"
    state = _guard(
        lambda: states.update(lambda s: (new := import_state(data, s, mode, source), new))
    )
    typer.echo(f"imported {source} ({mode}): {len(state.swarms)} swarm(s)")


@app.command()
def serve(
    listen: str = typer.Option("127.0.0.1:8443", "--listen", help="HOST:PORT to serve HTTPS on"),
    cert: Path | None = typer.Option(None, "--cert", help="TLS certificate chain (PEM)"),
    key: Path | None = typer.Option(None, "--key", help="TLS private key (PEM)"),
    wake: str = typer.Option("", "--wake", help="Command run per message [node.json's]"),
    insecure: bool = typer.Option(
        False,
        "--insecure",
        help="Without --cert and --key: serve plain HTTP, on a loopback "
        "address only (local development; the home made with swarm init --insecure)",
    ),
    home: Path | None = HOME,
) -> None:
    """Serve /swarm/message, /join, /health and /info over HTTPS until SIGTERM or SIGINT."""
    if bool(cert) != bool(key) or (cert is None and not insecure):
        raise _fail("--cert and --key are both required (or --insecure, without them, to "
                    "serve plain HTTP on a loopback address for local development)", 2)  # fmt: skip
    place = SwarmHome(home)
    settings = PeerSettings(place.path, listen, str(cert or ""), str(key or ""), wake=wake,
                            insecure=insecure)  # fmt: skip

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        async with open_home_peer(settings) as peer:
            assert peer.address is not None
            host, port = peer.address
            print(f"listen={host}:{port}", flush=True)
            print(f"swarm={peer.node.config.endpoint}", flush=True)
            await stop.wait()

    try:
        _guard(lambda: asyncio.run(run()))
    except OSError as exc:
        raise _fail(str(exc)) from None
