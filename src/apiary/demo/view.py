"""How `apiary demo` looks in a terminal: first where the operator console is (to watch the
run live in a browser), then a live view while it runs (agents and their states, queues, the
workflow's nodes, the room's votes, HITL, the background index, the access decisions, the
latest events), the operator's prompt for the merge, and the summary at the end (with the
run's secure mode and its principals). Without a terminal it prints one line per notable
event instead of the live view.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from types import TracebackType

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.prompt import Prompt
from rich.table import Table
from rich.text import Text

from apiary.demo.application import ApplicationSession, answer_line
from apiary.demo.job import CONSOLE_DATA, DemoResult
from apiary.demo.operator import Invocation, Verdict
from apiary.demo.principals import Member, RunPrincipals
from apiary.demo.timeline import RunState
from apiary.sdk.credentials import CONFIG_ENV
from apiary.server.config.server import DEFAULT_HTTP
from apiary.server.coordinator import Coordinator

STATE_STYLE = {
    "RUNNABLE": "green",
    "RUNNING": "bold cyan",
    "SCHEDULED": "cyan",
    "WAITING": "yellow",
    "COMPLETED": "green",
    "FAILED": "bold red",
    "SHUTTING_DOWN": "dim",
    "DEREGISTERED": "dim",
    "INITIALIZING": "yellow",
    "PENDING": "dim",
    "READY": "yellow",
    "SKIPPED": "dim",
    "APPROVED": "bold green",
    "REVISION_REQUESTED": "bold yellow",
    "ESCALATED_TO_HITL": "magenta",
    "DECIDED": "green",
    "QUEUED": "yellow",
}
REFRESH_S = 0.1


def _styled(value: str) -> Text:
    return Text(value or "-", style=STATE_STYLE.get(value, ""))


def _agents(state: RunState) -> Table:
    table = Table(title="agents", title_justify="left", expand=True)
    for column in ("agent", "role", "state", "task", "queued", "latest"):
        table.add_column(
            column, no_wrap=True, overflow="ellipsis", ratio=3 if column == "latest" else None
        )
    for view in state.agents.values():
        tasks, inbox = state.queues.get(view.agent_id, (0, 0))
        table.add_row(
            view.agent_id,
            view.role,
            _styled(view.state),
            view.task.removeprefix("workflow:"),
            f"{tasks} tasks, {inbox} msgs",
            Text(view.doing, overflow="ellipsis"),
        )
    return table


def _workflow(state: RunState) -> Text:
    text = Text("workflow ", style="bold")
    text.append(state.workflow_id or "(not created yet)")
    text.append("  ")
    for i, (node, status) in enumerate(state.nodes.items()):
        text.append(" -> " if i else "")
        text.append(f"{node} ", style="bold")
        text.append(status, style=STATE_STYLE.get(status, ""))
    if state.workflow_status:
        text.append("   ")
        text.append(state.workflow_status, style=STATE_STYLE.get(state.workflow_status, "bold"))
    return text


def _room(state: RunState) -> Table:
    table = Table(title="review room: proposals and votes", title_justify="left", expand=True)
    table.add_column("proposal", no_wrap=True)
    critics = sorted({c for p in state.proposals.values() for c in p.critics})
    for critic in critics:
        table.add_column(critic, no_wrap=True)
    table.add_column("decision", overflow="ellipsis")
    for proposal in state.proposals.values():
        votes = []
        for critic in critics:
            vote = proposal.votes.get(critic)
            votes.append(
                Text("waiting", style="dim")
                if vote is None
                else Text(
                    f"{vote.score:g} {'pass' if vote.passed else 'fail'}",
                    style="green" if vote.passed else "red",
                )
            )
        decision = _styled(proposal.outcome) if proposal.outcome else Text("collecting votes")
        table.add_row(proposal.artifact_id, *votes, decision)
    return table


def _hitl(state: RunState) -> Table:
    table = Table(title="human in the loop", title_justify="left", expand=True)
    for column in ("reason", "asked by", "about", "state", "decided by", "why"):
        table.add_column(column, overflow="ellipsis", no_wrap=column != "why")
    for view in state.hitl.values():
        table.add_row(
            view.reason_type,
            view.requested_by,
            view.subject,
            _styled(view.state),
            view.decided_by,
            f"{view.action}: {view.rationale}" if view.action else "",
        )
    return table


def _tasks(state: RunState) -> Table:
    table = Table(title="scheduler: the indexer's tasks", title_justify="left", expand=True)
    for column in ("task", "priority", "state", "progress", "attempts", "yielded"):
        table.add_column(column, no_wrap=True)
    for task in state.tasks.values():
        if task.task_id.startswith("workflow:"):
            continue
        bar = ProgressBar(total=1.0, completed=task.progress, width=24)
        table.add_row(
            task.task_id,
            str(task.priority),
            _styled(task.state),
            bar,
            str(task.attempts),
            str(task.yielded),
        )
    return table


def secure_mode(principals: int) -> str:
    """What the run's secure mode is, in one line."""
    return (
        f"TLS + mTLS on gRPC and HTTP, {principals} principals with certificates of the "
        "run's own CA, every envelope signed (Ed25519), default-deny authorization"
    )


