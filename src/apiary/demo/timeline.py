"""What the demo shows while it runs, folded from the coordinator's event log (and the agents'
own progress lines): agents and their lifecycle states, the workflow's nodes, the review
room's proposals and votes, HITL invocations, the Scheduler's tasks, the access decisions
(allowed and denied: the run is in secure mode) and a line per notable event. Nothing here
is made up: every field comes from an event or an agent's output.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from apiary.core.events import Event
from apiary.demo.processes import AGENTS

RECENT = 8
"""Notable lines kept for the live view."""
RESULT_LINE = "result: "
_DISPATCH_RECEIVED = "task.dispatched:received"
"""The count of dispatches whose `task.dispatched` records their message's admission."""
"""How an agent's progress line starts when it reports a task's result it got back through
the task's handle (examples/demo_agents/common.py, `say_result`): a notable line."""


@dataclass
class AgentView:
    agent_id: str
    role: str
    state: str = "starting"
    """The agent's lifecycle state (RFC 8), from agent.lifecycle events."""
    task: str = ""
    """The task it runs now."""
    doing: str = ""
    """The last progress line the agent printed."""


@dataclass
class TaskView:
    task_id: str
    agent_id: str
    priority: int = 0
    state: str = "QUEUED"
    attempts: int = 0
    yielded: int = 0
    progress: float = 0.0
    note: str = ""
    submitted_seq: int = 0
    completed_seq: int = 0


@dataclass
class VoteView:
    critic_id: str
    score: float
    passed: bool
    said: str


@dataclass
class ProposalView:
    artifact_id: str
    room_id: str
    critics: list[str]
    votes: dict[str, VoteView] = field(default_factory=dict)
    outcome: str = ""
    reason: str = ""
    via: str = ""


@dataclass
class HitlView:
    invocation_id: str
    reason_type: str
    requested_by: str
    subject: str
    state: str = "PENDING"
    decided_by: str = ""
    action: str = ""
    rationale: str = ""


