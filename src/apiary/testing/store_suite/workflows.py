"""Checks of the workflow store (`WorkflowStore`): what the workflow engine relies on to
resume runs after a restart (RFC 17.7)."""

from __future__ import annotations

import contextlib
from dataclasses import replace

from apiary.core.workflow.definition import NodeSpec, TriggerType, WorkflowSpec
from apiary.core.workflow.node import NodeRun, NodeStatus
from apiary.core.workflow.run import WorkflowRun, WorkflowStatus, WorkflowSummary
from apiary.store.errors import DuplicateWorkflowError, StoreError
from apiary.store.protocols import Store
from apiary.testing.store_suite.base import (
    T0,
    UNICODE,
    Check,
    CheckNotApplicable,
    StoreFactory,
    registry,
)

CHECKS: list[Check] = []
_check = registry(CHECKS)


def diamond(workflow_id: str = "wf-1") -> WorkflowSpec:
    """A diamond: a -> (b, c) -> d, with every field of a node set somewhere."""
    return WorkflowSpec(
        workflow_id=workflow_id,
        created_at=T0,
        metadata={"owner": "suite", "on_failure": "fail"},
        nodes={
            # Not in alphabetical order: the definition's order must survive.
            "d": NodeSpec("d", "agent-d", ("b", "c"), output_mapping={"$.total": "total"}),
            "a": NodeSpec("a", "agent-a", trigger=TriggerType.MANUAL,
                          metadata={"retries": "2", UNICODE: UNICODE}),
            "b": NodeSpec("b", "agent-b", ("a",), input_mapping={"x": "a.out"}),
            "c": NodeSpec("c", "agent-c", ("a",), TriggerType.SCHEDULE,
                          metadata={"cron": "*/5 * * * *"}),
        },
    )  # fmt: skip


def fresh_nodes(spec: WorkflowSpec) -> list[NodeRun]:
    return [NodeRun(node_id) for node_id in spec.nodes]


async def _create(store: Store, spec: WorkflowSpec) -> WorkflowRun:
    run = WorkflowRun(spec.workflow_id, updated_at=T0)
    await store.workflows.create(spec, run, fresh_nodes(spec))
    return run


@_check
async def workflows_are_created_and_read_back(factory: StoreFactory) -> None:
    spec = diamond()
    async with factory.open() as store:
        assert await store.workflows.get("wf-1") is None
        run = await _create(store, spec)
        stored = await store.workflows.get("wf-1")
        assert stored is not None
        assert stored.spec == spec
        assert list(stored.spec.nodes) == ["d", "a", "b", "c"]
        assert stored.run == run
        assert list(stored.nodes) == ["d", "a", "b", "c"]
        assert all(n == NodeRun(n.node_id) for n in stored.nodes.values())


@_check
async def a_workflow_id_is_created_once(factory: StoreFactory) -> None:
    async with factory.open() as store:
        await _create(store, diamond())
        other = replace(diamond(), metadata={"owner": "someone else"})
        try:
            await _create(store, other)
        except DuplicateWorkflowError:
            pass
        else:
            raise AssertionError("a second workflow with the same id was accepted")
        stored = await store.workflows.get("wf-1")
        assert stored is not None and stored.spec.metadata["owner"] == "suite"


@_check
async def a_save_replaces_the_run_and_the_nodes_given(factory: StoreFactory) -> None:
    async with factory.open() as store:
        run = await _create(store, diamond())
        running = replace(
            run, status=WorkflowStatus.RUNNING, data='{"a":{"out":"é"}}', started_at=T0 + 1,
            updated_at=T0 + 2, metadata={"by": UNICODE},
        )  # fmt: skip
        a = NodeRun(
            "a", NodeStatus.COMPLETED, attempts=2, dispatches=3, task_id="workflow:wf-1:a:3",
            started_at=T0 + 1.5, completed_at=T0 + 2.25, output='{"out":"é"}', error="",
            triggered=True, due_at=T0 + 9, event='{"message_id":"m"}', updated_at=T0 + 2,
        )  # fmt: skip
        b = NodeRun("b", NodeStatus.READY, updated_at=T0 + 2)
        await store.workflows.save(running, [a, b])
        stored = await store.workflows.get("wf-1")
        assert stored is not None
        assert stored.run == running
        assert stored.nodes["a"] == a and stored.nodes["b"] == b
        assert stored.nodes["c"] == NodeRun("c") and stored.nodes["d"] == NodeRun("d")
        await store.workflows.save(replace(running, status=WorkflowStatus.FAILED), [])
        stored = await store.workflows.get("wf-1")
        assert stored is not None and stored.run.status is WorkflowStatus.FAILED
        assert stored.nodes["a"] == a


