"""`apiary room list|show|propose|vote|decision|wait|policies`: negotiation rooms (RFC 17.5)
of a running coordinator.

Producers and critics act as an agent: `--as AGENT_ID` (or APIARY_AGENT_ID) is sent as the
`sw4rm-agent-id` of the call. `--json` prints JSON for scripts (one object per line for
lists).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import typer
from google.protobuf import json_format
from google.protobuf.message import Message
from rich.table import Table

from apiary.cli.calls import COORDINATOR, credentials_of, refusal
from apiary.cli.output import console_for_output, stamp_text
from apiary.errors import ApiaryError
from apiary.sdk.client import Client
from apiary.wire import pb

app = typer.Typer(no_args_is_help=True)  # help: cli/main.py SUBCOMMANDS
T = TypeVar("T")
AGENT = typer.Option("", "--as", envvar="APIARY_AGENT_ID", help="Act as this agent")
ROOM = typer.Option("", "--room", help="Negotiation room id (optional for reads)")
JSON_OUT = typer.Option(False, "--json", help="JSON output for scripts")
ARTIFACT = typer.Argument(..., help="The proposal's artifact id")
nr = pb.negotiation_room_pb2
a = pb.apiary_pb2
ARTIFACT_TYPES = ("REQUIREMENTS", "PLAN", "CODE", "DEPLOYMENT")


def _run(address: str, agent: str, call: Callable[[Client], Awaitable[T]]) -> T:
    async def go() -> T:
        async with Client(address, agent_id=agent, credentials=credentials_of(address)) as client:
            return await call(client)

    try:
        return asyncio.run(go())
    except ApiaryError as exc:
        typer.echo(refusal("room", exc, with_field=False, address=address), err=True)
        raise typer.Exit(1) from None


def _doc(message: Message) -> dict[str, Any]:
    doc: dict[str, Any] = json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return doc


def _outcome(decision: nr.NegotiationDecision) -> str:
    return nr.DecisionOutcome.Name(decision.outcome)


@app.command("list")
def list_proposals(
    grpc_address: str = COORDINATOR,
    room: str = ROOM,
    state: list[str] = typer.Option([], "--state", help="OPEN, ESCALATED, APPROVED, ..."),
    critic: str = typer.Option("", "--critic", help="Only what this critic has to review"),
    limit: int = typer.Option(100, "--limit", help="At most this many proposals"),
    as_json: bool = JSON_OUT,
) -> None:
    """List proposals, oldest first."""
    request = a.ListRoomProposalsRequest(
        negotiation_room_id=room, states=state, critic_id=critic, limit=limit
    )
    reply = _run(grpc_address, "", lambda c: c.negotiation_room_query.ListProposals(request))
    if as_json:
        for item in reply.proposals:
            typer.echo(json.dumps(_doc(item)))
        return
    table = Table(title=f"negotiation-room proposals ({len(reply.proposals)})")
    for column in ("artifact", "room", "type", "producer", "state", "votes", "waiting for",
                   "vote deadline (UTC)", "policy"):  # fmt: skip
        table.add_column(column)
    for item in reply.proposals:
        p = item.proposal
        table.add_row(
            p.artifact_id, p.negotiation_room_id, nr.ArtifactType.Name(p.artifact_type),
            p.producer_id, item.state, f"{item.votes_received}/{item.votes_required}",
            ", ".join(item.pending_critics), stamp_text(item.vote_deadline), item.policy_version,
        )  # fmt: skip
    console_for_output().print(table)


@app.command()
def show(
    artifact_id: str = ARTIFACT,
    grpc_address: str = COORDINATOR,
    room: str = ROOM,
    as_json: bool = JSON_OUT,
) -> None:
    """Show a proposal with its votes and decisions."""

    async def read(
        c: Client,
    ) -> tuple[a.RoomProposal, nr.GetVotesResponse, a.ListRoomDecisionsResponse]:
        query = c.negotiation_room_query
        item = await query.GetProposal(
            a.GetRoomProposalRequest(artifact_id=artifact_id, negotiation_room_id=room)
        )
        votes = await c.negotiation_room.GetVotes(
            nr.GetVotesRequest(artifact_id=artifact_id, negotiation_room_id=room)
        )
        decisions = await query.ListDecisions(
            a.ListRoomDecisionsRequest(artifact_id=artifact_id, negotiation_room_id=room)
        )
        return item, votes, decisions

    item, votes, decisions = _run(grpc_address, "", read)
    if as_json:
        doc = {**_doc(item), "votes": [_doc(v) for v in votes.votes],
               "decisions": [_doc(d) for d in decisions.decisions]}  # fmt: skip
        typer.echo(json.dumps(doc, indent=2))
        return
    p = item.proposal
    console = console_for_output()
    console.print(
        f"[bold]{p.artifact_id}[/bold] ({nr.ArtifactType.Name(p.artifact_type)}, "
        f"{p.artifact_content_type}, {item.artifact_size} bytes) in room {p.negotiation_room_id}"
        f" by {p.producer_id}: {item.state}, policy {item.policy_version}"
    )
    table = Table(title=f"votes ({votes.vote_count} of {item.votes_required})")
    for column in ("critic", "score", "confidence", "passed", "recommendations"):
        table.add_column(column)
    for v in votes.votes:
        table.add_row(v.critic_id, f"{v.score:g}", f"{v.confidence:g}", "yes" if v.passed else "no",
                      "; ".join(v.recommendations))  # fmt: skip
    console.print(table)
    for d in decisions.decisions:
        console.print(f"decision {d.sequence}: {_outcome(d.decision)} by {d.decided_by} ({d.via})"
                      f": {d.decision.reason}")  # fmt: skip


@app.command()
def propose(
    critic: list[str] = typer.Option(..., "--critic", help="A critic to review (repeatable)"),
    artifact_type: str = typer.Option(..., "--type", help="REQUIREMENTS, PLAN, CODE or DEPLOYMENT"),
    file: Path | None = typer.Option(None, "--file", help="Read the artifact from this file"),
    text: str = typer.Option("", "--text", help="The artifact itself"),
    content_type: str = typer.Option("text/plain", "--content-type", help="Its MIME type"),
    artifact_id: str = typer.Option("", "--artifact-id", help="Default: a new UUID"),
    room: str = typer.Option("", "--room", help="Default: a new room"),
    agent: str = AGENT,
    grpc_address: str = COORDINATOR,
) -> None:
    """Submit an artifact to critics (SubmitProposal)."""
    if (file is None) == (not text):
        typer.echo("apiary room: give the artifact with --file or --text (one of them)", err=True)
        raise typer.Exit(2)
    kind = artifact_type.strip().upper()
    if kind not in ARTIFACT_TYPES:
        typer.echo(f"apiary room: --type must be REQUIREMENTS, PLAN, CODE or DEPLOYMENT, "
                   f"not {artifact_type!r}", err=True)  # fmt: skip
        raise typer.Exit(2)
    proposal = nr.NegotiationProposal(
        artifact_type=nr.ArtifactType.Value(kind), artifact_id=artifact_id,
        artifact=file.read_bytes() if file else text.encode(), artifact_content_type=content_type,
        requested_critics=critic, negotiation_room_id=room,
    )  # fmt: skip
    request = nr.SubmitProposalRequest(proposal=proposal)
    reply = _run(grpc_address, agent, lambda c: c.negotiation_room.SubmitProposal(request))
    typer.echo(f"{reply.artifact_id} in room {reply.negotiation_room_id}")


@app.command()
def vote(
    artifact_id: str = ARTIFACT,
    score: float = typer.Option(..., "--score", help="0..10"),
    confidence: float = typer.Option(..., "--confidence", help="0..1"),
    passed: bool = typer.Option(True, "--pass/--fail", help="Meets the minimum criteria"),
    strength: list[str] = typer.Option([], "--strength", help="A strength found (repeatable)"),
    weakness: list[str] = typer.Option([], "--weakness", help="A weakness found (repeatable)"),
    recommend: list[str] = typer.Option([], "--recommend", help="ESCALATE asks for HITL"),
    room: str = ROOM,
    agent: str = AGENT,
    grpc_address: str = COORDINATOR,
) -> None:
    """Vote on an artifact as a critic (SubmitVote)."""
    request = nr.SubmitVoteRequest(
        vote=nr.NegotiationVote(
            artifact_id=artifact_id, score=score, confidence=confidence, passed=passed,
            strengths=strength, weaknesses=weakness, recommendations=recommend,
            negotiation_room_id=room,
        )
    )  # fmt: skip
    reply = _run(grpc_address, agent, lambda c: c.negotiation_room.SubmitVote(request))
    typer.echo(f"{reply.critic_id} voted on {reply.artifact_id}")


def _print_decision(decision: nr.NegotiationDecision, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(_doc(decision)))
        return
    scores = decision.aggregated_score
    typer.echo(f"{decision.artifact_id}: {_outcome(decision)} (policy {decision.policy_version})")
    if decision.HasField("aggregated_score"):
        typer.echo(f"  weighted_mean {scores.weighted_mean:.2f}, mean {scores.mean:.2f}, "
                   f"std_dev {scores.std_dev:.2f}, {scores.vote_count} votes")  # fmt: skip
    typer.echo(f"  {decision.reason}")


@app.command()
def decision(
    artifact_id: str = ARTIFACT,
    grpc_address: str = COORDINATOR,
    room: str = ROOM,
    as_json: bool = JSON_OUT,
) -> None:
    """Show the latest decision (GetDecision); exit 3 while votes are still being collected."""
    request = nr.GetDecisionRequest(artifact_id=artifact_id, negotiation_room_id=room)
    reply = _run(grpc_address, "", lambda c: c.negotiation_room.GetDecision(request))
    if not reply.HasField("decision"):
        typer.echo(f"{artifact_id}: no decision yet", err=not as_json)
        raise typer.Exit(3)
    _print_decision(reply.decision, as_json)


@app.command()
def wait(
    artifact_id: str = ARTIFACT,
    timeout: int = typer.Option(300, "--timeout", help="Seconds to wait (0: the server's default)"),
    grpc_address: str = COORDINATOR,
    room: str = ROOM,
    as_json: bool = JSON_OUT,
) -> None:
    """Block until the final decision (WaitForDecision); exit 1 when it did not come in time."""
    request = nr.WaitForDecisionRequest(
        artifact_id=artifact_id, negotiation_room_id=room, timeout_seconds=timeout
    )
    reply = _run(grpc_address, "", lambda c: c.negotiation_room.WaitForDecision(request))
    _print_decision(reply.decision, as_json)


@app.command()
def policies(grpc_address: str = COORDINATOR, as_json: bool = JSON_OUT) -> None:
    """List the policy versions on record (the current one marked)."""
    request = a.ListRoomPoliciesRequest()
    reply = _run(grpc_address, "", lambda c: c.negotiation_room_query.ListPolicies(request))
    if as_json:
        for item in reply.policies:
            typer.echo(json.dumps({**_doc(item), "settings": json.loads(item.settings_json)}))
        return
    table = Table(title="room policy versions")
    for column in ("version", "since (UTC)", "current", "settings"):
        table.add_column(column)
    for item in reply.policies:
        table.add_row(item.version, stamp_text(item.created_at), "yes" if item.current else "",
                      item.settings_json)  # fmt: skip
    console_for_output().print(table)
