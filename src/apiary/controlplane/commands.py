"""The control plane's command table: every command of the contract by name, and for each
one served, how its parameters are read and which `RuntimeControl` method runs it. The HTTP
JSON routes and the JSON-RPC endpoint (server/http/runtime.py) both go through `lookup` and
`Command.__call__`, so a command behaves the same on either."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final, Generic, TypeVar

from apiary.controlplane import exports as ex
from apiary.controlplane import job_requests as jr
from apiary.controlplane import permission_requests as pr
from apiary.controlplane import process_requests as pq
from apiary.controlplane import requests as r
from apiary.controlplane import subagents as sa
from apiary.controlplane import task_requests as tr
from apiary.controlplane import thread_requests as th
from apiary.controlplane.actions import RespondAction
from apiary.controlplane.environment import ThreadQuery
from apiary.controlplane.runtime import RuntimeControl
from apiary.controlplane.settings import RuntimeSettings
from apiary.core.access.principal import Principal
from apiary.errors import NotFoundError, UnimplementedError

R = TypeVar("R")

CONTRACT_COMMANDS: Final = (
    "submit_turn", "interrupt_turn", "resume_thread", "create_task", "update_task",
    "start_task", "append_task_progress", "pause_task", "resume_task", "cancel_task",
    "retry_task", "complete_task", "fail_task", "list_tasks", "get_task", "link_tasks",
    "unlink_tasks", "respond_action", "remove_queued_turn", "promote_queued_turn",
    "get_session", "get_thread_read", "get_tool_inventory", "spawn_subagent",
    "send_subagent_input", "wait_subagents", "close_subagent", "export_evidence",
    "export_replay", "evaluate_permission", "resolve_permission", "get_execution_environment",
    "write_process_stdin", "terminate_process", "list_subagents", "create_job", "get_job",
    "cancel_job", "reconnect_channel", "ack_events", "export_review",
)  # fmt: skip
"""Every command of spec/runtime-control-plane.txt (docs/control-plane.md maps each)."""


@dataclass(frozen=True, slots=True)
class Command(Generic[R]):
    """One served command: its parameters' reader and the method that runs it."""

    name: str
    summary: str
    mutating: bool
    read: Callable[[r.Params, RuntimeSettings], R]
    run: Callable[[RuntimeControl, Principal, R], Awaitable[dict[str, Any]]]

    async def __call__(
        self, control: RuntimeControl, caller: Principal, params: object
    ) -> dict[str, Any]:
        """Run the command with `params` (a JSON object, None for none) as `caller`."""
        given = r.Params(params)
        request = self.read(given, control.settings)
        given.done()
        return await self.run(control, caller, request)


def _plain(reader: Callable[[r.Params], R]) -> Callable[[r.Params, RuntimeSettings], R]:
    return lambda params, _settings: reader(params)