def render(state: RunState) -> RenderableType:
    seconds = state.last_ts - state.started_ts if state.started_ts else 0.0
    header = Text.assemble(
        ("apiary demo", "bold"),
        f"   coordinator {state.coordinator or '(starting)'}",
        f"   {seconds:.1f} s   {state.messages_routed} messages routed",
        f"   {state.counts['preemptions']} preemptions   {state.counts['tool_calls']} tool calls",
        ("\nsecure", "bold green"),
        f"   mTLS, {state.principals} principals, signing on   "
        f"{state.counts['access:allowed']} calls authorized, ",
        (f"{state.denials} refused", "bold red" if state.denials else ""),
    )
    recent = Panel(Text("\n".join(state.recent)), title="latest events", title_align="left")
    return Group(
        header, _agents(state), _workflow(state), _room(state), _hitl(state), _tasks(state), recent
    )


def _request(invocation: Invocation) -> Panel:
    """What the operator is asked to decide."""
    context, subject = invocation.context, invocation.subject
    if invocation.reason_type == "TOOL_PRIVILEGE_ESCALATION":
        text = Text.assemble(
            f"{invocation.requested_by} asks to run "
            f"{subject.get('provider_id')}/{subject.get('tool_name')} with ",
            (", ".join(context.get("reasons", [])), "bold red"),
            f"\narguments: {context.get('args_excerpt', '')}",
            f"\nwhy it needs you: {context.get('risk', '')}",
            "\nApproving lets the tool run; denying fails the call with permission_denied.",
        )
    else:
        text = Text(f"{invocation.requested_by} asks: {json.dumps(subject)}\n{json.dumps(context)}")
    return Panel(
        text,
        title=f"HITL {invocation.reason_type}  {invocation.invocation_id}",
        border_style="magenta",
    )


def _reason(console: Console, action: str) -> str:
    """The operator's reason: required for a denial, a default offered for an approval."""
    question = "reason (recorded in the audit trail)"
    if action == "approve":
        default = "reviewed in the room: the critics' ruff and pytest runs pass"
        return Prompt.ask(question, console=console, default=default)
    while True:
        reason = Prompt.ask(question, console=console).strip()
        if reason:
            return reason


