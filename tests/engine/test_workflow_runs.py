"""Workflow runs as a whole, on a real SQLite file and on PostgreSQL: listing with a state
filter and a cursor, cancelling (a running run's nodes end, its queued tasks are cancelled
through the Scheduler, a finished run is refused naming its state, a cancelled run is final
across a restart) and a run's history from the event log."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import pytest

from apiary.core.envelope import AckStage
from apiary.core.events import EventDraft
from apiary.core.workflow.definition import NodeSpec, WorkflowSpec
from apiary.core.workflow.node import NodeRun, NodeStatus
from apiary.core.workflow.run import WorkflowRun, WorkflowStatus
from apiary.engine.workflows import Workflows
from apiary.errors import AlreadyCompletedError, NotFoundError, ValidationError
from apiary.store.errors import StoreUnavailableError
from apiary.testing.clock import FakeClock
from apiary.testing.engine import EngineHarness, open_test_engine
from apiary.testing.ids import SequentialIds

S, W = NodeStatus, WorkflowStatus
AGENTS = ("agent-a", "agent-b")
WHY = "cancelled by ops: wrong input"


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'apiary.db'}"
        return
    dsn: str = request.getfixturevalue("postgres_dsn")
    schema: str = request.getfixturevalue("postgres_schema")
    separator = "&" if "?" in dsn else "?"
    yield f"{dsn}{separator}apiary_schema={schema}&connect_timeout=5"


class Opener:
    """Opens engines over one store in turn (a restart), with one clock and id sequence."""

    def __init__(self, url: str, data_dir: Path) -> None:
        self.url, self.data_dir = url, data_dir
        self.clock, self.ids = FakeClock(), SequentialIds()

    @asynccontextmanager
    async def open(self) -> AsyncIterator[EngineHarness]:
        async with open_test_engine(
            store_url=self.url, data_dir=self.data_dir, clock=self.clock, ids=self.ids
        ) as harness:
            for agent in AGENTS:
                await harness.register(agent)
                await harness.engine.scheduler.agent_ready(agent)
            yield harness


@pytest.fixture
def opener(store_url: str, tmp_path: Path) -> Opener:
    return Opener(store_url, tmp_path)


@pytest.fixture
async def h(opener: Opener) -> AsyncIterator[EngineHarness]:
    async with opener.open() as harness:
        yield harness


def _wf(h: EngineHarness) -> Workflows:
    return h.engine.workflows


def _task(node: str, workflow_id: str = "wf", n: int = 1) -> str:
    return f"workflow:{workflow_id}:{node}:{n}"


def two_on_one_agent(workflow_id: str = "wf") -> WorkflowSpec:
    """x and y both on agent-a (x is dispatched, y waits in the agent's queue), z after x."""
    return WorkflowSpec(
        workflow_id,
        {
            "x": NodeSpec("x", "agent-a"),
            "y": NodeSpec("y", "agent-a"),
            "z": NodeSpec("z", "agent-b", ("x",)),
        },
    )


def one_node(workflow_id: str, **metadata: str) -> WorkflowSpec:
    return WorkflowSpec(workflow_id, {"a": NodeSpec("a", "agent-b", metadata=metadata)})


async def _finish(h: EngineHarness, task_id: str, *, fail: str = "") -> None:
    task = h.engine.scheduler.get(task_id)
    assert task is not None and task.message_id, f"task {task_id} was not dispatched"
    await h.ack(task.agent_id, task.message_id, AckStage.READ)
    if fail:
        await h.ack(task.agent_id, task.message_id, AckStage.FAILED, fail, "it broke")
    else:
        await h.ack(task.agent_id, task.message_id, AckStage.FULFILLED, note="{}")
    await _wf(h).drain()


async def _nodes(h: EngineHarness, workflow_id: str = "wf") -> dict[str, tuple[str, str]]:
    stored = await _wf(h).state(workflow_id)
    return {k: (r.status.value, r.error) for k, r in stored.nodes.items()}


async def _task_state(h: EngineHarness, task_id: str) -> tuple[str, str]:
    task = await h.engine.scheduler.find(task_id)
    return task.state, task.error_code


# --- cancelling ----------------------------------------------------------------------------


async def test_cancelling_a_running_workflow_ends_its_nodes_and_cancels_its_queued_task(
    opener: Opener,
) -> None:
    async with opener.open() as h:
        await _wf(h).create(two_on_one_agent())
        await _wf(h).start("wf")
        assert await _task_state(h, _task("x")) == ("DISPATCHED", "")
        assert await _task_state(h, _task("y")) == ("QUEUED", "")

        state = await _wf(h).cancel("wf", "wrong input", "ops")

        assert state.run.status is W.CANCELLED and state.run.completed_at == h.clock.now()
        assert await _nodes(h) == {
            "x": ("FAILED", WHY), "y": ("FAILED", WHY), "z": ("SKIPPED", WHY)
        }  # fmt: skip
        # The queued task is cancelled through the Scheduler; the one waiting at its agent
        # unread is asked back (it ends cancelled once given back, here never).
        assert await _task_state(h, _task("y")) == ("FAILED", "cancelled")
        assert (await h.engine.scheduler.find(_task("y"))).note == (
            "cancelled by ops: workflow wf was cancelled: wrong input"
        )
        assert await _task_state(h, _task("x")) == ("DISPATCHED", "")
        [done] = await h.events("workflow.cancelled")
        assert done.correlation_id == "wf"
        assert (done.details["by"], done.details["reason"]) == ("ops", "wrong input")
        assert sorted(done.details["tasks_to_stop"]) == [_task("x"), _task("y")]
        # Committed with the CANCELLED run; what stopping the tasks did follows it.
        [stopped] = await h.events("workflow.tasks_stopped")
        assert stopped.sequence > done.sequence
        assert stopped.details["tasks_cancelled"] == [_task("y")]
        assert stopped.details["tasks_asked_back"] == [_task("x")]
        assert stopped.details["tasks_left_running"] == []
        assert len(await h.events("workflow.node_cancelled")) == 3

        # The task's end (its agent had started it) changes nothing: z is not released,
        # nothing is submitted.
        await _finish(h, _task("x"))
        assert await _task_state(h, _task("x")) == ("COMPLETED", "")
        assert (await _wf(h).state("wf")).run.status is W.CANCELLED
        assert await _nodes(h) == {
            "x": ("FAILED", WHY), "y": ("FAILED", WHY), "z": ("SKIPPED", WHY)
        }  # fmt: skip
        assert h.engine.scheduler.get(_task("z")) is None

        for refused in (
            _wf(h).cancel("wf"), _wf(h).start("wf"), _wf(h).resume("wf"),
            _wf(h).resume("wf", "x"),
        ):  # fmt: skip
            with pytest.raises(AlreadyCompletedError) as caught:
                await refused
            assert caught.value.details == {"workflow_id": "wf", "state": "CANCELLED"}
            assert "CANCELLED" in caught.value.message or "cancelled" in caught.value.message

    # Final across a restart: not resumed, still refused.
    async with opener.open() as h:
        assert await _wf(h).load() == 0
        assert (await _wf(h).state("wf")).run.status is W.CANCELLED
        with pytest.raises(AlreadyCompletedError, match="cannot be resumed"):
            await _wf(h).resume("wf")


async def test_a_cancel_the_store_failed_to_write_leaves_the_run_going(
    h: EngineHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _wf(h).create(two_on_one_agent())
    await _wf(h).start("wf")
    before = await _wf(h).state("wf")
    nodes_before = dict(before.nodes)  # a snapshot shares the live run's node map
    store = h.store.workflows
    _fail_next_save(h, monkeypatch)

    with pytest.raises(StoreUnavailableError):
        await _wf(h).cancel("wf", "wrong input", "ops")

    # Nothing happened: the run is as stored, RUNNING, its tasks untouched, nothing logged.
    after = await _wf(h).state("wf")
    assert (after.run, after.nodes) == (before.run, nodes_before)
    stored = await store.get("wf")
    assert stored is not None and stored.run.status is W.RUNNING
    assert await _task_state(h, _task("y")) == ("QUEUED", "")
    assert await h.events("workflow.cancelled") == []
    assert await h.events("workflow.node_cancelled") == []
    # Still driven: x's end completes the node and releases z.
    await _finish(h, _task("x"))
    assert (await _wf(h).state("wf")).nodes["x"].status is S.COMPLETED
    assert await _task_state(h, _task("z")) == ("DISPATCHED", "")

    # Cancelling again does it, once.
    state = await _wf(h).cancel("wf", "wrong input", "ops")
    assert state.run.status is W.CANCELLED
    stored = await store.get("wf")
    assert stored is not None and stored.run.status is W.CANCELLED
    assert await _nodes(h) == {
        "x": ("COMPLETED", ""), "y": ("FAILED", WHY), "z": ("FAILED", WHY)
    }  # fmt: skip
    [done] = await h.events("workflow.cancelled")
    assert done.details["tasks_to_stop"] == [_task("y"), _task("z")]
    [stopped] = await h.events("workflow.tasks_stopped")
    assert stopped.details["tasks_asked_back"] == [_task("y"), _task("z")]  # unread
    assert stopped.details["tasks_left_running"] == []
    assert len(await h.events("workflow.node_cancelled")) == 2


def _fail_next_save(h: EngineHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    """The workflow store's next save fails as a lost database would (nothing stored)."""
    store = h.store.workflows
    save = store.save
    failures = [StoreUnavailableError("the database went away")]

    async def save_failing_once(
        run: WorkflowRun, nodes: Sequence[NodeRun], events: Sequence[EventDraft] = ()
    ) -> None:
        if failures:
            raise failures.pop()
        await save(run, nodes, events)

    monkeypatch.setattr(store, "save", save_failing_once)


async def test_a_start_the_store_failed_to_write_leaves_the_workflow_created(
    h: EngineHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _wf(h).create(two_on_one_agent())
    before = await _wf(h).state("wf")
    _fail_next_save(h, monkeypatch)

    with pytest.raises(StoreUnavailableError):
        await _wf(h).start("wf", '{"n": 1}')

    # Nothing happened: not running in memory either, nothing submitted or logged.
    assert await _wf(h).state("wf") == before
    assert before.run.status is W.CREATED
    assert h.engine.scheduler.get(_task("x")) is None
    assert await h.events("workflow.started") == []
    assert [e.event_type for e in await h.events() if e.event_type.startswith("workflow.")] == [
        "workflow.created"
    ]
    with pytest.raises(ValidationError, match="never started"):
        await _wf(h).resume("wf")
    # Starting again does it, once.
    state = await _wf(h).start("wf", '{"n": 1}')
    assert state.run.status is W.RUNNING
    assert len(await h.events("workflow.started")) == 1
    assert await _task_state(h, _task("x")) == ("DISPATCHED", "")


async def test_a_resume_the_store_failed_to_write_leaves_the_run_as_it_was(
    h: EngineHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _wf(h).create(one_node("broken"))
    await _wf(h).start("broken")
    await _finish(h, _task("a", "broken"), fail="internal_error")
    before = await _wf(h).state("broken")
    nodes_before = dict(before.nodes)
    assert before.run.status is W.FAILED
    _fail_next_save(h, monkeypatch)

    with pytest.raises(StoreUnavailableError):
        await _wf(h).resume("broken", data='{"fixed": true}')

    after = await _wf(h).state("broken")
    assert (after.run, after.nodes) == (before.run, nodes_before)
    assert h.engine.scheduler.get(_task("a", "broken", 2)) is None
    assert await h.events("workflow.resumed") == []
    assert await h.events("workflow.node_reset") == []
    # Resuming again does it, once, with the data given then.
    state = await _wf(h).resume("broken", data='{"fixed": true}')
    assert state.run.status is W.RUNNING and '"fixed":true' in state.run.data
    assert len(await h.events("workflow.resumed")) == 1
    assert await _task_state(h, _task("a", "broken", 2)) == ("DISPATCHED", "")


async def test_a_finished_workflow_is_refused_naming_its_state(h: EngineHarness) -> None:
    await _wf(h).create(one_node("done"))
    await _wf(h).start("done")
    await _finish(h, _task("a", "done"))
    await _wf(h).create(one_node("broken"))
    await _wf(h).start("broken")
    await _finish(h, _task("a", "broken"), fail="internal_error")
    for workflow_id, status in (("done", "COMPLETED"), ("broken", "FAILED")):
        before = await _wf(h).state(workflow_id)
        with pytest.raises(AlreadyCompletedError) as caught:
            await _wf(h).cancel(workflow_id, "too late", "ops")
        assert caught.value.details == {"workflow_id": workflow_id, "state": status}
        assert f"is {status}: only a CREATED or RUNNING workflow" in caught.value.message
        assert await _wf(h).state(workflow_id) == before
    assert await h.events("workflow.cancelled") == []
    with pytest.raises(NotFoundError):
        await _wf(h).cancel("ghost")
    with pytest.raises(ValidationError) as invalid:
        await _wf(h).cancel("")
    assert invalid.value.details["field"] == "workflow_id"


async def test_a_created_workflow_is_cancelled_before_it_ever_runs(h: EngineHarness) -> None:
    await _wf(h).create(two_on_one_agent("later"))
    state = await _wf(h).cancel("later", by="ops")
    assert state.run.status is W.CANCELLED and state.run.started_at == 0
    assert {k: r.status for k, r in state.nodes.items()} == {
        "x": S.SKIPPED, "y": S.SKIPPED, "z": S.SKIPPED
    }  # fmt: skip
    assert state.nodes["x"].error == "cancelled by ops"
    with pytest.raises(AlreadyCompletedError, match="cannot be started"):
        await _wf(h).start("later")
    assert h.engine.scheduler.get(_task("x", "later")) is None


async def test_a_retry_waiting_for_its_delay_is_cancelled_and_never_submitted(
    h: EngineHarness,
) -> None:
    await _wf(h).create(one_node("r", retries="2", retry_delay_s="30"))
    await _wf(h).start("r")
    await _finish(h, _task("a", "r"), fail="internal_error")
    waiting = (await _wf(h).state("r")).nodes["a"]
    assert waiting.status is S.READY and waiting.due_at == h.clock.now() + 30
    state = await _wf(h).cancel("r", by="ops")
    assert (state.nodes["a"].status, state.nodes["a"].due_at) == (S.SKIPPED, 0.0)
    h.clock.advance(60)
    assert await _wf(h).fire_due() == 0
    assert h.engine.scheduler.get(_task("a", "r", 2)) is None


async def test_a_queued_task_a_crash_left_behind_is_cancelled_at_the_next_start(
    opener: Opener,
) -> None:
    """The run is stored CANCELLED before its tasks are stopped: a crash in between leaves a
    queued task, which the next start cancels."""
    async with opener.open() as h:
        await _wf(h).create(two_on_one_agent())
        await _wf(h).start("wf")
        stored = await h.store.workflows.get("wf")
        assert stored is not None
        # What the store holds when the coordinator dies right after the cancelling write.
        await h.store.workflows.save(replace(stored.run, status=W.CANCELLED), [])
    async with opener.open() as h:
        assert await _task_state(h, _task("y")) == ("FAILED", "cancelled")
        assert (await h.engine.scheduler.find(_task("y"))).note == (
            "cancelled by workflow: workflow wf was cancelled"
        )
        assert h.engine.scheduler.get(_task("x")) is not None  # held by its agent: left


# --- listing ----------------------------------------------------------------------------


async def test_workflows_are_listed_by_id_with_a_state_filter_and_a_cursor(
    h: EngineHarness,
) -> None:
    for n in range(5):
        await _wf(h).create(two_on_one_agent(f"wf-{n}"))
    await _wf(h).start("wf-1")
    await _wf(h).start("wf-3")
    await _finish(h, _task("x", "wf-1"))
    await _wf(h).cancel("wf-3", by="ops")
    reads = _wf(h).reads

    page, cursor = await reads.summaries(limit=2)
    assert [s.workflow_id for s in page] == ["wf-0", "wf-1"] and cursor == "wf-1"
    page, cursor = await reads.summaries(after_id=cursor, limit=2)
    assert [s.workflow_id for s in page] == ["wf-2", "wf-3"] and cursor == "wf-3"
    page, cursor = await reads.summaries(after_id=cursor, limit=2)
    assert [s.workflow_id for s in page] == ["wf-4"] and cursor == ""

    every, _ = await reads.summaries()
    by_id = {s.workflow_id: s for s in every}
    assert [s.status for s in every] == [W.CREATED, W.RUNNING, W.CREATED, W.CANCELLED, W.CREATED]
    one = by_id["wf-1"]
    assert (one.nodes_done, one.nodes_total) == (1, 3)  # x completed; y queued, z running
    assert one.started_at > 0 and one.updated_at >= one.started_at and one.completed_at == 0
    assert (by_id["wf-3"].nodes_done, by_id["wf-3"].completed_at) == (3, h.clock.now())
    assert by_id["wf-0"].created_at > 0 and by_id["wf-0"].started_at == 0

    running, _ = await reads.summaries(["RUNNING", "CANCELLED"])
    assert [s.workflow_id for s in running] == ["wf-1", "wf-3"]
    assert await reads.summaries([]) == ([], "")
    with pytest.raises(ValidationError) as caught:
        await reads.summaries(["RUNNING", "DONE"])
    assert caught.value.details["field"] == "states" and "'DONE'" in caught.value.message
    with pytest.raises(ValidationError) as caught:
        await reads.summaries(limit=0)
    assert caught.value.details["field"] == "limit"


# --- history ----------------------------------------------------------------------------


async def test_a_runs_history_is_its_correlated_events_paged_by_sequence(
    h: EngineHarness,
) -> None:
    await _wf(h).create(two_on_one_agent())
    await _wf(h).create(one_node("other"))
    await _wf(h).start("wf")
    await _wf(h).start("other")
    await _finish(h, _task("x"))
    await _wf(h).cancel("wf", "enough", "ops")
    reads = _wf(h).reads

    everything = [e for e in await h.events() if e.correlation_id == "wf"]
    found, cursor = await reads.history("wf", limit=10_000)
    assert found == everything and cursor == 0
    types = [e.event_type for e in found]
    assert types[0] == "workflow.created" and types[-1] == "workflow.tasks_stopped"
    # Between them: the tasks waiting at their agent asked back (their CONTROL envelopes).
    assert "workflow.cancelled" in types[types.index("workflow.node_completed") :]
    assert "workflow.node_completed" in types
    assert any(t.startswith("message.") for t in types)  # its nodes' task envelopes

    pages, after = [], 0
    while True:
        page, after = await reads.history("wf", after, 3)
        pages.append(page)
        if not after:
            break
        assert after == page[-1].sequence
    assert [e for page in pages for e in page] == everything
    assert all(len(page) == 3 for page in pages[:-1]) and 1 <= len(pages[-1]) <= 3

    own, _ = await reads.history("wf", event_types=frozenset({"workflow."}))
    assert [e.event_type for e in own] == [t for t in types if t.startswith("workflow.")]
    other, _ = await reads.history("other")
    assert {e.correlation_id for e in other} == {"other"}

    with pytest.raises(NotFoundError):
        await reads.history("ghost")
    with pytest.raises(ValidationError) as caught:
        await reads.history("")
    assert caught.value.details["field"] == "workflow_id"


async def test_a_history_read_again_later_goes_on_where_it_stopped(h: EngineHarness) -> None:
    await _wf(h).create(two_on_one_agent())
    first, _ = await _wf(h).reads.history("wf")
    assert [e.event_type for e in first] == ["workflow.created"]
    await _wf(h).start("wf")
    later, _ = await _wf(h).reads.history("wf", first[-1].sequence)
    assert later and later[0].event_type == "workflow.started"
    assert all(e.sequence > first[-1].sequence for e in later)
