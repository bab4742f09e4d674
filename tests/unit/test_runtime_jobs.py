"""The job rule (core/runtime/jobs.py): a job's status derives from its items' task statuses
(kept as counts), distinct from each item's; over any sequence of its items' moves along the
task machine the counts match the items, job.started comes once, a job ends exactly when
its last item does, a cancelled job only once every item stopped, and each event is a
contract event. Plus the job's view and the request reader's limits."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apiary.controlplane.job_requests import CreateJob
from apiary.controlplane.requests import Params
from apiary.controlplane.settings import RuntimeSettings
from apiary.core.runtime.events import EVENT_TYPES, RuntimeEventType
from apiary.core.runtime.job_views import job_view
from apiary.core.runtime.jobs import (
    JobItemRecord,
    JobRecord,
    JobStatus,
    counts_json,
    created,
    item_events,
    job_status,
    job_step,
    moved,
)
from apiary.core.runtime.task_records import RuntimeTaskRecord
from apiary.core.runtime.tasks import RuntimeTaskInput, RuntimeTaskMachine, RuntimeTaskState
from apiary.errors import ValidationError

_S, _J, _T = RuntimeTaskState, JobStatus, RuntimeEventType


@pytest.mark.parametrize(
    ("items", "cancel", "status"),
    [
        ({"draft": 3}, False, _J.QUEUED),
        ({"queued": 2, "draft": 1}, False, _J.QUEUED),
        ({"queued": 1, "preparing": 1}, False, _J.RUNNING),
        ({"queued": 1, "completed": 1}, False, _J.RUNNING),
        ({"paused": 1, "failed": 1}, False, _J.RUNNING),
        ({"completed": 3}, False, _J.COMPLETED),
        ({"completed": 2, "failed": 1}, False, _J.PARTIAL),
        ({"completed": 1, "cancelled": 1}, False, _J.PARTIAL),
        ({"failed": 1, "cancelled": 2}, False, _J.FAILED),
        ({"running": 1, "completed": 1}, True, _J.CANCELLING),
        ({"draft": 1, "cancelled": 1}, True, _J.CANCELLING),
        ({"completed": 1, "cancelled": 2}, True, _J.CANCELLED),
    ],
)
def test_a_jobs_status_is_derived_from_its_items_statuses(
    items: dict[str, int], cancel: bool, status: JobStatus
) -> None:
    assert job_status(items, cancel=cancel) is status


def test_an_items_events_name_its_own_start_and_end() -> None:
    assert item_events(_S.QUEUED, _S.RUNNING) == (_T.JOB_ITEM_STARTED,)
    assert item_events(_S.RUNNING, _S.COMPLETED) == (_T.JOB_ITEM_COMPLETED,)
    assert item_events(_S.RUNNING, _S.FAILED) == (_T.JOB_ITEM_FAILED,)
    assert item_events(_S.RUNNING, _S.CANCELLING) == ()
    assert item_events(_S.RUNNING, _S.RUNNING) == ()


def test_a_partial_job_fails_and_runs_again_when_an_item_is_retried() -> None:
    step = job_step(_J.RUNNING, {"completed": 1, "failed": 1}, cancel=False, started=True,
                    item_ended=True)  # fmt: skip
    assert step == job_step(_J.RUNNING, {"failed": 1, "completed": 1}, cancel=False,
                            started=True, item_ended=True)  # fmt: skip
    assert (step.status, step.events) == (_J.PARTIAL, (_T.JOB_FAILED,))
    again = job_step(_J.PARTIAL, {"completed": 1, "queued": 1}, cancel=False, started=True,
                     item_ended=True)  # fmt: skip
    assert (again.status, again.events) == (_J.RUNNING, (_T.JOB_PROGRESS,))


_I_CANCEL = RuntimeTaskInput.CANCEL
_MOVES = [i for i in RuntimeTaskInput if i is not _I_CANCEL]


@settings(max_examples=300, deadline=None)
@given(
    size=st.integers(1, 4),
    moves=st.lists(st.tuples(st.integers(0, 3), st.sampled_from(_MOVES)), max_size=40),
    cancel_at=st.integers(0, 40),
)
def test_over_any_moves_of_its_items_the_job_follows_them(
    size: int, moves: list[tuple[int, RuntimeTaskInput]], cancel_at: int
) -> None:
    items = [_S.DRAFT] * size
    found: Counter[str] = created(size)
    status, started, cancel, events = _J.QUEUED, False, False, []
    for n, (index, event) in enumerate(moves):
        if n == cancel_at and not status.ended:
            cancel = True  # cancel_job: the intent, then every item not ended is cancelled
            step = job_step(status, found, cancel=True, started=True)
            status = step.status
            pending = [k for k, s in enumerate(items) if RuntimeTaskMachine.allows(s, _I_CANCEL)]
            moves_now = [(k, _I_CANCEL) for k in pending]
        else:
            moves_now = [(index % size, event)]
        for k, move in moves_now:
            before = items[k]
            if not RuntimeTaskMachine.allows(before, move):
                continue
            after = RuntimeTaskMachine.step(before, move).state
            if cancel and before.terminal and not after.terminal:
                continue  # a cancelled job's items are not run again
            items[k] = after
            found = moved(found, before.value, after.value)
            step = job_step(status, found, cancel=cancel, started=started,
                            item_ended=before.terminal != after.terminal)  # fmt: skip
            events += [*item_events(before, after), *step.events]
            if before is _S.COMPLETED:
                raise AssertionError("a completed item moved")
            started = started or _T.JOB_STARTED in step.events
            was, status = status, step.status
            assert (status.ended and status is not was) == any(
                e in (_T.JOB_COMPLETED, _T.JOB_FAILED, _T.JOB_CANCELLED) for e in step.events
            )
        assert found == Counter(s.value for s in items)
        assert status.ended == all(s.terminal for s in items)
        if cancel:
            assert status in (_J.CANCELLING, _J.CANCELLED)
    assert events.count(_T.JOB_STARTED) <= 1
    assert events.count(_T.JOB_CANCELLED) <= 1
    assert set(events) <= EVENT_TYPES


def test_the_view_shows_the_jobs_status_and_each_items_own_with_its_one_output() -> None:
    job = JobRecord("j", "s", "application:ci", "partial", 1.0, 2.0, 2,
                    counts_json({"completed": 1, "failed": 1}))  # fmt: skip
    done = RuntimeTaskRecord("a", "s", "application:ci", "completed", 1.0, 2.0,
                             result_json='{"x": 1}', run_count=2, current_run_id="r2")  # fmt: skip
    failed = RuntimeTaskRecord("b", "s", "application:ci", "failed", 1.0, 2.0,
                               error_code="tool_failed", message="no", run_count=1)  # fmt: skip
    view = job_view(job, [(JobItemRecord("j", 0, "a", 1.0), done),
                          (JobItemRecord("j", 1, "b", 1.0), failed)])  # fmt: skip
    assert (view["status"], view["itemCounts"]) == ("partial", {"completed": 1, "failed": 1})
    assert view["items"][0] == {
        "jobItemId": "a", "ordinal": 0, "taskId": "a", "status": "completed",
        "attemptCount": 2, "currentRunId": "r2", "output": {"x": 1},
    }  # fmt: skip
    assert "output" not in view["items"][1]
    assert view["items"][1]["lastError"] == {"code": "tool_failed", "message": "no"}


def test_a_job_holds_at_most_max_job_items() -> None:
    limits = RuntimeSettings(max_job_items=2)
    read = CreateJob.read(Params({"agent_id": "a", "items": [{}, {}]}), limits)
    assert len(read.items) == 2
    with pytest.raises(ValidationError) as refused:
        CreateJob.read(Params({"agent_id": "a", "items": [{}, {}, {}]}), limits)
    assert refused.value.details["field"] == "items"
    assert "runtime.max_job_items" in refused.value.message