class DemoView:
    """The live view (in a terminal) or plain progress lines (otherwise)."""

    def __init__(self, console: Console, *, live: bool) -> None:
        self.console = console
        self._live = Live(console=console, auto_refresh=False) if live else None
        self._printed = 0
        self._rendered_at = 0.0
        self._state: RunState | None = None
        self._deferred: asyncio.TimerHandle | None = None

    def __enter__(self) -> DemoView:
        if self._live is not None:
            self._live.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._live is not None:
            if self._state is not None:
                self._live.update(render(self._state), refresh=True)
            self._live.stop()

    def update(self, state: RunState) -> None:
        self._state = state
        if self._live is None:
            for line in state.lines[self._printed :]:
                self.console.print(line, highlight=False, markup=False, soft_wrap=True)
            self._printed = len(state.lines)
        elif time.monotonic() - self._rendered_at >= REFRESH_S:
            self._render()
        elif self._deferred is None:  # throttled: draw the latest state a little later
            self._deferred = asyncio.get_running_loop().call_later(REFRESH_S, self._render)

    def _render(self) -> None:
        self._deferred = None
        self._rendered_at = time.monotonic()
        if self._live is not None and self._live.is_started and self._state is not None:
            self._live.update(render(self._state), refresh=True)

    async def ask(self, invocation: Invocation) -> Verdict:
        """The person at the terminal decides (the live view pauses meanwhile)."""
        if self._live is not None:
            self._live.stop()
        self.console.print(_request(invocation))
        action = await asyncio.to_thread(
            Prompt.ask,
            "approve or deny",
            console=self.console,
            choices=["approve", "deny"],
            default="approve",
        )
        reason = await asyncio.to_thread(_reason, self.console, action)
        if self._live is not None:
            self._live.start()
        return Verdict(action, reason)

    def started(self, coordinator: Coordinator, principals: RunPrincipals) -> None:
        """The coordinator serves: say where its console is, before any agent starts."""
        self.console.print(
            console_line(str(coordinator.http_address), principals),
            highlight=False, markup=False, soft_wrap=True,
        )  # fmt: skip

    async def linger(self, coordinator: Coordinator, result: DemoResult) -> None:
        """Print the summary, then keep the coordinator serving until Ctrl-C (--keep)."""
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        # First: from here on a Ctrl-C ends the wait (and the demo) cleanly.
        loop.add_signal_handler(signal.SIGINT, stop.set)
        try:
            if self._live is not None:
                self._live.stop()
            self.summary(result)
            self._keep_panel(coordinator, result)
            await stop.wait()
        finally:
            loop.remove_signal_handler(signal.SIGINT)

    def _keep_panel(self, coordinator: Coordinator, result: DemoResult) -> None:
        workflow = self._state.workflow_id if self._state else "ID"
        text = (
            f"The coordinator keeps serving this run at grpc={coordinator.grpc_address} "
            f"http={coordinator.http_address}, in secure mode: a call needs a principal's "
            "certificate. In another terminal:\n"
        )
        if result.principals is not None:
            text += look_again(
                result,
                result.principals,
                workflow,
                str(coordinator.grpc_address),
                str(coordinator.http_address),
            )
            text += "\n"
        self.console.print(
            Panel(text + "Press Ctrl-C to stop it.", title="--keep", border_style="cyan")
        )

    def summary(self, result: DemoResult) -> None:
        self.console.print(summary_table(result))
        if result.application is not None:
            self.console.print(
                evidence_line(result.application), highlight=False, markup=False, soft_wrap=True
            )
        if result.ok:
            self.console.print(
                "[bold green]demo ok[/]: the fix is merged into main and its tests pass"
            )
            return
        self.console.print(f"[bold red]demo failed:[/] {result.reason}")
        if result.excerpt:
            self.console.print("the event log says:")
            for event in result.excerpt:
                self.console.print(
                    f"  #{event.sequence} {event.event_type} ({event.actor}) {dict(event.details)}",
                    highlight=False,
                    markup=False,
                    soft_wrap=True,
                )
        for agent_id, tail in result.logs.items():
            if tail and agent_id in result.reason:
                self.console.print(Panel(tail, title=f"{agent_id}'s log (end)"))


def evidence_line(session: ApplicationSession) -> str:
    """Where the application's evidence export is (one line, never wrapped: a path to copy)."""
    return (
        f"evidence export: {session.evidence} ({session.events} events of runtime session "
        f"{session.session_id}; digests {', '.join(session.digests)})"
    )


def console_line(http: str, principals: RunPrincipals) -> str:
    """Where the operator console is, and what a browser needs to open it (the run is in
    secure mode: mTLS on the HTTP port too)."""
    driver = principals.driver
    return (
        f"console: https://{http}/console (watch the run live)\n"
        f"  a browser presents {driver.principal.label}'s certificate {driver.tls.cert} and key "
        f"{driver.tls.key}, and trusts {principals.ca} (docs/demo.md)"
    )


def _as(member: Member) -> str:
    return f"{CONFIG_ENV}={member.client_config}"


