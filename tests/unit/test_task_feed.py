"""A task feed between its reader's reads: the latest change of each task, or every change in
the order stored (the control plane's followers, which must see a task run before it ends)."""

from __future__ import annotations

from apiary.core.records import TaskRecord, TaskState
from apiary.engine.scheduler.watch import TaskFeed


def _task(task_id: str, state: TaskState) -> TaskRecord:
    return TaskRecord(task_id, "bob", 0, 1.0, 1, state, 1.0, submitter="app")


STATES = (TaskState.DISPATCHED, TaskState.RUNNING, TaskState.COMPLETED)


async def _offered(feed: TaskFeed) -> list[tuple[str, str]]:
    feed.offer(_task("a", TaskState.QUEUED), newer=False)  # read before: a change is newer
    for state in STATES:
        feed.offer(_task("a", state))
    feed.offer(_task("b", TaskState.QUEUED))
    return [(t.task_id, t.state) for t in await feed.next()]


async def test_a_feed_hands_out_the_latest_change_of_each_task() -> None:
    assert await _offered(TaskFeed("app", frozenset())) == [("a", "COMPLETED"), ("b", "QUEUED")]


async def test_a_feed_of_every_change_hands_out_each_in_the_order_stored() -> None:
    assert await _offered(TaskFeed("app", frozenset(), every=True)) == [
        ("a", "QUEUED"), ("a", "DISPATCHED"), ("a", "RUNNING"), ("a", "COMPLETED"),
        ("b", "QUEUED"),
    ]  # fmt: skip


async def test_a_record_read_earlier_is_dropped_when_a_change_is_pending() -> None:
    feed = TaskFeed("app", frozenset(), every=True)
    feed.offer(_task("a", TaskState.RUNNING))
    feed.offer(_task("a", TaskState.QUEUED), newer=False)
    assert [t.state for t in await feed.next()] == ["RUNNING"]
