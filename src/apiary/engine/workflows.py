"""DAG workflows that run (RFC 17.7; docs/workflows.md).

CreateWorkflow validates a definition (core/workflow/definition.py, O(V + E)) and stores it.
StartWorkflow sets workflow_data and activates the roots. A READY node becomes a Scheduler
task (`Submission` to its agent, task id `workflow:<workflow>:<node>:<n>`, params: JSON
`{"workflow_id", "node_id", "attempt", "input", "event"?}` with the input mapped from
workflow_data); independent nodes are submitted together and run in parallel on their
agents. The Scheduler tells of every task's end (`Scheduler.add_end_listener`); a COMPLETED
task's FULFILLED note is the node's output, mapped into workflow_data by output_mapping; a
FAILED one is retried or fails the node (core/workflow/node.py). EVENT nodes fire on a
matching message addressed to the participant `workflow` (core/workflow/event.py), SCHEDULE
nodes on their cron time (one timer heap, engine/timers.py), MANUAL nodes on ResumeWorkflow.
CancelWorkflow ends a run for good (`cancel`). ListWorkflows and a run's history are reads
of the store and the event log (engine/workflow_reads.py, `Workflows.reads`).

Every change is stored with its `workflow.*` events (correlation id = workflow id) in one
transaction (one write per operation: the run, the nodes it touched and their events) before
it is acted on; `workflow.cancelled`, which tells what stopping the tasks did, follows the
stops. A start, resume or cancel whose write fails leaves memory as it was. After a
restart `load` rebuilds the running workflows: RUNNING nodes re-attach to their tasks (an
end that happened meanwhile is processed then), READY nodes are submitted (or found already
submitted: task ids are deterministic), timers are re-armed.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial
from typing import Any

from apiary.core.clock import Clock
from apiary.core.envelope import Envelope
from apiary.core.events import EventDraft
from apiary.core.ids import IdGenerator
from apiary.core.records import TaskRecord, TaskState
from apiary.core.workflow.data import apply_output, dump_data, node_input, parse_data, parse_output
from apiary.core.workflow.definition import TriggerType, WorkflowSpec, validate_workflow
from apiary.core.workflow.event import EventMessage, event_matches
from apiary.core.workflow.node import (
    NodeInput,
    NodeRun,
    NodeStatus,
    after_failure,
    descendants,
    task_id_for,
)
from apiary.core.workflow.run import StoredWorkflow, WorkflowRun, WorkflowStatus
from apiary.engine.deadlines import Sleep
from apiary.engine.eventlog import EventRecorder
from apiary.engine.router.router import Router
from apiary.engine.scheduler.scheduler import Scheduler, Submission
from apiary.engine.timers import Timers
from apiary.engine.workflow_live import Change, LiveWorkflow
from apiary.engine.workflow_reads import WorkflowReads
from apiary.errors import (
    AlreadyCompletedError,
    AlreadyExistsError,
    AlreadyInProgressError,
    ApiaryError,
    NotFoundError,
    ValidationError,
)
from apiary.store.errors import DuplicateWorkflowError
from apiary.store.protocols import WorkflowStore

WORKFLOW = "workflow"
"""The coordinator-internal participant EVENT messages are addressed to."""
_SEP = "\x1f"


class Workflows:
    """The workflow engine (module docstring). All changes happen under one lock."""

    def __init__(
        self,
        store: WorkflowStore,
        scheduler: Scheduler,
        router: Router,
        events: EventRecorder,
        clock: Clock,
        ids: IdGenerator,
    ) -> None:
        self._store = store
        self._scheduler = scheduler
        self._check_flow_id = router.check_flow_id
        self._events = events
        self._clock = clock
        self._ids = ids
        self._live: dict[str, LiveWorkflow] = {}
        self._by_task: dict[str, tuple[str, str]] = {}
        self._ended: deque[TaskRecord] = deque()
        self._timers = Timers()
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self.reads = WorkflowReads(store, events)
        scheduler.add_end_listener(self._task_ended)
        router.attach(WORKFLOW, self._on_event)

    # ------------------------------------------------------------------ operations

    async def create(self, spec: WorkflowSpec) -> WorkflowSpec:
        """CreateWorkflow: validate, then store (nothing is stored when invalid). An empty
        workflow_id gets a generated one."""
        if not spec.workflow_id:
            spec = replace(spec, workflow_id=self._ids.new_id())
        self._check_flow_id("workflow_id", spec.workflow_id)
        report = validate_workflow(spec)
        now = self._clock.now()
        spec = replace(spec, created_at=spec.created_at or now)
        run = WorkflowRun(spec.workflow_id, updated_at=now)
        created = self._draft(
            spec.workflow_id, "workflow.created", nodes=len(spec.nodes),
            roots=list(report.roots[:20]),
        )  # fmt: skip
        write = partial(self._store.create, spec, run, [NodeRun(key) for key in spec.nodes])
        try:
            await self._events.commit([created], write)
        except DuplicateWorkflowError:
            raise AlreadyExistsError(
                f"workflow {spec.workflow_id!r} already exists", {"workflow_id": spec.workflow_id}
            ) from None
        return spec

    async def start(
        self, workflow_id: str, data: str = "", metadata: Mapping[str, str] | None = None
    ) -> StoredWorkflow:
        """StartWorkflow: RUNNING with `data` (JSON object) as workflow_data; roots activate."""
        initial = parse_data(data)
        async with self._lock:
            stored = await self._get(workflow_id)
            if stored.run.status is WorkflowStatus.RUNNING:
                raise AlreadyInProgressError(
                    f"workflow {workflow_id!r} is already running", {"workflow_id": workflow_id}
                )
            _refuse_cancelled(stored.run, "started")
            if stored.run.status.finished:
                raise AlreadyCompletedError(
                    f"workflow {workflow_id!r} already ran ({stored.run.status}); "
                    "ResumeWorkflow runs nodes again", {"workflow_id": workflow_id},
                )  # fmt: skip
            now = self._clock.now()
            run = replace(
                stored.run, status=WorkflowStatus.RUNNING, data=dump_data(initial),
                started_at=now, updated_at=now, metadata=dict(metadata or {}),
            )  # fmt: skip
            live = LiveWorkflow(replace(stored, run=run))
            undo = self._undo(live)
            self._live[workflow_id] = live
            change = Change(events=[("workflow.started", {"roots": len(live.roots)})])
            for root in live.roots:
                live.apply(change, now, root)
            await self._commit(live, change, undo)
            return live.snapshot()

    async def state(self, workflow_id: str) -> StoredWorkflow:
        """GetWorkflowState."""
        live = self._live.get(workflow_id)
        return live.snapshot() if live is not None else await self._get(workflow_id)

    async def resume(
        self, workflow_id: str, node_id: str = "", data: str = "",
        metadata: Mapping[str, str] | None = None,
    ) -> StoredWorkflow:  # fmt: skip
        """ResumeWorkflow (docs/workflows.md): with `node_id`, fire a waiting node's trigger
        or run a finished node (and what depends on it) again; without, run every FAILED and
        SKIPPED node again. `data` (a JSON object) is merged into workflow_data first."""
        update = parse_data(data)
        async with self._lock:
            live = self._live.get(workflow_id)
            if live is None:
                stored = await self._get(workflow_id)
                if stored.run.status is WorkflowStatus.CREATED:
                    raise ValidationError.for_field(
                        "workflow_id", f"{workflow_id!r} was never started: StartWorkflow first"
                    )
                _refuse_cancelled(stored.run, "resumed")
                live = LiveWorkflow(stored)
            if node_id and node_id not in live.spec.nodes:
                raise NotFoundError(
                    f"workflow {workflow_id!r} has no node {node_id!r}",
                    {"workflow_id": workflow_id, "node_id": node_id},
                )
            now = self._clock.now()
            targets = self._resume_targets(live, node_id)
            undo = self._undo(live)
            live.data.update(update)
            live.restart(now, metadata or {})
            self._live[workflow_id] = live
            change = Change(events=[("workflow.resumed", {"node_id": node_id, "reset": targets})])
            for key in targets:
                live.apply(change, now, key, NodeInput.RESET)
            if (
                node_id
                and live.nodes[node_id].status is NodeStatus.PENDING
                and live.spec.nodes[node_id].trigger is not TriggerType.DEPENDENCY
            ):
                live.apply(change, now, node_id, NodeInput.TRIGGER)
            for key in live.nodes:
                live.apply(change, now, key)
            await self._commit(live, change, undo)
            return live.snapshot()

    async def cancel(self, workflow_id: str, reason: str = "", by: str = "") -> StoredWorkflow:
        """CancelWorkflow (docs/workflows.md): the run becomes CANCELLED for good and every
        unfinished node is cancelled (core/workflow/node.py, CANCEL). A cancelled node's task
        that waits in a queue is cancelled through the Scheduler (FAILED, `cancelled`); one
        its agent already holds cannot be ended by the Scheduler without requeueing it, so it
        is left to end and its result is not used. A finished run is refused
        (already_completed naming its status)."""
        async with self._lock:
            live = self._live.get(workflow_id)
            if live is None:
                stored = await self._get(workflow_id)
                if not stored.run.status.cancellable:
                    status = stored.run.status.value
                    raise AlreadyCompletedError(
                        f"workflow {workflow_id!r} is {status}: only a CREATED or RUNNING "
                        "workflow can be cancelled", {"workflow_id": workflow_id, "state": status},
                    )  # fmt: skip
                live = LiveWorkflow(stored)
            suffix = f": {reason}" if reason else ""
            change = Change()
            undo = self._undo(live)
            why = f"cancelled by {by or 'an anonymous caller'}{suffix}"
            live.cancel(change, self._clock.now(), why)
            stopping = [t for t in (live.nodes[n].task_id for n in change.stop) if t]
            change.events.append((
                "workflow.cancelled",
                {"status": WorkflowStatus.CANCELLED.value, "by": by, "reason": reason,
                 "tasks_to_stop": stopping[:20]},
            ))  # fmt: skip
            await self._commit(live, change, undo)
            self._live.pop(workflow_id, None)
            for key in live.nodes:
                self._timers.cancel(_key(workflow_id, key))
            note = f"workflow {workflow_id} was cancelled{suffix}"
            outcomes: dict[str, list[str]] = {
                _CANCELLED: [], _ASKED_BACK: [], _LEFT_RUNNING: [], _ENDED: []
            }  # fmt: skip
            for node_id in change.stop:
                task_id = live.nodes[node_id].task_id
                outcomes[await self._stop(task_id, note, by or WORKFLOW)].append(task_id)
            # What stopping the tasks did follows the write (the run is stored CANCELLED
            # first): a note; each task's own change commits its task.* event.
            if change.stop:
                self._events.queue(self._draft(
                    workflow_id, "workflow.tasks_stopped", by=by,
                    tasks_cancelled=outcomes[_CANCELLED][:20],
                    tasks_asked_back=outcomes[_ASKED_BACK][:20],
                    tasks_left_running=outcomes[_LEFT_RUNNING][:20],
                ))  # fmt: skip
            return live.snapshot()

    async def _stop(self, task_id: str, note: str, by: str) -> str:
        """Stop a cancelled node's task: cancelled when it waits in a queue, asked back
        when it waits at its agent unread (Scheduler.cancel), else left to its agent (or
        already ended). Its end, when it comes, is not the node's any more."""
        self._by_task.pop(task_id, None)
        try:
            task = await self._scheduler.cancel(task_id, note, by)
        except AlreadyInProgressError:  # running
            return _LEFT_RUNNING
        except (AlreadyCompletedError, NotFoundError):  # ended, or no longer stored
            return _ENDED
        return _CANCELLED if TaskState(task.state).terminal else _ASKED_BACK

    def _resume_targets(self, live: LiveWorkflow, node_id: str) -> list[str]:
        """The finished nodes a resume starts over (refused while one of them is running)."""
        if not node_id:
            return [k for k, r in live.nodes.items() if r.status in _RERUN]
        if not live.nodes[node_id].status.terminal:
            if live.nodes[node_id].status is not NodeStatus.PENDING:
                raise AlreadyInProgressError(
                    f"node {node_id!r} is {live.nodes[node_id].status}",
                    {"workflow_id": live.workflow_id, "node_id": node_id},
                )
            return []
        below = descendants(node_id, live.dependents)
        busy = [k for k in below if live.nodes[k].status in (NodeStatus.READY, NodeStatus.RUNNING)]
        if busy:
            raise AlreadyInProgressError(
                f"node {busy[0]!r}, downstream of {node_id!r}, is running",
                {"workflow_id": live.workflow_id, "node_id": busy[0]},
            )
        return [node_id, *(k for k in below if live.nodes[k].status.terminal)]

    async def _get(self, workflow_id: str) -> StoredWorkflow:
        if not workflow_id:
            raise ValidationError.for_field("workflow_id", "is required")
        stored = await self._store.get(workflow_id)
        if stored is None:
            raise NotFoundError(f"no workflow {workflow_id!r}", {"workflow_id": workflow_id})
        return stored

    # ------------------------------------------------------------------ carrying out changes

    async def _commit(
        self, live: LiveWorkflow, change: Change, undo: Callable[[], None] | None = None
    ) -> None:
        """Store with its events, arm timers, submit: what `change` asks, in that order;
        submissions make further changes, committed in turn. When the first write fails,
        `undo` puts memory back as it was before the operation (nothing of it is stored)."""
        while True:
            now = self._clock.now()
            finished = live.settle(now)
            drafts = [self._draft(live.workflow_id, t, **d) for t, d in change.events]
            if finished is not None:
                ended = f"workflow.{finished.value.lower()}"
                drafts.append(self._draft(live.workflow_id, ended, status=finished.value))
            write = partial(self._store.save, live.stored_run(), list(change.dirty.values()))
            try:
                await self._events.commit(drafts, write)
            except BaseException:
                if undo is not None:
                    undo()
                raise
            undo = None
            if finished is not None:
                self._live.pop(live.workflow_id, None)
            for node_id, due in change.timers:
                self._timers.arm(_key(live.workflow_id, node_id), due)
            submit, change = change.submit, Change()
            for node_id in submit:
                await self._submit(live, node_id, change)
            if not change.dirty:
                return

    def _draft(self, workflow_id: str, event_type: str, **details: Any) -> EventDraft:
        """A `workflow.*` event, for the store to commit with the change it records."""
        return self._events.draft(
            event_type, WORKFLOW, correlation_id=workflow_id, workflow_id=workflow_id, **details
        )

    def _undo(self, live: LiveWorkflow) -> Callable[[], None]:
        """What puts `live` (run, nodes, data) and its place among the running workflows
        back as they are now: for an operation whose write fails, so that the run goes on as
        stored (still driven when it was) and the operation can be asked again."""
        workflow_id, held = live.workflow_id, self._live.get(live.workflow_id)
        run, nodes, data = live.run, dict(live.nodes), dict(live.data)

        def undo() -> None:
            live.run, live.nodes, live.data = run, nodes, data
            if held is None:
                self._live.pop(workflow_id, None)
            else:
                self._live[workflow_id] = held

        return undo

    async def _submit(self, live: LiveWorkflow, node_id: str, change: Change) -> None:
        """Hand a READY node's next attempt to the Scheduler."""
        run = live.nodes[node_id]
        now = self._clock.now()
        if run.status is not NodeStatus.READY or run.due_at > now:
            return
        spec, options = live.spec.nodes[node_id], live.options[node_id]
        task_id = task_id_for(live.workflow_id, node_id, run.dispatches + 1)
        try:
            params = self._params(live, node_id, run)
        except ValidationError as exc:  # missing input: another attempt would not find it
            live.apply(change, now, node_id, NodeInput.FAIL, error=str(exc))
            return
        self._by_task[task_id] = (live.workflow_id, node_id)
        try:
            result = await self._scheduler.submit(
                Submission(spec.agent_id, task_id, options.priority, params,
                           "application/json", options.scope, correlation_id=live.workflow_id)
            )  # fmt: skip
            # Accepted, or held for a decision (then it may still run): either way its end
            # comes through the listener, even an end inside `submit` itself.
            accepted, why = result.accepted or result.task is not None, result.reason
            if not result.created:  # the same task submitted before a restart: re-attach
                await self._reattach(task_id)
        except AlreadyExistsError:  # submitted before a restart, otherwise: re-attach
            accepted, why = True, "already submitted"
            await self._reattach(task_id)
        except ApiaryError as exc:
            accepted, why = False, str(exc)
        if accepted:
            live.apply(change, now, node_id, NodeInput.DISPATCHED, task_id=task_id)
            return
        # Refused (unknown agent, agent shutting down, queue full...): no attempt ran, so
        # retries do not apply; ResumeWorkflow runs the node again once the cause is fixed.
        self._by_task.pop(task_id, None)
        live.apply(change, now, node_id, NodeInput.FAIL, error=f"not submitted: {why}")

    def _params(self, live: LiveWorkflow, node_id: str, run: NodeRun) -> bytes:
        spec = live.spec.nodes[node_id]
        body: dict[str, Any] = {
            "workflow_id": live.workflow_id, "node_id": node_id, "attempt": run.attempts + 1,
            "input": node_input(live.data, spec.input_mapping, f"nodes.{node_id}.input_mapping"),
            "description": f"workflow {live.workflow_id} node {node_id}",
        }  # fmt: skip
        if run.event:
            body["event"] = json.loads(run.event)
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()

    async def _reattach(self, task_id: str) -> None:
        """A task submitted earlier: if it already ended, process its end now."""
        record = await self._scheduler.find(task_id)
        if TaskState(record.state).terminal:
            self._ended.append(record)
            self._wake.set()

    # ------------------------------------------------------------------ task ends

    def _task_ended(self, task: TaskRecord) -> None:
        """Scheduler listener (inside its lock): queue the end, act on it in `drain`."""
        if task.task_id in self._by_task:
            self._ended.append(task)
            self._wake.set()

    async def drain(self) -> int:
        """Apply the task ends queued so far; returns how many were applied."""
        applied = 0
        async with self._lock:
            while self._ended:
                task = self._ended.popleft()
                found = self._by_task.pop(task.task_id, None)
                live = self._live.get(found[0]) if found else None
                if found is None or live is None:
                    continue
                run = live.nodes[found[1]]
                if run.status is not NodeStatus.RUNNING or run.task_id != task.task_id:
                    continue
                change = Change()
                self._ended_task(live, run, task, change)
                await self._commit(live, change)
                applied += 1
        return applied

    def _ended_task(
        self, live: LiveWorkflow, run: NodeRun, task: TaskRecord, change: Change
    ) -> None:
        now = self._clock.now()
        node_id = run.node_id
        error = f"{task.error_code}: {task.note}" if task.note else task.error_code
        if task.state == TaskState.COMPLETED:
            output = parse_output(task.result or task.note)  # (no result: stored before v18)
            mapping = live.spec.nodes[node_id].output_mapping
            try:
                data = apply_output(live.data, output, mapping, f"nodes.{node_id}.output_mapping")
            except ValidationError as exc:
                error = str(exc)
            else:
                live.data = data
                live.apply(change, now, node_id, NodeInput.COMPLETE, output=dump_data(output))
                return
        event, due = after_failure(run, live.options[node_id], now)
        live.apply(change, now, node_id, event, error=error or "internal_error", due_at=due)

    # ------------------------------------------------------------------ events and timers

    async def _on_event(self, env: Envelope) -> None:
        """Router endpoint: a message to `workflow` fires the EVENT nodes it matches."""
        message = EventMessage(
            env.message_id, env.message_type.name, env.producer_id, env.correlation_id,
            env.content_type, env.payload,
        )  # fmt: skip
        async with self._lock:
            fired = [
                (live, key)
                for live in list(self._live.values())
                for key in live.event_nodes
                if live.nodes[key].status is NodeStatus.PENDING and not live.nodes[key].triggered
                and _matches(live, key, message)
            ]  # fmt: skip
            if not fired:
                raise NotFoundError(
                    "no EVENT node of a running workflow waits for this message",
                    {"message_id": env.message_id},
                )
            payload = dump_data(message.summary())
            for live, key in fired:
                change = Change()
                live.apply(change, self._clock.now(), key, NodeInput.TRIGGER, payload=payload)
                live.apply(change, self._clock.now(), key)
                await self._commit(live, change)

    async def fire_due(self) -> int:
        """Cron triggers and retry delays due now; returns how many fired."""
        fired = 0
        async with self._lock:
            for key in self._timers.due(self._clock.now()):
                workflow_id, _, node_id = key.partition(_SEP)
                live = self._live.get(workflow_id)
                if live is None:
                    continue
                fired += 1
                await self._due(live, node_id)
        return fired

    async def _due(self, live: LiveWorkflow, node_id: str) -> None:
        run, now = live.nodes[node_id], self._clock.now()
        change = Change()
        if run.status is NodeStatus.READY:
            change.submit.append(node_id)
        elif run.status is NodeStatus.PENDING and run.due_at and not run.triggered:
            live.apply(change, now, node_id, NodeInput.TRIGGER)
            live.apply(change, now, node_id)
        await self._commit(live, change)

    def next_deadline(self) -> float | None:
        return self._timers.next()

    async def run(self, sleep: Sleep) -> None:
        """Forever: apply task ends as they come and fire timers when due."""
        while True:
            self._wake.clear()
            self._timers.changed.clear()
            await self.drain()
            await self.fire_due()
            if self._ended:
                continue
            at = self._timers.next()
            waits: set[asyncio.Future[Any]] = {
                asyncio.ensure_future(self._wake.wait()),
                asyncio.ensure_future(self._timers.changed.wait()),
            }
            if at is not None:
                waits.add(asyncio.ensure_future(sleep(max(0.0, at - self._clock.now()))))
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for item in waits:
                    item.cancel()

    # ------------------------------------------------------------------ restart

    async def load(self) -> int:
        """Rebuild the running workflows after a (re)start; returns how many."""
        runs: list[WorkflowRun] = []
        after = ""
        while page := await self._store.list(frozenset({"RUNNING"}), after_id=after, limit=500):
            runs.extend(page)
            after = page[-1].workflow_id
        async with self._lock:
            for run in runs:
                stored = await self._store.get(run.workflow_id)
                if stored is not None:
                    await self._reload(LiveWorkflow(stored))
            await self._cancel_orphans()
        return len(runs)

    async def _cancel_orphans(self) -> None:
        """Cancel the queued tasks of cancelled workflows: a stop a crash interrupted (the
        run is stored CANCELLED before its tasks are stopped)."""
        cancelled: dict[str, bool] = {}
        for task in self._scheduler.queued():
            workflow_id = task.flow_id
            if not task.task_id.startswith(f"{WORKFLOW}:") or workflow_id in self._live:
                continue
            if workflow_id not in cancelled:
                found = await self._store.summary(workflow_id)
                cancelled[workflow_id] = (
                    found is not None and found.status is WorkflowStatus.CANCELLED
                )
            if cancelled[workflow_id]:
                await self._stop(task.task_id, f"workflow {workflow_id} was cancelled", WORKFLOW)

    async def _reload(self, live: LiveWorkflow) -> None:
        self._live[live.workflow_id] = live
        change = Change()
        for key, run in live.nodes.items():
            if run.status is NodeStatus.RUNNING:
                self._by_task[run.task_id] = (live.workflow_id, key)
                try:
                    await self._reattach(run.task_id)
                except NotFoundError:  # the store lost it: count it as a failed attempt
                    lost = TaskRecord(run.task_id, "", 0, 0.0, 0, TaskState.FAILED, 0.0,
                                      error_code="internal_error", note="task lost")  # fmt: skip
                    self._ended.append(lost)
            elif run.status is NodeStatus.READY and run.due_at <= self._clock.now():
                change.submit.append(key)
            elif run.status is NodeStatus.READY or (
                run.status is NodeStatus.PENDING and run.due_at and not run.triggered
            ):
                change.timers.append((key, run.due_at))  # a retry delay or a cron time
            else:
                live.apply(change, self._clock.now(), key)
        await self._commit(live, change)


_RERUN = frozenset({NodeStatus.FAILED, NodeStatus.SKIPPED})
_CANCELLED, _ASKED_BACK, _LEFT_RUNNING, _ENDED = "cancelled", "asked back", "left running", "ended"
"""What stopping a cancelled node's task did."""


def _refuse_cancelled(run: WorkflowRun, verb: str) -> None:
    if run.status is WorkflowStatus.CANCELLED:
        raise AlreadyCompletedError(
            f"workflow {run.workflow_id!r} was cancelled: a cancelled workflow cannot be {verb}",
            {"workflow_id": run.workflow_id, "state": run.status.value},
        )


def _key(workflow_id: str, node_id: str) -> str:
    return f"{workflow_id}{_SEP}{node_id}"


def _matches(live: LiveWorkflow, node_id: str, message: EventMessage) -> bool:
    match = live.options[node_id].event
    return match is not None and event_matches(match, message, live.workflow_id, node_id)
