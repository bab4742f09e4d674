"""The edges between runtime agent tasks (link_tasks, unlink_tasks): the rules an edge
keeps (one parent per task, no dependency cycle) and the fact an edge's change writes."""

from __future__ import annotations

from apiary.controlplane.task_requests import LinkTasks
from apiary.controlplane.task_runs import TaskRuns
from apiary.core.runtime.events import RuntimeEventType
from apiary.core.runtime.log import Fact
from apiary.core.runtime.task_records import LinkKind, LinkStatus, RuntimeTaskRecord, TaskLinkRecord
from apiary.core.runtime.task_views import relationship
from apiary.errors import AlreadyExistsError, WorkflowCycleDetectedError
from apiary.store.protocols import RuntimeStore

_T = RuntimeEventType


async def check_edge(
    store: RuntimeStore,
    task: RuntimeTaskRecord,
    req: LinkTasks,
    known: dict[tuple[str, str], TaskLinkRecord],
) -> None:
    """Refuse an edge that would give the task a second parent or close a dependency
    cycle (`known`: the task's edges by (kind, target))."""
    if req.kind == LinkKind.PARENT:
        parents = [x for (kind, _), x in known.items() if kind == LinkKind.PARENT]
        other = next((x for x in parents if x.status == LinkStatus.ACTIVE), None)
        if other is not None:
            raise AlreadyExistsError(
                f"task {task.task_id} has a parent already ({other.target_id}): unlink it first",
                {"field": "target_id"},
            )
    if req.kind == LinkKind.DEPENDENCY and await depends(store, req.target_id, task.task_id):
        raise WorkflowCycleDetectedError(
            f"task {req.target_id} depends on {task.task_id} already: the edge would make a cycle",
            {"field": "target_id", "target_id": req.target_id},
        )


async def depends(store: RuntimeStore, start: str, on: str) -> bool:
    """Whether `start` depends on `on`, directly or through other tasks."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        current = todo.pop()
        if current == on:
            return True
        if current in seen:
            continue
        seen.add(current)
        todo += [
                x.target_id for x in await store.links(current)
                if x.kind == LinkKind.DEPENDENCY and x.status == LinkStatus.ACTIVE
            ]  # fmt: skip
    return False


def link_fact(runs: TaskRuns, task: RuntimeTaskRecord, link: TaskLinkRecord, action: str) -> Fact:
    """task.dependency.updated: an edge `linked` or `unlinked`."""
    return runs.fact(
        _T.TASK_DEPENDENCY_UPDATED, task,
        payload={"action": action, "kind": link.kind, "targetId": link.target_id},
        taskRelationship=relationship(link),
    )  # fmt: skip
