"""Whether the demo did what it shows, judged from the event log and the repository, never
from what the agents say about themselves.

Each check names the events that support it; a failed run prints the failed checks and those
events (the excerpt that explains the failure).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from apiary.core.events import Event
from apiary.demo.sample_repo import RepoState

EXCERPT_MAX = 30


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    ok: bool
    detail: str
    events: tuple[Event, ...] = ()


@dataclass
class Verdict:
    checks: list[Check] = field(default_factory=list)
    errors: list[Event] = field(default_factory=list)
    """Every event of the run that reports an error."""

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    @property
    def reason(self) -> str:
        return "; ".join(f"{c.name}: {c.detail}" for c in self.failed)

    @property
    def excerpt(self) -> list[Event]:
        """The events of the failed checks (and the errors among all), oldest first."""
        if not self.failed:
            return []
        chosen = {e.sequence: e for c in self.failed for e in c.events}
        chosen.update((e.sequence, e) for e in self.errors)
        return sorted(chosen.values(), key=lambda e: e.sequence)[-EXCERPT_MAX:]


def _of(events: list[Event], where: Callable[[Event], bool]) -> list[Event]:
    return [e for e in events if where(e)]


def _is_error(event: Event) -> bool:
    """An event that reports something going wrong (a test run's non-zero exit is an answer,
    not an error)."""
    kind, details = event.event_type, event.details
    if kind in ("task.failed", "workflow.node_failed", "workflow.failed", "dlq.added"):
        return True
    if kind == "access.decided":
        return not details.get("allowed")
    if kind == "worktree.binding":
        return details.get("input") in ("BIND_ERROR", "RETRY_ERROR")
    if kind == "tool.call_finished":
        return details.get("error_code") not in (None, "", "TOOL_FAILED")
    return False


ROUTINE = frozenset({"workflow.node_ready", "workflow.node_running"})


def check_workflow(events: list[Event]) -> Check:
    flow = _of(
        events, lambda e: e.event_type.startswith("workflow.") and e.event_type not in ROUTINE
    )
    ended = [e for e in flow if e.event_type in ("workflow.completed", "workflow.failed")]
    failures = _of(events, lambda e: e.event_type in ("task.failed", "workflow.node_failed"))
    if not flow:
        return Check("workflow", False, "no workflow was created")
    if not ended or ended[-1].event_type != "workflow.completed":
        state = ended[-1].event_type if ended else "never ended"
        why = next((str(e.details.get("error")) for e in failures if e.details.get("error")), "")
        return Check(
            "workflow",
            False,
            f"{flow[0].correlation_id} {state} {why}".strip(),
            tuple(flow + failures),
        )
    return Check("workflow", True, f"{flow[0].correlation_id} completed", tuple(flow))


def check_room(events: list[Event]) -> Check:
    room = _of(events, lambda e: e.event_type.startswith("room."))
    decided = [e for e in room if e.event_type == "room.decided"]
    outcomes = [str(e.details.get("outcome")) for e in decided]
    revised = "REVISION_REQUESTED" in outcomes
    approved = bool(outcomes) and outcomes[-1] == "APPROVED"
    if not (revised and approved):
        return Check(
            "review room",
            False,
            f"decisions {outcomes or 'none'}: expected a revision request and then an approval",
            tuple(room),
        )
    by_policy = all(e.details.get("via") == "policy" for e in decided)
    detail = f"{outcomes.count('REVISION_REQUESTED')} revision(s), then approved"
    return Check(
        "review room", by_policy, detail if by_policy else f"{detail}, not by policy", tuple(room)
    )


def check_merge(events: list[Event], operator: str) -> Check:
    hitl = _of(events, lambda e: e.event_type.startswith("hitl."))
    merges = _of(
        events,
        lambda e: (
            e.event_type == "tool.call_finished" and e.details.get("tool_name") == "git_merge"
        ),
    )
    decided = [
        e
        for e in hitl
        if e.event_type == "hitl.decided"
        and e.details.get("reason_type") == "TOOL_PRIVILEGE_ESCALATION"
    ]
    related = tuple(hitl + merges)
    if not decided:
        return Check("merge approval", False, "no HITL decision on the merge", related)
    decision = decided[-1].details.get("changes", {}).get("decision", {}).get("to", {})
    who, action = decided[-1].actor, decision.get("action")
    if action != "approve":
        why = decision.get("rationale", "")
        return Check("merge approval", False, f"{who} answered {action}: {why}", related)
    if who != operator:
        return Check("merge approval", False, f"decided by {who}, not {operator}", related)
    if not merges or merges[-1].details.get("error_code"):
        code = merges[-1].details.get("error_code") if merges else "never ran"
        return Check("merge approval", False, f"approved by {who}, but git_merge: {code}", related)
    return Check("merge approval", True, f"approved by {who}; git_merge ran", related)


def check_preemption(events: list[Event]) -> Check:
    tasks = _of(events, lambda e: e.event_type.startswith("task."))
    yielded = [
        e for e in tasks if e.event_type == "task.preemption" and e.details.get("to") == "YIELDED"
    ]
    if not yielded:
        return Check("preemption", False, "no task yielded at a safe point", tuple(tasks[-20:]))
    task_id = str(yielded[0].details["task_id"])
    own = tuple(e for e in tasks if e.details.get("task_id") == task_id)
    later = [e for e in own if e.sequence > yielded[0].sequence]
    resumed = any(e.event_type == "task.running" for e in later)
    completed = any(e.event_type == "task.completed" for e in later)
    urgent = [
        e
        for e in tasks
        if e.event_type == "task.completed"
        and e.agent_id == own[0].agent_id
        and yielded[0].sequence < e.sequence
    ]
    if not (resumed and completed and urgent):
        what = "resumed" if not resumed else "completed" if not completed else "urgent task ran"
        return Check("preemption", False, f"{task_id} yielded but never {what}", own)
    return Check("preemption", True, f"{task_id} yielded, resumed and completed", own)


def check_access(events: list[Event]) -> Check:
    """The run is in secure mode, where every call is decided and recorded: none may have
    been refused (a refusal is a principal without the credential or the role it needs)."""
    decided = _of(events, lambda e: e.event_type == "access.decided")
    denied = [e for e in decided if not e.details.get("allowed")]
    if denied:
        first = denied[0].details
        return Check(
            "access",
            False,
            f"{len(denied)} call(s) refused, the first {first.get('action')} by "
            f"{denied[0].actor}: {first.get('reason')}",
            tuple(denied),
        )
    if not decided:
        return Check("access", False, "no access decision recorded: was the run in secure mode?")
    return Check("access", True, f"{len(decided)} calls authorized, none refused")


def check_repository(repo: RepoState | None) -> Check:
    if repo is None:
        return Check("repository", False, "not checked")
    problems = [
        text
        for ok, text in (
            (repo.merged, "the approved commit is not on main"),
            (repo.tests_ok, f"tests on main: {repo.tests}"),
            (repo.lint_ok, f"ruff on main: {repo.lint[:300]}"),
            (repo.clean, "the main checkout has uncommitted changes"),
        )
        if not ok
    ]
    if problems:
        return Check("repository", False, "; ".join(problems))
    return Check("repository", True, f"fix merged at {repo.head[:12]}; {repo.tests}; ruff clean")


def judge(events: list[Event], repo: RepoState | None, operator: str) -> Verdict:
    return Verdict(
        [
            check_workflow(events),
            check_room(events),
            check_merge(events, operator),
            check_preemption(events),
            check_access(events),
            check_repository(repo),
        ],
        [e for e in events if _is_error(e)],
    )
