"""The control plane's job commands (create_job, get_job, cancel_job; core/runtime/jobs.py):
a job is a batch of agent tasks of one session, its items, created together with it and
started at once; each runs as the task commands run any task (controlplane/task_runs.py),
and stays a task the task commands drive (retry_task of a failed item, cancel_task of one).

Every change of an item's task status moves the job's counts in the same write and derives
the job's status by the pure rule (`TaskRuns.along`), so that the job's events follow its
items' in the log. cancel_job records the intent first (the job is CANCELLING), then cancels
its items that have not ended, each through its own intent; the job is CANCELLED, with
job.cancelled, once the last of them has stopped. Completed items stay completed. A task's
cancellation cancels the jobs it is the parent of.

A job is its owner's (an operator with `tasks` acts on anyone's); another principal is
answered as if it did not exist. `job_id` is create_job's idempotency key (a retry with the
same request answers the job as it stands, `created: false`), `idempotency_key` cancel_job's.
Each command runs with the control plane's lock.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, Final

from apiary.controlplane.binding import check_agent
from apiary.controlplane.command_keys import CommandKeys
from apiary.controlplane.facts import FactWriter
from apiary.controlplane.job_requests import CancelJob, CreateJob, GetJob, JobItem
from apiary.controlplane.reads import Reads
from apiary.controlplane.task_requests import Keyed
from apiary.controlplane.tasks import TaskCommands
from apiary.core.access.principal import Principal
from apiary.core.clock import Clock
from apiary.core.ids import IdGenerator
from apiary.core.runtime.events import RuntimeEventType
from apiary.core.runtime.job_views import job_summary, job_view
from apiary.core.runtime.jobs import (
    JobItemRecord,
    JobRecord,
    JobStatus,
    counts,
    counts_json,
    created,
    item_events,
    job_step,
    moved,
)
from apiary.core.runtime.log import Fact
from apiary.core.runtime.records import RuntimeWrite, SessionRecord, may_use, owner_of
from apiary.core.runtime.task_records import CommandKeyRecord, RuntimeTaskRecord
from apiary.core.runtime.task_views import runtime_task_view
from apiary.core.runtime.tasks import (
    Intent,
    RuntimeTaskInput,
    RuntimeTaskMachine,
    RuntimeTaskState,
)
from apiary.engine.registry import Registry
from apiary.errors import AlreadyCompletedError, AlreadyExistsError, NotFoundError

_T = RuntimeEventType
_S = RuntimeTaskState
_I = RuntimeTaskInput
CREATE_KEY: Final = "job:"
"""create_job keeps its job_id as its idempotency key under this prefix."""


def _created(command: str, created: bool) -> dict[str, bool]:
    return {"created": created} if command == "create_job" else {}


def no_job(job_id: str) -> NotFoundError:
    return NotFoundError(f"no job {job_id!r}", {"field": "job_id", "job_id": job_id})


class JobCommands:
    """The job commands of one control plane (module docstring)."""

    def __init__(
        self, facts: FactWriter, tasks: TaskCommands, reads: Reads, registry: Registry,
        clock: Clock, ids: IdGenerator, lock: asyncio.Lock,
    ) -> None:  # fmt: skip
        self._facts = facts
        self._store = facts.store
        self._runs = tasks.runs
        self._reads = reads
        self._registry = registry
        self._clock = clock
        self._ids = ids
        self._lock = lock
        self._keys = CommandKeys(facts.store, clock)
        self._runs.along = self.along
        tasks.cancel_jobs = self.cancel_children

    # ------------------------------------------------------------------ shared

    async def _keyed(
        self, caller: Principal, command: str, req: Keyed,
        run: Callable[[CommandKeyRecord | None], Awaitable[str]],
    ) -> dict[str, Any]:  # fmt: skip
        """Run `run` under the lock once per idempotency key (controlplane/command_keys.py):
        it returns the job's id and writes the key it is given with its first write; a
        retry answers that job as it stands."""
        async with self._lock:
            try:
                known, pending = await self._keys.known(caller, command, req)
            except AlreadyExistsError:
                if not req.idempotency_key.startswith(CREATE_KEY):
                    raise
                raise AlreadyExistsError(
                    f"job_id {req.idempotency_key.removeprefix(CREATE_KEY)!r} names a job "
                    "created with another request; a retry sends the same one",
                    {"field": "job_id"},
                ) from None
            if known is not None:
                job_id = str(known.get("jobId", ""))
                return await self._answer(job_id, replayed=True, **_created(command, False))
            job_id = await run(pending)
            return await self._answer(job_id, **_created(command, True))

    def _keep(self, pending: CommandKeyRecord | None, job_id: str) -> tuple[Any, ...]:
        """The key to write with the command's first write (none without a key)."""
        return self._keys.keep(pending, {"jobId": job_id})

    async def _answer(self, job_id: str, **more: Any) -> dict[str, Any]:
        job = await self._store.job(job_id)
        assert job is not None
        view = job_view(job, await self._store.job_items(job_id))
        return {"jobId": job_id, "status": job.state, "sessionId": job.session_id, **more,
                "job": view}  # fmt: skip

    async def _job(self, caller: Principal, job_id: str) -> JobRecord:
        job = await self._store.job(job_id)
        if job is None or not may_use(caller, job.owner):
            raise no_job(job_id)
        return job

    def _fact(self, kind: str, job: JobRecord, payload: dict[str, Any] | None = None) -> Fact:
        return Fact(
            kind, job.session_id, status=job.state, payload=payload,
            extra={"jobId": job.job_id, "job": job_summary(job)},
        )  # fmt: skip

    # ------------------------------------------------------------------ get_job

    async def get(self, caller: Principal, req: GetJob) -> dict[str, Any]:
        """The job with its status and its items, each with its own status and output."""
        job = await self._job(caller, req.job_id)
        return {"job": job_view(job, await self._store.job_items(job.job_id))}

    # ------------------------------------------------------------------ create_job

    async def create(self, caller: Principal, req: CreateJob) -> dict[str, Any]:
        keyed = req
        if req.job_id and not req.idempotency_key:
            keyed = replace(req, idempotency_key=CREATE_KEY + req.job_id)
        return await self._keyed(
            caller, "create_job", keyed, lambda pending: self._create(caller, req, pending)
        )

    async def _create(
        self, caller: Principal, req: CreateJob, pending: CommandKeyRecord | None
    ) -> str:
        if req.job_id and await self._store.job(req.job_id) is not None:
            raise AlreadyExistsError(f"job_id {req.job_id!r} is taken", {"field": "job_id"})
        session, new_session = await self._session_for(caller, req)
        await self._check(caller, req)
        job_id = req.job_id or self._ids.new_id()
        now = self._clock.now()
        owner = owner_of(caller)
        tasks = tuple(
            self._item_task(req, item, n, job_id, session.session_id, owner, now)
            for n, item in enumerate(req.items)
        )  # fmt: skip
        meta = {k: v for k, v in (("title", req.title), ("objective", req.objective)) if v}
        job = JobRecord(
            job_id, session.session_id, owner, JobStatus.QUEUED.value, now, now, len(tasks),
            counts_json(created(len(tasks))), json.dumps(meta, ensure_ascii=False),
            parent_task_id=req.parent_task_id,
        )  # fmt: skip
        items = tuple(JobItemRecord(job_id, n, t.task_id, now) for n, t in enumerate(tasks))
        facts: list[Fact] = []
        if new_session:
            facts.append(Fact(_T.SESSION_CREATED, session.session_id,
                              payload={"owner": session.owner}))  # fmt: skip
        facts.append(self._fact(_T.JOB_CREATED, job, {"itemCount": job.item_count}))
        for task in tasks:
            view = runtime_task_view(task, ()).to_json()
            facts.append(self._runs.fact(_T.TASK_CREATED, task, payload={
                "agentId": task.agent_id or None}, task=view, jobId=job_id))  # fmt: skip
        write = RuntimeWrite(
            sessions=(session,) if new_session else (), tasks=tasks, jobs=(job,),
            job_items=items, keys=self._keep(pending, job_id),
        )  # fmt: skip
        await self._facts.commit(write, facts, caller.label)
        for task in tasks:
            await self._runs.apply(task, _I.START, caller.label)
        return job_id

    async def _session_for(self, caller: Principal, req: CreateJob) -> tuple[SessionRecord, bool]:
        if req.session_id and await self._store.session(req.session_id) is not None:
            return await self._reads.session(caller, req.session_id), False
        now = self._clock.now()
        return SessionRecord(req.session_id or self._ids.new_id(), owner_of(caller), now, now), True

    async def _check(self, caller: Principal, req: CreateJob) -> None:
        """The job's parent task, agents and item task ids, each error naming its field."""
        if req.parent_task_id:
            parent = await self._store.task(req.parent_task_id)
            if parent is None or not may_use(caller, parent.owner):
                raise NotFoundError(f"no task {req.parent_task_id!r}",
                                    {"field": "parent_task_id"})  # fmt: skip
        named = [("agent_id", req.agent_id)] + [
            (f"items[{n}].agent_id", item.agent_id) for n, item in enumerate(req.items)
        ]
        known: set[str] = set()
        for field, agent_id in named:
            if agent_id and agent_id not in known:
                await check_agent(self._registry, agent_id, field)
                known.add(agent_id)
        for n, item in enumerate(req.items):
            if item.task_id and await self._store.task(item.task_id) is not None:
                raise AlreadyExistsError(f"task_id {item.task_id!r} is taken",
                                         {"field": f"items[{n}].task_id"})  # fmt: skip

    def _item_task(
        self, req: CreateJob, item: JobItem, n: int, job_id: str, session_id: str, owner: str,
        now: float,
    ) -> RuntimeTaskRecord:  # fmt: skip
        task_id = item.task_id or self._ids.new_id()
        agent_id = item.agent_id or ("" if item.capability else req.agent_id)
        capability = item.capability or ("" if item.agent_id else req.capability)
        meta = {"title": item.title or (f"{req.title} #{n + 1}" if req.title else ""),
                "objective": item.objective or req.objective, "taskKind": "job_item",
                "jobId": job_id}  # fmt: skip
        return RuntimeTaskRecord(
            task_id, session_id, owner, _S.DRAFT.value, now, now, agent_id=agent_id,
            capability=capability, scope=f"resource:runtime-task/{task_id}",
            priority=req.priority, input_json=item.input_json,
            meta_json=json.dumps({k: v for k, v in meta.items() if v}, ensure_ascii=False),
        )  # fmt: skip

    # ------------------------------------------------------------------ items' changes

    async def along(
        self, before: RuntimeTaskRecord, after: RuntimeTaskRecord
    ) -> tuple[tuple[JobRecord, ...], list[Fact]]:
        """The job of a task whose status changes, as the change leaves it, with the
        item's and the job's events (`TaskRuns.along`). An item of a cancelled job is not
        run again."""
        if before.state == after.state:
            return (), []
        item = await self._store.job_item_of(after.task_id)
        if item is None:
            return (), []
        job = await self._store.job(item.job_id)
        assert job is not None
        was, now_ = _S(before.state), _S(after.state)
        if was.terminal and not now_.terminal and job.intent == Intent.CANCEL:
            raise AlreadyCompletedError(
                f"task {after.task_id} is an item of job {job.job_id}, which was cancelled: "
                "it is not run again", {"field": "task_id", "job_id": job.job_id},
            )  # fmt: skip
        found = moved(counts(job), before.state, after.state)
        step = job_step(
            JobStatus(job.state), found, cancel=job.intent == Intent.CANCEL,
            started=job.started_at > 0, item_ended=was.terminal != now_.terminal,
        )  # fmt: skip
        at = self._clock.now()
        changed = replace(
            job, state=step.status.value, counts_json=counts_json(found), updated_at=at,
            started_at=job.started_at or (at if _T.JOB_STARTED in step.events else 0.0),
            ended_at=at if step.status.ended else 0.0,
        )  # fmt: skip
        facts = [self._item_fact(kind, changed, item, after) for kind in item_events(was, now_)]
        for kind in step.events:
            facts.append(self._fact(kind, changed, {"itemId": item.task_id,
                                                    "itemStatus": after.state}))  # fmt: skip
        return (changed,), facts

    def _item_fact(
        self, kind: str, job: JobRecord, item: JobItemRecord, task: RuntimeTaskRecord
    ) -> Fact:
        shown: dict[str, Any] = {"jobItemId": item.task_id, "ordinal": item.ordinal,
                                 "taskId": task.task_id, "status": task.state}  # fmt: skip
        payload: dict[str, Any] | None = None
        if kind == _T.JOB_ITEM_FAILED and task.error_code:
            payload = {"error": {"code": task.error_code, "message": task.message}}
        return Fact(
            kind, job.session_id, task_id=task.task_id, run_id=task.current_run_id,
            status=task.state, payload=payload, agent_id=task.agent_id,
            extra={"jobId": job.job_id, "jobItemId": item.task_id, "jobItem": shown},
        )  # fmt: skip

    # ------------------------------------------------------------------ cancel_job

    async def cancel(self, caller: Principal, req: CancelJob) -> dict[str, Any]:
        async def run(pending: CommandKeyRecord | None) -> str:
            job = await self._job(caller, req.job_id)
            if job.intent != Intent.CANCEL:
                if JobStatus(job.state).ended:
                    raise AlreadyCompletedError(
                        f"job {job.job_id} has ended ({job.state})",
                        {"field": "job_id", "job_id": job.job_id, "state": job.state},
                    )
                why = req.reason or f"cancelled by {caller.label}"
                await self._cancel(job, why, caller.label, pending)
            elif pending is not None:  # asked already: the key answers the job
                keys = self._keep(pending, job.job_id)
                await self._facts.commit(RuntimeWrite(keys=keys), [], caller.label)
            return job.job_id

        answer = await self._keyed(caller, "cancel_job", req, run)
        done = answer["status"] == JobStatus.CANCELLED
        return {**answer, "cancel": "cancelled" if done else "requested"}

    async def _cancel(
        self, job: JobRecord, why: str, actor: str, pending: CommandKeyRecord | None = None
    ) -> None:
        """Record the intent (the job CANCELLING), then cancel the items not ended."""
        step = job_step(JobStatus(job.state), counts(job), cancel=True, started=True)
        intended = replace(
            job, intent=Intent.CANCEL.value, intent_reason=why, state=step.status.value,
            updated_at=self._clock.now(),
        )  # fmt: skip
        facts = [self._fact(_T.JOB_PROGRESS, intended, {"intent": "cancel", "reason": why})]
        if step.status.ended:  # no item left to stop
            facts.append(self._fact(_T.JOB_CANCELLED, intended, {"reason": why}))
            intended = replace(intended, ended_at=intended.updated_at)
        keys = self._keep(pending, job.job_id)
        await self._facts.commit(RuntimeWrite(jobs=(intended,), keys=keys), facts, actor)
        for item, _ in await self._store.job_items(job.job_id):
            task = await self._store.task(item.task_id)  # as it stands after the ones before
            if task is None or task.intent == Intent.CANCEL:
                continue  # being cancelled already
            if not RuntimeTaskMachine.allows(_S(task.state), _I.CANCEL):
                continue  # ended: completed ones stay as they are
            await self._runs.apply(
                task, _I.CANCEL, actor, intent=Intent.CANCEL.value,
                intent_reason=f"its job {job.job_id} was cancelled: {why}",
            )  # fmt: skip

    async def cancel_children(self, parent: RuntimeTaskRecord, actor: str) -> None:
        """Cancel the jobs whose parent task is `parent` (it is being cancelled)."""
        for job in await self._store.child_jobs(parent.task_id):
            if job.intent != Intent.CANCEL:
                await self._cancel(job, f"its parent task {parent.task_id} was cancelled", actor)