@_check
async def a_save_of_an_unknown_workflow_or_node_changes_nothing(factory: StoreFactory) -> None:
    async with factory.open() as store:
        run = await _create(store, diamond())
        for bad_run, nodes in (
            (WorkflowRun("nope"), []),
            (replace(run, status=WorkflowStatus.RUNNING),
             [NodeRun("a", NodeStatus.READY), NodeRun("zz", NodeStatus.READY)]),
        ):  # fmt: skip
            try:
                await store.workflows.save(bad_run, nodes)
            except StoreError:
                pass
            else:
                raise AssertionError(f"saving {bad_run.workflow_id} {nodes} was accepted")
        stored = await store.workflows.get("wf-1")
        assert stored is not None and stored.run == run
        assert stored.nodes["a"] == NodeRun("a")


@_check
async def workflows_are_listed_by_status_in_id_order(factory: StoreFactory) -> None:
    async with factory.open() as store:
        for n, status in enumerate(
            [WorkflowStatus.RUNNING, WorkflowStatus.COMPLETED, WorkflowStatus.RUNNING,
             WorkflowStatus.CREATED]
        ):  # fmt: skip
            run = await _create(store, diamond(f"wf-{n}"))
            await store.workflows.save(replace(run, status=status), [])
        ids = [r.workflow_id for r in await store.workflows.list()]
        assert ids == ["wf-0", "wf-1", "wf-2", "wf-3"]
        running = await store.workflows.list(frozenset({"RUNNING"}))
        assert [r.workflow_id for r in running] == ["wf-0", "wf-2"]
        assert [r.workflow_id for r in await store.workflows.list(after_id="wf-1", limit=1)] == [
            "wf-2"
        ]
        assert await store.workflows.list(frozenset()) == []
        assert await store.workflows.list(limit=0) == []
        with contextlib.suppress(ValueError):
            await store.workflows.list(limit=-1)
            raise AssertionError("a negative limit was accepted")


@_check
async def workflows_are_summarized_with_their_nodes_counted(factory: StoreFactory) -> None:
    async with factory.open() as store:
        assert await store.workflows.summary("wf-0") is None
        assert await store.workflows.summaries() == []
        for n in range(3):
            await _create(store, diamond(f"wf-{n}"))
        running = WorkflowRun(
            "wf-1", WorkflowStatus.RUNNING, data='{"big":"' + "x" * 1000 + '"}', started_at=T0 + 1,
            updated_at=T0 + 5, metadata={"by": "suite"},
        )  # fmt: skip
        await store.workflows.save(
            running,
            [NodeRun("a", NodeStatus.COMPLETED), NodeRun("b", NodeStatus.FAILED),
             NodeRun("c", NodeStatus.SKIPPED), NodeRun("d", NodeStatus.RUNNING)],
        )  # fmt: skip
        cancelled = WorkflowRun(
            "wf-2", WorkflowStatus.CANCELLED, completed_at=T0 + 7, updated_at=T0 + 7
        )
        await store.workflows.save(cancelled, [NodeRun("a", NodeStatus.SKIPPED)])
        one = await store.workflows.summary("wf-1")
        assert one == WorkflowSummary(
            "wf-1", WorkflowStatus.RUNNING, nodes_total=4, nodes_done=3, created_at=T0,
            started_at=T0 + 1, completed_at=0.0, updated_at=T0 + 5,
        )  # fmt: skip
        every = await store.workflows.summaries()
        assert [(s.workflow_id, s.status, s.nodes_done) for s in every] == [
            ("wf-0", WorkflowStatus.CREATED, 0), ("wf-1", WorkflowStatus.RUNNING, 3),
            ("wf-2", WorkflowStatus.CANCELLED, 1),
        ]  # fmt: skip
        assert every[1] == one and all(s.nodes_total == 4 for s in every)
        # The same filter and paging as `list`.
        assert await store.workflows.summaries(frozenset({"CANCELLED"})) == [every[2]]
        assert await store.workflows.summaries(after_id="wf-0", limit=1) == [one]
        assert await store.workflows.summaries(frozenset()) == []
        assert await store.workflows.summaries(limit=0) == []


@_check
async def workflows_survive_closing_and_reopening(factory: StoreFactory) -> None:
    if not factory.durable:
        raise CheckNotApplicable(f"the {factory.backend} backend is not durable")
    spec = diamond()
    async with factory.open() as store:
        run = await _create(store, spec)
        running = replace(run, status=WorkflowStatus.RUNNING, data='{"k":1}', started_at=T0)
        b = NodeRun("b", NodeStatus.RUNNING, attempts=1, dispatches=1, task_id="t-b")
        await store.workflows.save(running, [b])
    async with factory.open() as store:
        stored = await store.workflows.get("wf-1")
        assert stored is not None
        assert (stored.spec, stored.run, stored.nodes["b"]) == (spec, running, b)
        assert [r.workflow_id for r in await store.workflows.list(frozenset({"RUNNING"}))] == [
            "wf-1"
        ]
