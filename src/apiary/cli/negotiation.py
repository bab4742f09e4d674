"""`apiary negotiation list|show|open|propose|evaluate|decide|abort|policy` (RFC 17).

Operators authenticate with `--token` or APIARY_TOKEN (needed for HITL actions, and for
policy changes when operators are configured). Every command takes `--json`.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import typer
from google.protobuf import json_format
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import Message
from rich.table import Table

from apiary.cli.calls import COORDINATOR, run_client
from apiary.cli.output import TIME, console_for_output, stamp_text
from apiary.sdk.client import Client
from apiary.wire import pb

app = typer.Typer(no_args_is_help=True)  # help: cli/main.py SUBCOMMANDS
policy_app = typer.Typer(help="The Scheduler's negotiation policy and profiles (RFC 17.2).",
                         no_args_is_help=True)  # fmt: skip
app.add_typer(policy_app, name="policy")
T = TypeVar("T")
TOKEN = typer.Option("", "--token", envvar="APIARY_TOKEN", help="Operator token (or APIARY_TOKEN)")
JSON_OUT = typer.Option(False, "--json", help="Print JSON")
NEGOTIATION = typer.Argument(..., help="The negotiation's id")
CONTENT_TYPE = typer.Option("application/json", "--content-type", help="The payload's media type")
n = pb.negotiation_pb2
s = pb.scheduler_policy_pb2
a = pb.apiary_pb2
act = pb.activity_pb2
INTENSITIES = ("LOWEST", "LOW", "MEDIUM", "HIGH", "HIGHEST")


def _run(address: str, token: str, call: Callable[[Client], Awaitable[T]]) -> T:
    return run_client("negotiation", address, call, token=token, with_field=False)


def _doc(message: Message) -> dict[str, Any]:
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def _echo_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, sort_keys=True))


def _payload(file: Path | None, data: str) -> bytes:
    if (file is None) == (not data):
        typer.echo("apiary negotiation: give the draft with --file or --data (one)", err=True)
        raise typer.Exit(2)
    return file.read_bytes() if file is not None else data.encode()


def _json_file(path: Path | None, name: str) -> Any:
    if path is None:
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        typer.echo(f"apiary negotiation: {name}: cannot read JSON from {path}: {exc}", err=True)
        raise typer.Exit(2) from None


@app.command("list")
def list_negotiations(
    state: list[str] = typer.Option([], "--state", help="Only these states (repeatable)"),
    limit: int = typer.Option(100, "--limit", help="At most this many negotiations"),
    grpc_address: str = COORDINATOR,
    as_json: bool = JSON_OUT,
) -> None:
    """List negotiations, oldest first."""
    request = a.ListNegotiationsRequest(states=state, limit=limit)
    reply = _run(grpc_address, "", lambda c: c.negotiation_operator.List(request))
    views = list(reply.negotiations)
    if as_json:
        _echo_json([_doc(v) for v in views])
        return
    table = Table(title=f"Negotiations ({len(views)})")
    for column in ("id", "topic", "participants", "intensity", "state", "round", "stop",
                   "decided by", "updated (UTC)"):  # fmt: skip
        table.add_column(column)
    for v in views:
        table.add_row(
            v.negotiation_id, v.topic, ", ".join(v.participants), v.intensity, v.state,
            str(v.round), v.stop_reason, v.decision.decided_by, stamp_text(v.updated_at, TIME),
        )  # fmt: skip
    console_for_output().print(table)


@app.command()
def show(
    negotiation_id: str = NEGOTIATION, grpc_address: str = COORDINATOR, as_json: bool = JSON_OUT
) -> None:
    """Show one negotiation: its policy, rounds, evaluations, decision and artifacts."""

    async def both(c: Client) -> tuple[a.NegotiationView, act.ListArtifactsResponse]:
        got = await c.negotiation_operator.Get(
            a.GetNegotiationRequest(negotiation_id=negotiation_id)
        )
        items = await c.activity.ListArtifacts(
            act.ListArtifactsRequest(negotiation_id=negotiation_id)
        )
        return got, items

    view, artifacts = _run(grpc_address, "", both)
    names = [f"{i.kind}_{i.version}.json" for i in artifacts.items]
    if as_json:
        _echo_json({**_doc(view), "artifacts": names})
        return
    console = console_for_output()
    policy = view.effective.policy
    console.print(
        f"[bold]{view.negotiation_id}[/bold] {view.topic!r} {view.state} "
        f"(intensity {view.intensity}, profile {view.profile}, round {view.round}/"
        f"{policy.max_rounds}, threshold {policy.score_threshold:.2f})"
    )
    rounds = Table(title="Rounds")
    for column in ("v", "kind", "from", "tokens", "delta", "changed", "evaluations", "score"):
        rounds.add_column(column)
    for r in view.rounds:
        votes = ", ".join(f"{e.from_agent} {e.deterministic_score:.2f}" for e in r.evaluations)
        rounds.add_row(
            f"v{r.round}", r.kind, r.from_agent, str(r.tokens), f"{r.delta.magnitude:.2f}",
            ", ".join(r.delta.changed_paths[:4]), votes, f"{r.score:.2f}" if r.scored else "",
        )  # fmt: skip
    console.print(rounds)
    if view.decision_json:
        console.print(f"decision: {view.decision_json}")
    console.print(f"artifacts: {', '.join(names) or 'none'}")


def _preferences(items: list[str]) -> dict[str, pb.policy_pb2.AgentPreferences]:
    """ "agent:field=value" pairs as AgentPreferences per agent."""
    found: dict[str, dict[str, float]] = {}
    for item in items:
        agent, _, assignment = item.partition(":")
        field, _, value = assignment.partition("=")
        try:
            number = float(value)
        except ValueError:
            typer.echo(f"apiary negotiation: --prefer {item!r}: use agent:field=number", err=True)
            raise typer.Exit(2) from None
        found.setdefault(agent, {})[field] = number
    out = {}
    for agent, fields in found.items():
        try:
            out[agent] = json_format.ParseDict(fields, pb.policy_pb2.AgentPreferences())
        except json_format.ParseError as exc:
            typer.echo(f"apiary negotiation: --prefer {agent}: {exc}", err=True)
            raise typer.Exit(2) from None
    return out


@app.command("open")
def open_negotiation(
    topic: str = typer.Option(..., "--topic", help="What is negotiated"),
    participant: list[str] = typer.Option(
        ..., "--participant", "-p", help="An agent taking part (repeatable)"
    ),
    intensity: str = typer.Option("MEDIUM", "--intensity", help=" | ".join(INTENSITIES)),
    negotiation_id: str = typer.Option("", "--id", help="Default: a new UUID"),
    profile: str = typer.Option("", "--profile", help="Policy profile hint"),
    timeout: float = typer.Option(0.0, "--timeout", help="Debate timeout in seconds"),
    schema: Path | None = typer.Option(None, "--schema", help="JSON Schema file for drafts"),
    examples: Path | None = typer.Option(None, "--examples", help="JSON file of examples"),
    prefer: list[str] = typer.Option([], "--prefer", help="agent:field=value (repeatable)"),
    grpc_address: str = COORDINATOR,
    token: str = TOKEN,
    as_json: bool = JSON_OUT,
) -> None:
    """Open a negotiation; prints its id."""
    level = intensity.upper()
    if level not in INTENSITIES:
        typer.echo(f"apiary negotiation: --intensity must be one of {', '.join(INTENSITIES)}",
                   err=True)  # fmt: skip
        raise typer.Exit(2)
    rules = (("schema", _json_file(schema, "--schema")),
             ("examples", _json_file(examples, "--examples")))  # fmt: skip
    validation = {k: v for k, v in rules if v}
    duration = Duration()
    duration.FromMilliseconds(round(timeout * 1000))
    request = a.OpenNegotiationRequest(
        open=n.NegotiationOpen(
            negotiation_id=negotiation_id, topic=topic, participants=participant,
            intensity=pb.common_pb2.DebateIntensity.Value(level), debate_timeout=duration,
        ),
        profile=profile, preferences=_preferences(prefer),
        validation_json=json.dumps(validation) if validation else "",
    )  # fmt: skip
    view = _run(grpc_address, token, lambda c: c.negotiation_operator.Open(request))
    if as_json:
        _echo_json(_doc(view))
    else:
        typer.echo(view.negotiation_id)


@app.command()
def propose(
    negotiation_id: str = NEGOTIATION,
    from_agent: str = typer.Option(..., "--from", help="The participant proposing"),
    file: Path | None = typer.Option(None, "--file", help="The draft, read as bytes"),
    data: str = typer.Option("", "--data", help="The draft, inline"),
    content_type: str = CONTENT_TYPE,
    counter: bool = typer.Option(False, "--counter", help="A counter-proposal"),
    grpc_address: str = COORDINATOR,
) -> None:
    """Submit a proposal (or, with --counter, a counter-proposal)."""
    payload = _payload(file, data)
    if counter:
        request = n.CounterProposal(negotiation_id=negotiation_id, from_agent=from_agent,
                                    content_type=content_type, payload=payload)  # fmt: skip
        _run(grpc_address, "", lambda c: c.negotiation.Counter(request))
    else:
        proposal = n.Proposal(negotiation_id=negotiation_id, from_agent=from_agent,
                              content_type=content_type, payload=payload)  # fmt: skip
        _run(grpc_address, "", lambda c: c.negotiation.Propose(proposal))
    typer.echo(f"{negotiation_id}: {'counter' if counter else 'proposal'} from {from_agent}")


@app.command()
def evaluate(
    negotiation_id: str = NEGOTIATION,
    from_agent: str = typer.Option(..., "--from", help="The participant evaluating"),
    score: float = typer.Option(..., "--score", help="0..1"),
    notes: str = typer.Option("", "--notes", help="What the evaluator found"),
    llm_confidence: float = typer.Option(0.0, "--llm-confidence", help="0..1; 0: none"),
    grpc_address: str = COORDINATOR,
) -> None:
    """Evaluate the current draft (an EvaluationReport when --llm-confidence is given)."""
    if llm_confidence:
        report = pb.policy_pb2.EvaluationReport(
            from_agent=from_agent, deterministic_score=score, llm_confidence=llm_confidence,
            notes=notes,
        )  # fmt: skip
        request = s.SubmitEvaluationRequest(negotiation_id=negotiation_id, report=report)
        reply = _run(grpc_address, "", lambda c: c.scheduler_policy.SubmitEvaluation(request))
        if not reply.accepted:
            typer.echo(f"apiary negotiation: not accepted: {reply.reason}", err=True)
            raise typer.Exit(1)
    else:
        evaluation = n.Evaluation(negotiation_id=negotiation_id, from_agent=from_agent,
                                  confidence_score=score, notes=notes)  # fmt: skip
        _run(grpc_address, "", lambda c: c.negotiation.Evaluate(evaluation))
    typer.echo(f"{negotiation_id}: evaluated by {from_agent}")


@app.command()
def decide(
    negotiation_id: str = NEGOTIATION,
    action: str = typer.Option(
        "", "--action", help="HITL: approve | deny | defer | decide=<version or agent>"
    ),
    reason: str = typer.Option("", "--reason", "-r", help="Rationale (HITL actions)"),
    decided_by: str = typer.Option("hitl", "--decided-by", help="consensus | hitl | policy"),
    file: Path | None = typer.Option(None, "--file", help="The result (default: latest draft)"),
    content_type: str = CONTENT_TYPE,
    grpc_address: str = COORDINATOR,
    token: str = TOKEN,
) -> None:
    """Decide: with --action, the HITL decision the negotiation waits for (SchedulerPolicy
    HitlAction); otherwise an explicit Decide (the opener or an operator)."""
    if action:
        if not token:
            typer.echo("apiary negotiation: a HITL action needs --token or APIARY_TOKEN", err=True)
            raise typer.Exit(2)
        request = s.HitlActionRequest(negotiation_id=negotiation_id, action=action,
                                      rationale=reason)  # fmt: skip
        reply = _run(grpc_address, token, lambda c: c.scheduler_policy.HitlAction(request))
        typer.echo(f"{negotiation_id}: {reply.reason}")
        return
    decision = n.Decision(
        negotiation_id=negotiation_id, decided_by=decided_by,
        content_type=content_type if file else "", result=file.read_bytes() if file else b"",
    )  # fmt: skip
    _run(grpc_address, token, lambda c: c.negotiation.Decide(decision))
    typer.echo(f"{negotiation_id}: decided ({decided_by})")


@app.command()
def abort(
    negotiation_id: str = NEGOTIATION,
    reason: str = typer.Option(..., "--reason", "-r", help="Why, sent to the participants"),
    grpc_address: str = COORDINATOR,
    token: str = TOKEN,
) -> None:
    """Abort a negotiation (a participant, the opener or an operator)."""
    request = n.AbortRequest(negotiation_id=negotiation_id, reason=reason)
    _run(grpc_address, token, lambda c: c.negotiation.Abort(request))
    typer.echo(f"{negotiation_id}: aborted")


def _policy_table(title: str, rows: list[tuple[str, pb.policy_pb2.NegotiationPolicy]]) -> None:
    table = Table(title=title)
    for column in ("name", "max rounds", "threshold", "diff tol.", "round timeout", "tokens/round",
                   "total tokens", "oscillations", "hitl", "llm weight"):  # fmt: skip
        table.add_column(column)
    for name, p in rows:
        table.add_row(
            name, str(p.max_rounds), f"{p.score_threshold:.2f}", f"{p.diff_tolerance:.2f}",
            f"{p.round_timeout_ms / 1000:g} s", str(p.token_budget_per_round or "-"),
            str(p.total_token_budget or "-"), str(p.oscillation_limit), p.hitl.mode or "None",
            f"{p.scoring.llm_weight:.2f}",
        )  # fmt: skip
    console_for_output().print(table)


@policy_app.command("show")
def policy_show(grpc_address: str = COORDINATOR, as_json: bool = JSON_OUT) -> None:
    """The base policy (SetNegotiationPolicy)."""
    request = s.GetNegotiationPolicyRequest()
    reply = _run(grpc_address, "", lambda c: c.scheduler_policy.GetNegotiationPolicy(request))
    if as_json:
        _echo_json(_doc(reply.policy))
    else:
        _policy_table("Base negotiation policy", [("base", reply.policy)])


@policy_app.command("set")
def policy_set(
    file: Path = typer.Argument(..., help="NegotiationPolicy as JSON"),
    grpc_address: str = COORDINATOR,
    token: str = TOKEN,
) -> None:
    """Replace the base policy (checked against the guardrails)."""
    policy = json_format.ParseDict(_json_file(file, "policy"), pb.policy_pb2.NegotiationPolicy())
    request = s.SetNegotiationPolicyRequest(policy=policy)
    reply = _run(grpc_address, token, lambda c: c.scheduler_policy.SetNegotiationPolicy(request))
    if not reply.ok:
        typer.echo(f"apiary negotiation: refused: {reply.reason}", err=True)
        raise typer.Exit(1)
    typer.echo("policy set")


@policy_app.command("profiles")
def policy_profiles(grpc_address: str = COORDINATOR, as_json: bool = JSON_OUT) -> None:
    """Every profile: one per intensity, then the named ones."""
    request = s.ListPolicyProfilesRequest()
    reply = _run(grpc_address, "", lambda c: c.scheduler_policy.ListPolicyProfiles(request))
    if as_json:
        _echo_json([_doc(p) for p in reply.profiles])
    else:
        _policy_table("Policy profiles", [(p.name, p.policy) for p in reply.profiles])


@policy_app.command("set-profiles")
def policy_set_profiles(
    file: Path = typer.Argument(..., help='JSON list of {"name": ..., "policy": {...}}'),
    grpc_address: str = COORDINATOR,
    token: str = TOKEN,
) -> None:
    """Replace the named profiles."""
    items = _json_file(file, "profiles")
    request = json_format.ParseDict({"profiles": items}, s.SetPolicyProfilesRequest())
    reply = _run(grpc_address, token, lambda c: c.scheduler_policy.SetPolicyProfiles(request))
    if not reply.ok:
        typer.echo(f"apiary negotiation: refused: {reply.reason}", err=True)
        raise typer.Exit(1)
    typer.echo(f"{len(request.profiles)} profile(s) set")


@policy_app.command("effective")
def policy_effective(
    negotiation_id: str = NEGOTIATION, grpc_address: str = COORDINATOR, as_json: bool = JSON_OUT
) -> None:
    """The EffectivePolicy of one negotiation and the clamped preferences applied."""
    request = s.GetEffectivePolicyRequest(negotiation_id=negotiation_id)
    reply = _run(grpc_address, "", lambda c: c.scheduler_policy.GetEffectivePolicy(request))
    if as_json:
        _echo_json(_doc(reply.effective))
        return
    _policy_table(f"Effective policy of {negotiation_id}", [("effective", reply.effective.policy)])
    for agent, prefs in sorted(reply.effective.applied.items()):
        typer.echo(f"{agent}: {json.dumps(_doc(prefs), sort_keys=True)}")
