"""A job (core/runtime/jobs.py) as get_job and the snapshot show it: the job's status and
its items' counts by status, and each item with its own status and its one output. Pure:
the control plane reads the records and hands them here."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from apiary.core.dedup import iso_utc
from apiary.core.runtime.jobs import JOB_KIND, JobItemRecord, JobRecord, counts
from apiary.core.runtime.snapshot import RuntimeSnapshot
from apiary.core.runtime.task_records import RuntimeTaskRecord
from apiary.core.runtime.task_views import error_of


def _time(seconds: float) -> str | None:
    return iso_utc(seconds) if seconds > 0 else None


def job_summary(job: JobRecord) -> dict[str, Any]:
    """The job without its items: what the snapshot lists and the events carry."""
    doc: dict[str, Any] = {
        "jobId": job.job_id, "kind": JOB_KIND, "status": job.state,
        "sessionId": job.session_id, "itemCount": job.item_count,
        "itemCounts": dict(sorted(counts(job).items())),
    }  # fmt: skip
    meta = json.loads(job.meta_json or "{}")
    for key in ("title", "objective"):
        if meta.get(key):
            doc[key] = meta[key]
    if job.intent:
        doc["intent"] = {"kind": job.intent, "reason": job.intent_reason}
    if job.parent_task_id:
        doc["parentTaskId"] = job.parent_task_id
    for key, value in (("createdAt", job.created_at), ("updatedAt", job.updated_at),
                       ("startedAt", job.started_at), ("endedAt", job.ended_at)):  # fmt: skip
        shown = _time(value)
        if shown is not None:
            doc[key] = shown
    return doc


def item_view(item: JobItemRecord, task: RuntimeTaskRecord) -> dict[str, Any]:
    """One item: its task's status and attempts, and its output once it completed."""
    doc: dict[str, Any] = {
        "jobItemId": item.task_id, "ordinal": item.ordinal, "taskId": task.task_id,
        "status": task.state, "attemptCount": task.run_count,
    }  # fmt: skip
    if task.current_run_id:
        doc["currentRunId"] = task.current_run_id
    if task.result_json:
        doc["output"] = json.loads(task.result_json)
    error = error_of(task.error_code, task.message)
    if error is not None:
        doc["lastError"] = error
    return doc


def job_view(
    job: JobRecord, items: Sequence[tuple[JobItemRecord, RuntimeTaskRecord]]
) -> dict[str, Any]:
    """The job with its items in order (get_job)."""
    doc = job_summary(job)
    doc["owner"] = {"principal": job.owner}
    doc["items"] = [item_view(item, task) for item, task in items]
    return doc


def with_jobs(snapshot: RuntimeSnapshot, jobs: Sequence[JobRecord]) -> RuntimeSnapshot:
    """The session's snapshot with its jobs in `subagentJobSummary`: each job's summary and
    how many jobs stand in each status."""
    if not jobs:
        return snapshot
    by_status: dict[str, int] = {}
    for job in jobs:
        by_status[job.state] = by_status.get(job.state, 0) + 1
    summary = {"jobs": [job_summary(job) for job in jobs], "jobCounts": by_status}
    return replace(snapshot, extra={**snapshot.extra, "subagentJobSummary": summary})
