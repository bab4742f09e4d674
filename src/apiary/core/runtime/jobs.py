"""The runtime's jobs (create_job, get_job, cancel_job): a job is a batch of agent tasks of
one session, its items, created and started together. Pure: the records, the rule that
derives a job's status from its items' statuses, and the events a change of an item brings.

A job's status is its own and an item's is its task's (spec: "Job control SHOULD
distinguish job status from job item status"). The job keeps how many of its items stand in
each task status (`counts`), moved in the same write as the item's task, so that its status
is decided without reading its items: QUEUED while no item has gone further than its queue,
RUNNING while some item has not ended, then COMPLETED (every item completed), PARTIAL (some
completed, the others failed or cancelled) or FAILED (none completed). cancel_job records
the intent first: the job is CANCELLING until every item has ended (the ones not ended are
cancelled; completed ones stay as they are), then CANCELLED.

An item's output is its task's result: a task completes once (a completed task is never run
again), and retry_task of a failed or cancelled item submits a new run of the same task, so
a retried item writes its one output when it completes, never a second one. A failed or
partial job whose item is retried runs again (RUNNING); a cancelled job's items are not
retried.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from apiary.core.runtime.events import RuntimeEventType
from apiary.core.runtime.tasks import RuntimeTaskState


class JobStatus(StrEnum):
    QUEUED = "queued"
    """No item has gone further than its queue."""
    RUNNING = "running"
    """Some item has started (or ended) and some has not ended."""
    CANCELLING = "cancelling"
    """cancel_job recorded its intent; some item has not ended yet."""
    COMPLETED = "completed"
    """Every item completed."""
    PARTIAL = "partial"
    """Every item ended, some completed, the others failed or were cancelled."""
    FAILED = "failed"
    """Every item ended and none completed."""
    CANCELLED = "cancelled"
    """Cancelled, and every item has ended (completed ones kept)."""

    @property
    def ended(self) -> bool:
        return self in _ENDED


_J = JobStatus
_ENDED: Final = frozenset({_J.COMPLETED, _J.PARTIAL, _J.FAILED, _J.CANCELLED})
OPEN_JOB_STATES: Final = frozenset(s.value for s in JobStatus if s not in _ENDED)
JOB_KIND: Final = "batch"


@dataclass(frozen=True, slots=True)
class JobRecord:
    job_id: str
    session_id: str
    """The session whose stream carries its events and holds its item tasks."""
    owner: str
    """`owner_of` its creator."""
    state: str
    """A JobStatus value."""
    created_at: float
    updated_at: float
    item_count: int
    counts_json: str
    """How many of its items stand in each task status, a JSON object (`counts`)."""
    meta_json: str = "{}"
    """title, objective as a JSON object."""
    intent: str = ""
    """'cancel' once cancel_job recorded it."""
    intent_reason: str = ""
    parent_task_id: str = ""
    """A runtime task whose cancellation cancels the job."""
    started_at: float = 0.0
    ended_at: float = 0.0


@dataclass(frozen=True, slots=True)
class JobItemRecord:
    """One item of a job: its task, in the job's order."""

    job_id: str
    ordinal: int
    """0, 1, ...: its place in the job."""
    task_id: str
    created_at: float


def counts(record: JobRecord) -> Counter[str]:
    """The job's items by task status."""
    return Counter({k: int(v) for k, v in json.loads(record.counts_json or "{}").items() if v})


def counts_json(found: Mapping[str, int]) -> str:
    return json.dumps({k: v for k, v in sorted(found.items()) if v}, separators=(",", ":"))


def moved(found: Mapping[str, int], before: str, after: str) -> Counter[str]:
    """`found` with one item moved from status `before` to `after`."""
    out = Counter(found)
    if before != after:
        out[before] -= 1
        out[after] += 1
    return +out


def job_status(found: Mapping[str, int], *, cancel: bool) -> JobStatus:
    """The rule of the module docstring, over the items' counts by task status."""
    states = {RuntimeTaskState(k): v for k, v in found.items() if v > 0}
    open_ = [s for s in states if not s.terminal]
    if cancel:
        return _J.CANCELLING if open_ else _J.CANCELLED
    if not open_:
        done = states.get(RuntimeTaskState.COMPLETED, 0)
        if done == sum(states.values()):
            return _J.COMPLETED
        return _J.PARTIAL if done else _J.FAILED
    waiting = (RuntimeTaskState.DRAFT, RuntimeTaskState.QUEUED)
    return _J.QUEUED if all(s in waiting for s in states) else _J.RUNNING


_T = RuntimeEventType
_S = RuntimeTaskState
_ENDING: Final = {
    _J.COMPLETED: _T.JOB_COMPLETED, _J.PARTIAL: _T.JOB_FAILED, _J.FAILED: _T.JOB_FAILED,
    _J.CANCELLED: _T.JOB_CANCELLED,
}  # fmt: skip


def item_events(before: RuntimeTaskState, after: RuntimeTaskState) -> tuple[str, ...]:
    """The job.item.* events of an item whose task went from `before` to `after`."""
    if before is after:
        return ()
    if after is _S.RUNNING:
        return (_T.JOB_ITEM_STARTED,)
    if after is _S.COMPLETED:
        return (_T.JOB_ITEM_COMPLETED,)
    if after is _S.FAILED:
        return (_T.JOB_ITEM_FAILED,)
    return ()


@dataclass(frozen=True, slots=True)
class JobStep:
    status: JobStatus
    events: tuple[str, ...]
    """The job's events after its item's, in order."""


def job_step(
    status: JobStatus, found: Mapping[str, int], *, cancel: bool, started: bool,
    item_ended: bool = False,
) -> JobStep:  # fmt: skip
    """The job's next status over its items' counts `found`, and its events: job.started
    the first time an item goes further than its queue, the ending event when it ends
    (job.failed for a partial job), job.progress for any other change of its status or an
    item that ended (`item_ended`) or runs again."""
    after = job_status(found, cancel=cancel)
    events: list[str] = []
    if not started and after not in (_J.QUEUED, _J.CANCELLING, _J.CANCELLED):
        events.append(_T.JOB_STARTED)
    if after is not status and after.ended:
        events.append(_ENDING[after])
    elif (after is not status and not events) or item_ended:
        events.append(_T.JOB_PROGRESS)
    return JobStep(after, tuple(events))


def created(item_count: int) -> Counter[str]:
    """A new job's counts: every item a draft, started next."""
    return Counter({_S.DRAFT.value: item_count})