_COMMANDS: list[Command[Any]] = [
    Command(
        "submit_turn", "Queue a turn on a thread (creating the session and thread when "
        "needed); it runs as a task of the thread's agent", True,
        lambda p, s: r.SubmitTurn.read(p, s.max_input_bytes), RuntimeControl.submit_turn,
    ),
    Command(
        "interrupt_turn", "Stop a turn (a queued one at once, a started one by cancelling or "
        "preempting its task); clear or preserve the thread's queued turns", True,
        _plain(th.InterruptTurn.read), RuntimeControl.interrupt_turn,
    ),
    Command(
        "remove_queued_turn", "Take a queued turn out of its thread's queue", True,
        _plain(th.RemoveQueuedTurn.read), RuntimeControl.remove_queued_turn,
    ),
    Command(
        "promote_queued_turn", "Move a queued turn ahead in its thread's queue (to the head, "
        "or ahead of before_turn_id)", True,
        _plain(th.PromoteQueuedTurn.read), lambda c, who, req: c.threads.promote(who, req),
    ),
    Command(
        "resume_thread", "Continue a thread explicitly: follow its task again when it is "
        "still active, run a turn whose task was lost again as a new turn, or start what "
        "waits", True, _plain(th.ResumeThread.read),
        lambda c, who, req: c.threads.resume(who, req),
    ),
    Command(
        "get_session", "A session's shell, snapshot and cursor", False,
        _plain(r.GetSession.read), RuntimeControl.get_session,
    ),
    Command(
        "get_thread_read", "One thread's snapshot: status, queue, last outcome, incidents, "
        "diagnostics", False, _plain(r.GetThreadRead.read), RuntimeControl.get_thread_read,
    ),
    Command(
        "list_tasks", "The Apiary tasks of a session's or a thread's turns", False,
        _plain(r.ListTasks.read), RuntimeControl.list_tasks,
    ),
    Command(
        "get_task", "One Apiary task, with its result", False,
        _plain(r.GetTask.read), RuntimeControl.get_task,
    ),
    Command(
        "export_evidence", "A session's events (a page of them) with the snapshot they lead "
        "to and a digest over them", False,
        _plain(ex.ExportEvidence.read), lambda c, who, req: c.exports.evidence(who, req),
    ),
    Command(
        "export_replay", "A session's turns in order: the input to submit again and the "
        "outcome to compare with", False,
        _plain(ex.ExportReplay.read), lambda c, who, req: c.exports.replay(who, req),
    ),
    Command(
        "export_review", "A review template of a session: an item per outcome (turns, tasks, "
        "actions, permissions) with the audit ref of its fact", False,
        _plain(ex.ExportReview.read), lambda c, who, req: c.exports.review(who, req),
    ),
    Command(
        "create_task", "Create an agent task (a draft, or started with start: true) with its "
        "objective, profile, constraints, acceptance; task_id is its idempotency key", True,
        lambda p, s: tr.CreateTask.read(p, s.max_input_bytes),
        lambda c, who, req: c.tasks.create(who, req),
    ),
    Command(
        "update_task", "Change a task's metadata (its input, agent, scope and priority while "
        "no run is in hand)", True, lambda p, s: tr.UpdateTask.read(p, s.max_input_bytes),
        lambda c, who, req: c.tasks.update(who, req),
    ),
    Command(
        "start_task", "Start a draft task: its first run is submitted to its agent", True,
        _plain(tr.TaskAction.read), lambda c, who, req: c.tasks.act(who, "start_task", req),
    ),
    Command(
        "append_task_progress", "Record a task's phase, counters, summary, delivery state or "
        "output refs", True, _plain(tr.AppendTaskProgress.read),
        lambda c, who, req: c.tasks.progress(who, req),
    ),
    Command(
        "pause_task", "Pause a task: its run is stopped (the intent recorded first)", True,
        _plain(tr.TaskAction.read), lambda c, who, req: c.tasks.act(who, "pause_task", req),
    ),
    Command(
        "resume_task", "Resume a paused task: a new run is submitted", True,
        _plain(tr.TaskAction.read), lambda c, who, req: c.tasks.act(who, "resume_task", req),
    ),
    Command(
        "cancel_task", "Cancel a task: the intent recorded first, then its run stopped and its "
        "child tasks cancelled", True, _plain(tr.CancelTask.read),
        lambda c, who, req: c.tasks.cancel(who, req),
    ),
    Command(
        "retry_task", "Run a failed or cancelled task again: a new attempt, the old kept", True,
        _plain(tr.TaskAction.read), lambda c, who, req: c.tasks.act(who, "retry_task", req),
    ),
    Command(
        "complete_task", "Complete a task (its agent's run, or the owner's reconciliation) "
        "with its result, artifacts and evidence", True,
        lambda p, s: tr.Reconcile.read_complete(p, s.max_input_bytes),
        lambda c, who, req: c.tasks.reconcile(who, "complete_task", req),
    ),
    Command(
        "fail_task", "Fail a task with its error, artifacts and evidence", True,
        _plain(tr.Reconcile.read_fail),
        lambda c, who, req: c.tasks.reconcile(who, "fail_task", req),
    ),
    Command(
        "link_tasks", "Add a parent, child, dependency, source, artifact, evidence or subagent "
        "edge to a task", True, _plain(tr.LinkTasks.read),
        lambda c, who, req: c.tasks.link(who, req, remove=False),
    ),
    Command(
        "unlink_tasks", "Remove a task's edge (kept as removed)", True,
        _plain(tr.LinkTasks.read), lambda c, who, req: c.tasks.link(who, req, remove=True),
    ),
    Command(
        "create_job", "Create a job: a batch of agent tasks (its items) of a session, started "
        "together; job_id is its idempotency key", True, jr.CreateJob.read,
        lambda c, who, req: c.jobs.create(who, req),
    ),
    Command(
        "get_job", "A job: its status, and each item's own status and output", False,
        _plain(jr.GetJob.read), lambda c, who, req: c.jobs.get(who, req),
    ),
    Command(
        "cancel_job", "Cancel a job: the intent recorded first, then its items not ended "
        "cancelled (completed ones kept)", True, _plain(jr.CancelJob.read),
        lambda c, who, req: c.jobs.cancel(who, req),
    ),
    Command(
        "respond_action", "Decide an action (a HITL invocation a turn or task waits on): "
        "approve, deny, modify (with a patch) or defer", True,
        _plain(RespondAction.read), lambda c, who, req: c.actions.respond(who, req),
    ),
    Command(
        "evaluate_permission", "Whether the thread's agent may call a tool, send a message or "
        "make a call (the tool service's checks, the message ACLs, the access rules); one that "
        "needs approval opens a HITL invocation, pending until resolved", True,
        _plain(pr.EvaluatePermission.read), lambda c, who, req: c.permissions.evaluate(who, req),
    ),
    Command(
        "resolve_permission", "Decide a pending permission (approve or deny) through the HITL "
        "engine", True, _plain(pr.ResolvePermission.read),
        lambda c, who, req: c.permissions.resolve(who, req),
    ),
    Command(
        "get_tool_inventory", "The tools the thread's agent may call: the tool catalogue as "
        "the tool ACL lets it see it, each with its descriptor", False,
        _plain(ThreadQuery.read), lambda c, who, req: c.environment.tool_inventory(who, req),
    ),
    Command(
        "get_execution_environment", "Where the thread's agent works (its worktree: cwd and "
        "workspace roots) and the sandbox, network policy and limits its tool calls run under",
        False, _plain(ThreadQuery.read),
        lambda c, who, req: c.environment.execution_environment(who, req),
    ),
    Command(
        "spawn_subagent", "A child thread of a thread, bound to another agent and linked to "
        "its parent (and turn); its first turn when input is given", True,
        lambda p, s: sa.SpawnSubagent.read(p, s.max_input_bytes),
        lambda c, who, req: c.subagents.spawn(who, req),
    ),
    Command(
        "send_subagent_input", "A turn on a subagent's thread, run by its agent", True,
        lambda p, s: sa.SubagentInput.read(p, s.max_input_bytes),
        lambda c, who, req: c.subagents.send_input(who, req),
    ),
    Command(
        "wait_subagents", "Wait until subagents settle (all, or any), or the timeout", False,
        _plain(sa.WaitSubagents.read), lambda c, who, req: c.subagents.wait(who, req),
    ),
    Command(
        "close_subagent", "Interrupt a subagent's work, cancel its queued turns and close its "
        "thread to new turns", True, _plain(sa.CloseSubagent.read),
        lambda c, who, req: c.subagents.close(who, req),
    ),
    Command(
        "list_subagents", "The parent-child graph of a session's (or a thread's) subagents, "
        "each child's state", False, _plain(sa.ListSubagents.read),
        lambda c, who, req: c.subagents.list(who, req),
    ),
    Command(
        "write_process_stdin", "Write to the standard input of a running process (a tool "
        "call of the thread's agent whose command keeps its input open); eof closes it", True,
        lambda p, s: pq.WriteProcessStdin.read(p, s.max_stdin_bytes),
        lambda c, who, req: c.processes.write_stdin(who, req),
    ),
    Command(
        "terminate_process", "Stop a running process (its tool call is cancelled: SIGTERM, "
        "then SIGKILL after the grace period)", True, _plain(pq.TerminateProcess.read),
        lambda c, who, req: c.processes.terminate(who, req),
    ),
    Command(
        "reconnect_channel", "Open or resume an event channel: the snapshot, then the events "
        "after the last acknowledged sequence", True,
        _plain(r.ReconnectChannel.read), RuntimeControl.reconnect_channel,
    ),
    Command(
        "ack_events", "Acknowledge a channel's events up to a sequence", True,
        _plain(r.AckEvents.read), RuntimeControl.ack_events,
    ),
]  # fmt: skip
COMMANDS: Final[Mapping[str, Command[Any]]] = MappingProxyType({c.name: c for c in _COMMANDS})
"""The commands this coordinator serves, by name."""


def lookup(name: str) -> Command[Any]:
    """The served command `name`; a contract command not served yet is unimplemented
    (docs/control-plane.md has its design), any other name not_found."""
    found = COMMANDS.get(name)
    if found is not None:
        return found
    if name in CONTRACT_COMMANDS:
        raise UnimplementedError(
            f"{name} is a command of the runtime contract that this coordinator does not serve "
            "yet (docs/control-plane.md maps it onto Apiary)",
            {"command": name},
        )
    raise NotFoundError(
        f"no runtime command {name[:64]!r}; GET /runtime/v1 lists them", {"command": name[:64]}
    )