@dataclass
class RunState:
    operator: str
    principals: int = 0
    """How many principals the run issued certificates for."""
    agents: dict[str, AgentView] = field(
        default_factory=lambda: {a.agent_id: AgentView(a.agent_id, a.role) for a in AGENTS}
    )
    coordinator: str = ""
    workflow_id: str = ""
    workflow_status: str = ""
    nodes: dict[str, str] = field(default_factory=dict)
    """Node id -> status, in definition order (as the nodes become known)."""
    proposals: dict[str, ProposalView] = field(default_factory=dict)
    hitl: dict[str, HitlView] = field(default_factory=dict)
    tasks: dict[str, TaskView] = field(default_factory=dict)
    queues: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Agent -> (tasks queued at the Scheduler, messages in its inbound buffer)."""
    counts: Counter[str] = field(default_factory=Counter)
    failed_messages: dict[str, str] = field(default_factory=dict)
    """Message id -> how it failed (FAILED, REJECTED or TIMED_OUT and the error code)."""
    recent: deque[str] = field(default_factory=lambda: deque(maxlen=RECENT))
    lines: list[str] = field(default_factory=list)
    """Every notable line, in order (the plain-text progress when there is no live view)."""
    started_ts: float = 0.0
    last_ts: float = 0.0
    last_sequence: int = 0

    # ------------------------------------------------------------------ inputs

    def note(self, who: str, text: str) -> None:
        line = f"{self.last_ts - self.started_ts:6.1f}s  {who:<14} {text}"
        self.recent.append(line)
        self.lines.append(line)

    def agent_line(self, agent_id: str, line: str) -> None:
        if agent_id in self.agents:
            self.agents[agent_id].doing = line
            if line.startswith(RESULT_LINE):
                self.note(agent_id, line[:200])

    def apply(self, event: Event) -> None:
        """Fold one event (each at most once, in sequence order)."""
        if event.sequence <= self.last_sequence:
            return
        self.last_sequence = event.sequence
        self.started_ts = self.started_ts or event.ts
        self.last_ts = event.ts
        kind, details = event.event_type, event.details
        self.counts[kind] += 1
        if kind == "task.dispatched" and details.get("message_state") == "RECEIVED":
            self.counts[_DISPATCH_RECEIVED] += 1  # (its admission's record: no message.received)
        area = kind.partition(".")[0]
        handler = _HANDLERS.get(area)
        if handler is not None:
            handler(self, event, kind, details)

    # ------------------------------------------------------------------ questions

    def all_runnable(self, agent_ids: Iterable[str]) -> bool:
        return all(
            self.agents.get(a, AgentView(a, "")).state in ("RUNNABLE", "SCHEDULED", "RUNNING")
            for a in agent_ids
        )

    @property
    def messages_routed(self) -> int:
        """Messages admitted: `message.received`, and the task dispatches whose
        `task.dispatched` records their admission (docs/scheduler.md, "Events of a task's
        messages")."""
        return self.counts["message.received"] + self.counts[_DISPATCH_RECEIVED]

    @property
    def denials(self) -> int:
        """Calls the coordinator refused (`access.decided` with allowed false)."""
        return self.counts["access:denied"]


# -------------------------------------------------------------------------- per area


def _agent(state: RunState, event: Event, kind: str, d: Any) -> None:
    view = state.agents.get(event.agent_id)
    if kind == "agent.registered" and event.agent_id in state.agents:
        state.note(event.agent_id, "registered")
    if view is None:
        return
    if kind == "agent.lifecycle" and view.state != "DEREGISTERED":
        view.state = str(d.get("to", view.state))
    elif kind == "agent.deregistered":
        view.state = "DEREGISTERED"


def _task(state: RunState, event: Event, kind: str, d: Any) -> None:
    task_id = str(d.get("task_id", ""))
    if not task_id:
        return
    task = state.tasks.setdefault(task_id, TaskView(task_id, event.agent_id))
    background = not task_id.startswith("workflow:")
    agent = state.agents.get(task.agent_id)
    if kind == "task.submitted":
        task.priority = int(d.get("priority", 0))
        task.submitted_seq = event.sequence
        if background:
            state.note(
                "scheduler", f"{task_id} queued for {task.agent_id} (priority {task.priority})"
            )
    elif kind == "task.running":
        task.state, task.attempts = "RUNNING", task.attempts + 1
        if agent is not None:
            agent.task = task_id
        if task.yielded:
            state.note(task.agent_id, f"resumed {task_id} (attempt {task.attempts})")
    elif kind == "task.preempt_requested":
        state.note("scheduler", f"asks {task.agent_id} to yield {task_id}: {d.get('reason', '')}")
    elif kind == "task.preemption" and d.get("to") == "YIELDED":
        task.yielded += 1
        state.counts["preemptions"] += 1
        state.note(task.agent_id, f"yielded {task_id} at a safe point")
    elif kind == "task.requeued":
        task.state = "QUEUED"
        if agent is not None and agent.task == task_id:
            agent.task = ""
    elif kind == "task.progress":
        task.progress = float(d.get("fraction", 0.0))
        task.note = str(d.get("note", ""))
    elif kind in ("task.completed", "task.failed"):
        task.state = str(d.get("state", kind.removeprefix("task.").upper()))
        task.completed_seq = event.sequence
        if task.state == "COMPLETED":
            task.progress = 1.0
        if agent is not None and agent.task == task_id:
            agent.task = ""
        if background or task.state == "FAILED":
            error = f": {d.get('error_code')} {d.get('note', '')}" if task.state == "FAILED" else ""
            state.note(task.agent_id, f"{task_id} {task.state.lower()}{error}"[:160])


def _workflow(state: RunState, event: Event, kind: str, d: Any) -> None:
    node = str(d.get("node_id", ""))
    if kind == "workflow.created":
        state.workflow_id, state.workflow_status = str(d.get("workflow_id")), "CREATED"
        state.note("planner", f"created workflow {state.workflow_id} ({d.get('nodes')} nodes)")
    elif kind == "workflow.started":
        state.workflow_status = "RUNNING"
    elif kind in ("workflow.completed", "workflow.failed"):
        state.workflow_status = str(d.get("status", kind.removeprefix("workflow.").upper()))
        state.note("workflow", f"{state.workflow_id} {state.workflow_status}")
    elif node:
        state.nodes[node] = str(d.get("status", ""))
        if kind in ("workflow.node_running", "workflow.node_completed", "workflow.node_failed"):
            error = f": {d.get('error')}" if d.get("error") else ""
            state.note("workflow", f"node {node} {state.nodes[node]}{error}"[:160])


def _room(state: RunState, event: Event, kind: str, d: Any) -> None:
    artifact = str(d.get("artifact_id", ""))
    if kind == "room.proposed":
        critics = [str(c) for c in d.get("requested_critics", [])]
        state.proposals[artifact] = ProposalView(
            artifact, str(d.get("negotiation_room_id")), critics
        )
        state.note(event.actor, f"proposed {artifact} to {', '.join(critics)}")
        return
    proposal = state.proposals.get(artifact)
    if proposal is None:
        return
    if kind == "room.voted":
        said = [*d.get("recommendations", [])][:1]
        vote = VoteView(
            str(d.get("critic_id")),
            float(d.get("score", 0)),
            bool(d.get("passed")),
            said[0] if said else "",
        )
        proposal.votes[vote.critic_id] = vote
        verdict = "pass" if vote.passed else "fail"
        state.note(vote.critic_id, f"voted {vote.score:g} ({verdict}) on {artifact}")
    elif kind == "room.decided":
        proposal.outcome, proposal.via = str(d.get("outcome")), str(d.get("via", ""))
        proposal.reason = str(d.get("reason", ""))
        state.note("room", f"{proposal.outcome}: {proposal.reason}"[:160])


def _hitl(state: RunState, event: Event, kind: str, d: Any) -> None:
    invocation_id = str(d.get("invocation_id", ""))
    if kind == "hitl.opened":
        subject = d.get("subject", {})
        what = subject.get("tool_name") or subject.get("artifact_id") or ""
        opened = HitlView(
            invocation_id, str(d.get("reason_type")), str(d.get("requested_by")), str(what)
        )
        state.hitl[invocation_id] = opened
        state.note(opened.requested_by, f"asks a human: {opened.reason_type} ({what})")
        return
    view = state.hitl.get(invocation_id)
    if view is None:
        return
    if kind == "hitl.decided":
        decision = d.get("changes", {}).get("decision", {}).get("to", {})
        view.state, view.decided_by = "DECIDED", event.actor
        view.action = str(decision.get("action", ""))
        view.rationale = str(decision.get("rationale", d.get("why", "")))
        state.counts["hitl_decisions"] += 1
        state.note(event.actor, f"{view.action} {view.subject}: {view.rationale}"[:160])
    elif kind.startswith("hitl."):
        view.state = kind.removeprefix("hitl.").upper()


def _tool(state: RunState, event: Event, kind: str, d: Any) -> None:
    if kind != "tool.call_finished":
        return
    name = f"{d.get('provider_id')}/{d.get('tool_name')}"
    ok = d.get("state") == "COMPLETED" or not d.get("error_code")
    state.counts["tool_calls"] += 1
    state.counts[f"tool:{d.get('tool_name')}"] += 1
    code = d.get("error_code")
    outcome = "ok" if ok else "non-zero exit" if code == "TOOL_FAILED" else str(code)
    state.note(event.actor, f"tool {name}: {outcome} ({d.get('duration_ms')} ms)")


def _worktree(state: RunState, event: Event, kind: str, d: Any) -> None:
    if kind == "worktree.binding" and d.get("input") == "BIND_OK":
        state.note(event.agent_id, f"bound worktree {d.get('current')}")


def _access(state: RunState, event: Event, kind: str, d: Any) -> None:
    if kind != "access.decided":
        return
    if d.get("allowed"):
        state.counts["access:allowed"] += 1
        state.counts[f"access:by:{d.get('mechanism') or 'none'}"] += 1
        return
    state.counts["access:denied"] += 1
    state.note("access", f"refused {event.actor} {d.get('action')}: {d.get('reason')}"[:160])


def _message(state: RunState, event: Event, kind: str, d: Any) -> None:
    if kind != "message.state":
        return
    stage = str(d.get("input", ""))
    if stage.startswith("ACK_"):
        state.counts[f"ack:{stage.removeprefix('ACK_')}"] += 1
    if d.get("to") in ("FAILED", "REJECTED", "TIMED_OUT"):
        state.failed_messages[str(d.get("message_id"))] = f"{d.get('to')} {d.get('error_code')}"


def _runtime(state: RunState, event: Event, kind: str, d: Any) -> None:
    """The runtime control plane's turns (the run's application, demo/application.py)."""
    turn = str(d.get("turnId", ""))
    if kind == "runtime.turn.submitted":
        state.note("application", f"turn {turn} for {event.agent_id} (runtime control plane)")
    elif kind in ("runtime.turn.completed", "runtime.turn.failed"):
        state.note(event.agent_id, f"turn {turn} {d.get('status', '')}")


_HANDLERS = {
    "agent": _agent,
    "task": _task,
    "workflow": _workflow,
    "room": _room,
    "hitl": _hitl,
    "tool": _tool,
    "worktree": _worktree,
    "message": _message,
    "access": _access,
    "runtime": _runtime,
}
