"""The control plane's task commands (create_task ... unlink_tasks, docs/control-plane.md):
runtime agent tasks owned by the calling principal, in one of its sessions, run as Scheduler
tasks (one per run; controlplane/task_runs.py) and answered in the contract's task shape.

A task is its owner's (an operator with `tasks` acts on anyone's, as on sessions); another
principal is answered as if it did not exist. Its assigned agent may also report progress
and complete or fail the run it holds. Each command runs with the control plane's lock, and
an `idempotency_key` keeps its first effect (controlplane/task_requests.py).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, Final

from apiary.controlplane.binding import check_agent
from apiary.controlplane.facts import FactWriter
from apiary.controlplane.reads import Reads
from apiary.controlplane.settings import RuntimeSettings
from apiary.controlplane.task_links import check_edge, link_fact
from apiary.controlplane.task_requests import (
    AppendTaskProgress,
    CancelTask,
    CreateTask,
    Keyed,
    LinkTasks,
    Reconcile,
    TaskAction,
    UpdateTask,
)
from apiary.controlplane.task_runs import CancelChildren, TaskRuns
from apiary.core.access.principal import Principal, PrincipalKind
from apiary.core.clock import Clock
from apiary.core.ids import IdGenerator
from apiary.core.runtime.events import RuntimeEventType
from apiary.core.runtime.log import Fact
from apiary.core.runtime.records import SessionRecord, may_use, owner_of
from apiary.core.runtime.task_records import (
    TASK_LINKS,
    CommandKeyRecord,
    LinkKind,
    LinkStatus,
    RuntimeTaskRecord,
    TaskLinkRecord,
)
from apiary.core.runtime.task_views import meta, runtime_task_view
from apiary.core.runtime.tasks import (
    Intent,
    RuntimeTaskInput,
    RuntimeTaskMachine,
    RuntimeTaskState,
)
from apiary.core.scope_overlap import parse_scope
from apiary.engine.registry import Registry
from apiary.engine.scheduler.scheduler import Scheduler
from apiary.errors import (
    AlreadyCompletedError,
    AlreadyExistsError,
    AlreadyInProgressError,
    NotFoundError,
    ValidationError,
)
from apiary.store.protocols import RuntimeStore

_T = RuntimeEventType
_I = RuntimeTaskInput
_S = RuntimeTaskState
CloseSubagent = Callable[[str, str, str, str], Awaitable[bool]]
CREATE_KEY: Final = "task:"
"""create_task keeps its task_id as its idempotency key under this prefix."""


def no_task(task_id: str) -> NotFoundError:
    return NotFoundError(f"no task {task_id!r}", {"field": "task_id", "task_id": task_id})


def _ended(task: RuntimeTaskRecord) -> AlreadyCompletedError:
    return AlreadyCompletedError(
        f"task {task.task_id} has ended ({task.state})",
        {"field": "task_id", "task_id": task.task_id, "state": task.state},
    )


class TaskCommands:
    """The task commands of one control plane (module docstring)."""

    def __init__(
        self, facts: FactWriter, scheduler: Scheduler, registry: Registry, reads: Reads,
        clock: Clock, ids: IdGenerator, settings: RuntimeSettings, lock: asyncio.Lock,
    ) -> None:  # fmt: skip
        self._store: RuntimeStore = facts.store
        self._registry = registry
        self._reads = reads
        self._clock = clock
        self._ids = ids
        self._settings = settings
        self._lock = lock
        self.runs = TaskRuns(facts, scheduler, clock, ids, lock)
        self.runs.cancel_children = self._cancel_children
        self._propagate = True
        """cancel_task's `propagate` while it runs (the lock is held)."""
        self.close_subagent: CloseSubagent | None = None
        """Subagents.close_named: a cancelled task's subagent edges close their subagents."""
        self.cancel_jobs: CancelChildren | None = None
        """Cancels the jobs a cancelled task is the parent of (controlplane/jobs.py)."""

    # ------------------------------------------------------------------ shared

    async def _keyed(
        self, caller: Principal, command: str, req: Keyed, key: str,
        run: Callable[[], Awaitable[dict[str, Any]]],
    ) -> dict[str, Any]:  # fmt: skip
        """Run `run` under the lock, once per idempotency key (the module docstring)."""
        async with self._lock:
            if key:
                owner = owner_of(caller)
                known = await self._store.command_key(owner, key)
                digest = req.digest()
                if known is not None:
                    field = "task_id" if key.startswith(CREATE_KEY) else "idempotency_key"
                    if known.command != command or known.digest != digest:
                        raise AlreadyExistsError(
                            f"{field} {key.removeprefix(CREATE_KEY)!r} was used for another "
                            "request; a retry sends the same one", {"field": field},
                        )  # fmt: skip
                    task_id = str(json.loads(known.answer_json).get("taskId", ""))
                    return await self._answer(task_id, replayed=True, created=False)
                self.runs.pending_key = CommandKeyRecord(
                    owner, key, command, digest, "{}", self._clock.now()
                )
            try:
                answer = await run()
                if self.runs.pending_key is not None:  # nothing was written: keep it alone
                    ids = json.dumps({"taskId": answer["task"]["taskId"]})
                    self.runs.pending_key = replace(self.runs.pending_key, answer_json=ids)
                    await self.runs.commit((), [], caller.label)
            finally:
                self.runs.pending_key = None
        return answer

    def _remember(self, task_id: str) -> None:
        """The pending key answers with this task."""
        if self.runs.pending_key is not None:
            ids = json.dumps({"taskId": task_id})
            self.runs.pending_key = replace(self.runs.pending_key, answer_json=ids)

    async def _task(
        self, caller: Principal, task_id: str, *, agent: bool = False
    ) -> RuntimeTaskRecord:
        """The task when `caller` may drive it (with `agent`, its assigned agent too)."""
        task = await self._store.task(task_id)
        if task is None:
            raise no_task(task_id)
        if may_use(caller, task.owner) or (agent and self._is_agent(caller, task)):
            self._remember(task.task_id)
            return task
        raise no_task(task_id)

    @staticmethod
    def _is_agent(caller: Principal, task: RuntimeTaskRecord) -> bool:
        return (
            caller.kind is PrincipalKind.AGENT
            and bool(task.agent_id)
            and (caller.name == task.agent_id)
        )

    async def _view(self, task: RuntimeTaskRecord) -> dict[str, Any]:
        runs = await self._store.runs(task.task_id)
        links = await self._store.links(task.task_id)
        return runtime_task_view(task, runs, links).to_json()

    async def _answer(self, task_id: str, **more: Any) -> dict[str, Any]:
        task = await self._store.task(task_id)
        assert task is not None
        return {"taskId": task_id, "status": task.state, **more, "task": await self._view(task)}

    def _meta(self, task: RuntimeTaskRecord, **changes: Any) -> str:
        doc = meta(task)
        doc.update({k: v for k, v in changes.items() if v is not None})
        return json.dumps(doc, ensure_ascii=False, separators=(",", ":"))

    # ------------------------------------------------------------------ reads

    async def find(self, caller: Principal, task_id: str) -> dict[str, Any] | None:
        """The agent task `task_id` as the contract's task when `caller` may read it (its
        owner, or its agent); None when there is none (it may be a Scheduler task)."""
        task = await self._store.task(task_id)
        if task is None:
            return None
        if not (may_use(caller, task.owner) or self._is_agent(caller, task)):
            raise no_task(task_id)
        return await self._view(task)

    async def session_tasks(self, session_id: str, last: int) -> list[dict[str, Any]]:
        return [await self._view(t) for t in await self._store.session_tasks(session_id, last)]

    # ------------------------------------------------------------------ create, update

    async def create(self, caller: Principal, req: CreateTask) -> dict[str, Any]:
        key = req.idempotency_key or (CREATE_KEY + req.task_id if req.task_id else "")
        return await self._keyed(caller, "create_task", req, key, lambda: self._create(caller, req))

    async def _create(self, caller: Principal, req: CreateTask) -> dict[str, Any]:
        if req.task_id and await self._store.task(req.task_id) is not None:
            raise AlreadyExistsError(f"task_id {req.task_id!r} is taken", {"field": "task_id"})
        session, new_session = await self._session_for(caller, req)
        agent_id, capability, scope = req.agent_id, req.capability, req.scope
        if req.thread_id:
            _, thread = await self._reads.thread(caller, req.thread_id, session.session_id)
            if not (agent_id or capability):  # the thread's agent or capability queue
                agent_id, capability = thread.agent_id, thread.capability
            scope = scope or thread.scope
        if agent_id:
            await check_agent(self._registry, agent_id, "agent_id")
        parents = [req.parent_task_id] if req.parent_task_id else []
        for name, targets in (("parent_task_id", parents), ("depends_on", req.depends_on)):
            for target in targets:
                await self._target(caller, target, name)
        task_id = req.task_id or self._ids.new_id()
        self._remember(task_id)
        scope = scope or f"resource:runtime-task/{task_id}"
        parse_scope(scope)
        now = self._clock.now()
        task = RuntimeTaskRecord(
            task_id, session.session_id, owner_of(caller), _S.DRAFT.value, now, now,
            thread_id=req.thread_id, agent_id=agent_id, capability=capability, scope=scope,
            priority=req.priority, input_json=req.input_json,
            meta_json=json.dumps(req.meta.changes(), ensure_ascii=False, separators=(",", ":")),
        )  # fmt: skip
        links = tuple(
            TaskLinkRecord(task_id, kind.value, target, LinkStatus.ACTIVE.value, now, now)
            for kind, targets in ((LinkKind.PARENT, parents), (LinkKind.DEPENDENCY, req.depends_on))
            for target in targets
        )  # fmt: skip
        facts: list[Fact] = []
        if new_session:
            facts.append(Fact(_T.SESSION_CREATED, session.session_id, agent_id=agent_id,
                              payload={"owner": session.owner}))  # fmt: skip
        view = runtime_task_view(task, (), links).to_json()
        facts.append(self.runs.fact(_T.TASK_CREATED, task, payload={"agentId": agent_id or None},
                                    task=view))  # fmt: skip
        if req.meta.task_profile is not None:
            profile = {"taskProfile": req.meta.task_profile}
            facts.append(self.runs.fact(_T.TASK_PROFILE_RESOLVED, task, payload=profile))
        facts += [self._link_fact(task, link, "linked") for link in links]
        sessions = (session,) if new_session else ()
        await self.runs.commit((task,), facts, caller.label, links=links, sessions=sessions)
        if req.start:
            await self._start(caller, task, _I.START)
        return await self._answer(task_id, created=True, sessionId=session.session_id)

    async def _session_for(self, caller: Principal, req: CreateTask) -> tuple[SessionRecord, bool]:
        if req.session_id and await self._store.session(req.session_id) is not None:
            return await self._reads.session(caller, req.session_id), False
        if req.thread_id and not req.session_id:
            session, _ = await self._reads.thread(caller, req.thread_id)
            return session, False
        now = self._clock.now()
        return SessionRecord(req.session_id or self._ids.new_id(), owner_of(caller), now, now), True

    async def _target(self, caller: Principal, target_id: str, name: str) -> RuntimeTaskRecord:
        found = await self._store.task(target_id)
        if found is None or not may_use(caller, found.owner):
            raise NotFoundError(f"no task {target_id!r}", {"field": name, "task_id": target_id})
        return found

    async def update(self, caller: Principal, req: UpdateTask) -> dict[str, Any]:
        async def run() -> dict[str, Any]:
            task = await self._task(caller, req.task_id)
            state = _S(task.state)
            shaping = req.run_fields()
            if shaping and state.active:
                raise AlreadyInProgressError(
                    f"task {task.task_id} has a run in hand: {shaping[0]} shapes its next run; "
                    "pause or cancel it first", {"field": shaping[0].removesuffix("_json")},
                )  # fmt: skip
            if req.agent_id:
                await check_agent(self._registry, req.agent_id, "agent_id")
            if req.scope:
                parse_scope(req.scope)
            changes: dict[str, Any] = {"meta_json": self._meta(task, **req.meta.changes())}
            for name in shaping:
                changes[name] = getattr(req, name)
            if req.agent_id:
                changes["capability"] = ""
            if req.capability:
                changes["agent_id"] = ""
            after = replace(task, updated_at=self._clock.now(), **changes)
            changed = [*req.meta.changes(), *(n.removesuffix("_json") for n in shaping)]
            facts = [self.runs.fact(_T.TASK_UPDATED, after, payload={"changed": changed})]
            if req.meta.task_profile is not None:
                profile = {"taskProfile": req.meta.task_profile}
                facts.append(self.runs.fact(_T.TASK_PROFILE_RESOLVED, after, payload=profile))
            await self.runs.commit((after,), facts, caller.label)
            return await self._answer(task.task_id, changed=changed)

        return await self._keyed(caller, "update_task", req, req.idempotency_key, run)

    # ------------------------------------------------------------------ runs

    async def act(self, caller: Principal, command: str, req: TaskAction) -> dict[str, Any]:
        """start_task, resume_task, retry_task, pause_task."""

        async def run() -> dict[str, Any]:
            task = await self._task(caller, req.task_id)
            if command == "pause_task":
                await self._pause(caller, task, req.reason)
            else:
                event = {"start_task": _I.START, "resume_task": _I.RESUME,
                         "retry_task": _I.RETRY}[command]  # fmt: skip
                await self._start(caller, task, event, req.reason)
            return await self._answer(task.task_id)

        return await self._keyed(caller, command, req, req.idempotency_key, run)

    async def _start(
        self, caller: Principal, task: RuntimeTaskRecord, event: RuntimeTaskInput,
        reason: str = "",
    ) -> None:  # fmt: skip
        state = _S(task.state)
        if not RuntimeTaskMachine.allows(state, event):
            self._refuse(task, event)
        if not (task.agent_id or task.capability):
            raise ValidationError.for_field(
                "agent_id", f"task {task.task_id} names no agent (or capability) to run on: "
                "update_task sets one",
            )  # fmt: skip
        waiting = [
            link.target_id for link in await self._store.links(task.task_id)
            if link.kind == LinkKind.DEPENDENCY and link.status == LinkStatus.ACTIVE
            and not await self._completed(link.target_id)
        ]  # fmt: skip
        if waiting:
            raise ValidationError.for_field(
                "task_id", f"task {task.task_id} depends on {', '.join(waiting)}, not completed "
                "yet: start it once they complete, or unlink_tasks", waitingFor=",".join(waiting),
            )  # fmt: skip
        await self.runs.apply(task, event, caller.label, intent_reason=reason)

    async def _completed(self, task_id: str) -> bool:
        found = await self._store.task(task_id)
        return found is not None and found.state == _S.COMPLETED

    @staticmethod
    def _refuse(task: RuntimeTaskRecord, event: RuntimeTaskInput) -> None:
        state = _S(task.state)
        details = {"field": "task_id", "task_id": task.task_id, "state": task.state}
        if state is _S.COMPLETED or (state.terminal and event is not _I.RETRY):
            raise AlreadyCompletedError(
                f"task {task.task_id} has ended ({task.state})"
                + ("; retry_task runs it again" if state is not _S.COMPLETED else ""), details,
            )  # fmt: skip
        if state.active:
            raise AlreadyInProgressError(
                f"task {task.task_id} is {task.state}: a run is in hand", details
            )
        need = {_I.START: "draft", _I.RESUME: "paused", _I.RETRY: "failed or cancelled",
                _I.PAUSE: "queued or running", _I.COMPLETE: "not running",
                _I.FAIL: "not running"}.get(event, "in another state")  # fmt: skip
        raise ValidationError.for_field(
            "task_id", f"task {task.task_id} is {task.state}; {event.value.lower()} needs it "
            f"{need}", state=task.state,
        )  # fmt: skip

    async def _pause(self, caller: Principal, task: RuntimeTaskRecord, reason: str) -> None:
        if not RuntimeTaskMachine.allows(_S(task.state), _I.PAUSE) or task.intent:
            if task.intent == Intent.PAUSE:
                return  # asked already: the run's end tells
            self._refuse(task, _I.PAUSE)
        why = reason or f"paused by {caller.label}"
        await self.runs.apply(task, _I.PAUSE, caller.label, intent=Intent.PAUSE.value,
                              intent_reason=why)  # fmt: skip

    async def cancel(self, caller: Principal, req: CancelTask) -> dict[str, Any]:
        async def run() -> dict[str, Any]:
            task = await self._task(caller, req.task_id)
            if task.intent == Intent.CANCEL or task.state == _S.CANCELLING:
                return await self._answer(task.task_id, cancel="requested")
            if _S(task.state).terminal:
                raise _ended(task)
            why = req.reason or f"cancelled by {caller.label}"
            self._propagate = req.propagate
            try:
                after = await self.runs.apply(
                    task, _I.CANCEL, caller.label, intent=Intent.CANCEL.value, intent_reason=why
                )
            finally:
                self._propagate = True
            done = "cancelled" if after.state == _S.CANCELLED else "requested"
            return await self._answer(task.task_id, cancel=done)

        return await self._keyed(caller, "cancel_task", req, req.idempotency_key, run)

    async def _cancel_children(self, parent: RuntimeTaskRecord, actor: str) -> None:
        """Cancel the parent's child tasks that have not ended (each records its intent
        first, then stops its run and its own children), then its child jobs, then close the
        subagents its `subagent` edges name (each child turn's interrupt recorded first)."""
        if not self._propagate:
            return
        children = {
            link.task_id for link in await self._store.links_to(parent.task_id)
            if link.kind == LinkKind.PARENT and link.status == LinkStatus.ACTIVE
        } | {
            link.target_id for link in await self._store.links(parent.task_id)
            if link.kind == LinkKind.CHILD and link.status == LinkStatus.ACTIVE
        }  # fmt: skip
        for child_id in sorted(children):
            child = await self._store.task(child_id)
            if child is None or child.intent == Intent.CANCEL:
                continue
            if not RuntimeTaskMachine.allows(_S(child.state), _I.CANCEL):
                continue
            why = f"its parent task {parent.task_id} was cancelled"
            await self.runs.apply(child, _I.CANCEL, actor, intent=Intent.CANCEL.value,
                                  intent_reason=why)  # fmt: skip
        if self.cancel_jobs is not None:
            await self.cancel_jobs(parent, actor)
        await self._close_subagents(parent, actor)

    async def _close_subagents(self, parent: RuntimeTaskRecord, actor: str) -> None:
        if self.close_subagent is None:
            return
        why = f"its task {parent.task_id} was cancelled"
        for link in await self._store.links(parent.task_id):
            if link.kind == LinkKind.SUBAGENT and link.status == LinkStatus.ACTIVE:
                await self.close_subagent(link.target_id, parent.owner, why, actor)

    # ------------------------------------------------------------------ progress, outcome

    async def progress(self, caller: Principal, req: AppendTaskProgress) -> dict[str, Any]:
        async def run() -> dict[str, Any]:
            task = await self._task(caller, req.task_id, agent=True)
            if _S(task.state).terminal:
                raise _ended(task)
            now = self._clock.now()
            doc = meta(task)
            progress = dict(doc.get("progress") or {})
            counters = {**(progress.get("counters") or {}), **(req.counters or {})}
            given = (("phase", req.phase), ("summary", req.summary), ("percent", req.percent),
                     ("counters", counters or None))  # fmt: skip
            for key, value in given:
                if value:
                    progress[key] = value
            progress["updatedAt"] = now
            delivery = {**(doc.get("deliveryState") or {}), **(req.delivery_state or {})}
            after = replace(task, updated_at=now, meta_json=self._meta(
                task, progress=progress, deliveryState=delivery or None))  # fmt: skip
            runs: tuple[Any, ...] = ()
            facts = [self.runs.fact(_T.TASK_PROGRESS, after, payload=_shown(req),
                                    taskProgress=progress, phase=req.phase or None)]  # fmt: skip
            if req.delivery_state:
                facts[0] = replace(facts[0], extra={**facts[0].extra, "deliveryState": delivery})
            if req.output_refs:
                current = (
                    await self._store.run(task.current_run_id) if task.current_run_id else None
                )
                if current is not None:
                    outputs = [*json.loads(current.outputs_json or "[]"), *req.output_refs]
                    runs = (replace(current, updated_at=now, outputs_json=json.dumps(outputs)),)
                else:
                    artifacts = [*(doc.get("artifacts") or []), *req.output_refs]
                    after = replace(after, meta_json=self._meta(after, artifacts=artifacts))
                facts.append(self.runs.fact(_T.ARTIFACT_CHANGED, after,
                                            payload={"outputRefs": req.output_refs}))  # fmt: skip
            await self.runs.commit((after,), facts, caller.label, runs)
            return await self._answer(task.task_id)

        return await self._keyed(caller, "append_task_progress", req, req.idempotency_key, run)

    async def reconcile(self, caller: Principal, command: str, req: Reconcile) -> dict[str, Any]:
        """complete_task, fail_task."""

        async def run() -> dict[str, Any]:
            task = await self._task(caller, req.task_id, agent=True)
            failing = command == "fail_task"
            outcome = _S.FAILED if failing else _S.COMPLETED
            state = _S(task.state)
            if state.active:
                await self._agent_outcome(caller, task, req, failing)
            elif state is outcome:
                pass  # reconciled again: what it brings along is merged below
            elif state.terminal:
                raise _ended(task)
            else:
                event = _I.FAIL if failing else _I.COMPLETE
                if not RuntimeTaskMachine.allows(state, event):
                    self._refuse(task, event)
                changes: dict[str, Any] = {"status_reason": req.summary or req.message}
                if failing:
                    changes.update(error_code=req.error_code, message=req.message)
                else:
                    changes["result_json"] = req.result_json
                await self.runs.apply(task, event, caller.label, **changes)
            await self._along(caller, req)
            return await self._answer(task.task_id)

        return await self._keyed(caller, command, req, req.idempotency_key, run)

    async def _agent_outcome(
        self, caller: Principal, task: RuntimeTaskRecord, req: Reconcile, failing: bool
    ) -> None:
        """The run's outcome from the agent that holds it, through the Scheduler."""
        if not self._is_agent(caller, task):
            raise AlreadyInProgressError(
                f"task {task.task_id} has a run in hand ({task.state}): its agent completes "
                "or fails it, or cancel_task stops it",
                {"field": "task_id", "task_id": task.task_id, "state": task.state},
            )  # fmt: skip
        await self.runs.complete_run(
            task, caller.name, result="" if failing else req.result_json,
            error_code=req.error_code if failing else "", message=req.message or req.summary,
        )  # fmt: skip

    async def _along(self, caller: Principal, req: Reconcile) -> None:
        """Merge the artifacts, evidence and delivery state an outcome brings along."""
        if not (req.artifacts or req.evidence_refs or req.delivery_state):
            return
        task = await self._store.task(req.task_id)
        assert task is not None
        doc = meta(task)
        artifacts = [*(doc.get("artifacts") or []), *(req.artifacts or [])]
        evidence = list(
            dict.fromkeys([*(doc.get("evidenceRefs") or []), *(req.evidence_refs or [])])
        )
        delivery = {**(doc.get("deliveryState") or {}), **(req.delivery_state or {})}
        after = replace(task, updated_at=self._clock.now(), meta_json=self._meta(
            task, artifacts=artifacts or None, evidenceRefs=evidence or None,
            deliveryState=delivery or None))  # fmt: skip
        facts = []
        if req.artifacts:
            facts.append(self.runs.fact(_T.ARTIFACT_CHANGED, after,
                                        payload={"artifacts": req.artifacts}))  # fmt: skip
        if req.evidence_refs:
            facts.append(self.runs.fact(_T.EVIDENCE_CHANGED, after,
                                        payload={"evidenceRefs": req.evidence_refs}))  # fmt: skip
        if req.delivery_state:
            changed = {"changed": ["deliveryState"]}
            facts.append(
                self.runs.fact(_T.TASK_UPDATED, after, payload=changed, deliveryState=delivery)
            )
        await self.runs.commit((after,), facts, caller.label)

    # ------------------------------------------------------------------ edges

    async def link(self, caller: Principal, req: LinkTasks, *, remove: bool) -> dict[str, Any]:
        command = "unlink_tasks" if remove else "link_tasks"

        async def run() -> dict[str, Any]:
            task = await self._task(caller, req.task_id)
            known = {(x.kind, x.target_id): x for x in await self._store.links(task.task_id)}
            found = known.get((req.kind, req.target_id))
            active = found is not None and found.status == LinkStatus.ACTIVE
            if remove and not active:
                raise NotFoundError(
                    f"task {task.task_id} has no {req.kind} edge to {req.target_id!r}",
                    {"field": "target_id", "target_id": req.target_id},
                )
            if not remove and active:
                return await self._answer(task.task_id, changed=False)
            if not remove and req.kind in TASK_LINKS:
                await self._target(caller, req.target_id, "target_id")
                await check_edge(self._store, task, req, known)
            now = self._clock.now()
            link = TaskLinkRecord(
                task.task_id, req.kind, req.target_id,
                (LinkStatus.REMOVED if remove else LinkStatus.ACTIVE).value,
                found.created_at if found is not None and remove else now, now, req.reason,
            )  # fmt: skip
            fact = self._link_fact(task, link, "unlinked" if remove else "linked")
            await self.runs.commit((), [fact], caller.label, links=(link,))
            return await self._answer(task.task_id, changed=True)

        return await self._keyed(caller, command, req, req.idempotency_key, run)

    def _link_fact(self, task: RuntimeTaskRecord, link: TaskLinkRecord, action: str) -> Fact:
        return link_fact(self.runs, task, link, action)


def _shown(req: AppendTaskProgress) -> dict[str, Any]:
    shown: dict[str, Any] = {}
    for key, value in (("phase", req.phase), ("summary", req.summary), ("percent", req.percent),
                       ("counters", req.counters)):  # fmt: skip
        if value is not None and value != "":
            shown[key] = value
    return shown