def look_again(
    result: DemoResult, principals: RunPrincipals, workflow: str, grpc: str = "", http: str = ""
) -> str:
    """The commands that read the run as its principals (each by its client configuration:
    the run's CA and the principal's certificate), at `grpc` and `http` (default: the ports
    `apiary serve` takes)."""
    driver, operator = principals.driver, principals.operator(result.state.operator)
    flag = f" --coordinator {grpc}" if grpc else ""
    https = f"https://{http or DEFAULT_HTTP}"
    lines = [
        f"{_as(driver)} apiary events{flag}",
        f"{_as(driver)} apiary workflow status {workflow}{flag}",
        f"{_as(driver)} apiary room list{flag}",
        f"{_as(operator)} apiary hitl list --all{flag}",
        f"curl --cacert {principals.ca} --cert {driver.tls.cert} --key {driver.tls.key} "
        f"{https}{CONSOLE_DATA}",
    ]
    if result.console:
        lines.append(f"console: {https}{result.console} (the browser presents a certificate)")
    return "\n".join(lines)


def summary_table(result: DemoResult) -> Table:
    state = result.state
    table = Table(title="apiary demo: what happened", show_header=False, title_justify="left")
    table.add_column("what", style="bold", no_wrap=True)
    table.add_column("", overflow="fold")
    repo = result.repo
    if repo is not None:
        table.add_row(
            "repository",
            f"{result.data_dir / 'repo'}: main at {repo.head[:12]}, "
            f"{'fix merged' if repo.merged else 'fix NOT merged'}; "
            f"pytest: {repo.tests}; ruff: {repo.lint[:120]}",
        )
        table.add_row("history of main", "\n".join(repo.log))
    nodes = " -> ".join(f"{n} {s}" for n, s in state.nodes.items())
    table.add_row("workflow", f"{state.workflow_id or 'none'} {state.workflow_status}: {nodes}")
    for proposal in state.proposals.values():
        said = "; ".join(v.said for v in proposal.votes.values() if v.said)
        votes = ", ".join(f"{c} {v.score:g}" for c, v in proposal.votes.items())
        table.add_row(
            f"review {proposal.artifact_id.partition('@')[2]}",
            f"{proposal.outcome or 'undecided'} ({votes}){': ' + said if said else ''}",
        )
    for view in state.hitl.values():
        table.add_row(
            f"HITL {view.reason_type}",
            f"{view.subject}: {view.action or view.state} "
            f"by {view.decided_by or '-'}: {view.rationale}",
        )
    for task in state.tasks.values():
        if not task.task_id.startswith("workflow:"):  # the id is the coordinator's: long
            table.add_row(
                f"task, priority {task.priority}",
                f"{task.task_id} for {task.agent_id}: {task.state}, "
                f"{task.attempts} attempt(s), yielded {task.yielded}x",
            )
    if result.application is not None:
        session = result.application
        table.add_row(
            "runtime session",
            f"{session.session_id}, a thread bound to the indexer: "
            + "; ".join(answer_line(o) for o in session.outcomes),
        )
    tools = ", ".join(
        f"{k.removeprefix('tool:')} x{v}"
        for k, v in sorted(state.counts.items())
        if k.startswith("tool:")
    )
    table.add_row("tool calls", f"{state.counts['tool_calls']} ({tools})")
    acks = ", ".join(
        f"{k.removeprefix('ack:')} {v}"
        for k, v in sorted(state.counts.items())
        if k.startswith("ack:")
    )
    table.add_row("messages routed", str(state.messages_routed))
    table.add_row("acks", acks or "none")
    table.add_row("preemptions", str(state.counts["preemptions"]))
    table.add_row("HITL decisions", str(state.counts["hitl_decisions"]))
    principals = result.principals
    if principals is not None:
        table.add_row("security", f"secure mode: {secure_mode(len(principals.members))}")
        for member in principals.members:
            table.add_row(
                f"  {member.principal.label}",
                f"roles: {member.roles}; {member.does}"
                + ("; signs with its own key" if member.signing_key is not None else ""),
            )
    mechanisms = ", ".join(
        f"{k.removeprefix('access:by:')} {v}"
        for k, v in sorted(state.counts.items())
        if k.startswith("access:by:")
    )
    table.add_row(
        "access decisions",
        f"{state.counts['access:allowed']} authorized"
        + (f" ({mechanisms})" if mechanisms else "")
        + f", {state.denials} refused",
    )
    table.add_row("events logged", str(len(result.events)))
    table.add_row("time", f"{result.seconds:.1f} s")
    table.add_row("logs", f"{result.data_dir / 'logs'} (one per agent, and the coordinator's)")
    again = f"apiary serve --config {result.config_file}"
    if principals is not None:
        again += "\nthen:\n" + look_again(result, principals, state.workflow_id)
    table.add_row("look again", again)
    return table
