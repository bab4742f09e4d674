"""A dispatched task's activity entry (RFC 10): the fields its JSON params name, found
however the params spell their keys, and none from params that name none."""

from __future__ import annotations

import pytest

from apiary.core.records import TaskRecord, TaskState
from apiary.engine.scheduler.transitions import activity_entry


def _task(params: bytes) -> TaskRecord:
    return TaskRecord(
        task_id="t1", agent_id="a1", priority=0, submitted_at=1.0, seq=1,
        state=TaskState.DISPATCHED, updated_at=1.0, scope="repo:app", job_key="k",
        params=params,
    )  # fmt: skip


def test_the_entry_carries_the_fields_the_params_name() -> None:
    params = b'{"repo_id": "app", "worktree_id": "w1", "branch": "main", "other": 1}'
    entry = activity_entry(_task(params))
    assert (entry.agent_id, entry.task_id) == ("a1", "t1")
    assert (entry.repo_id, entry.worktree_id, entry.branch, entry.description) == (
        "app", "w1", "main", "",
    )  # fmt: skip


def test_a_key_spelt_with_escapes_is_found() -> None:
    entry = activity_entry(_task(b'{"repo\\u005fid": "app", "descr\\u0069ption": "fix"}'))
    assert (entry.repo_id, entry.description) == ("app", "fix")


@pytest.mark.parametrize(
    "params",
    [b"", b'{"n": 1}', b"not json", b'["repo_id"]', b'{"n": "repo_id"}', b'{"repo_id": '],
)
def test_params_that_name_no_field_give_an_entry_of_the_task_alone(params: bytes) -> None:
    entry = activity_entry(_task(params))
    assert (entry.agent_id, entry.task_id) == ("a1", "t1")
    assert (entry.repo_id, entry.worktree_id, entry.branch, entry.description) == ("",) * 4
