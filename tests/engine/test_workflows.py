"""The workflow engine on a fake clock: DAG execution through the Scheduler, data mapping,
triggers, retries, failure propagation, resumption (RFC 17.7)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from apiary.core.envelope import AckStage, MessageType
from apiary.core.workflow.definition import NodeSpec, TriggerType, WorkflowSpec
from apiary.core.workflow.node import NodeStatus
from apiary.core.workflow.run import StoredWorkflow, WorkflowStatus
from apiary.engine.workflows import WORKFLOW, Workflows
from apiary.errors import (
    AlreadyCompletedError,
    AlreadyExistsError,
    AlreadyInProgressError,
    NotFoundError,
    ValidationError,
    WorkflowCycleDetectedError,
)
from apiary.testing.clock import FakeClock
from apiary.testing.engine import EngineHarness, open_test_engine
from apiary.testing.ids import SequentialIds

S = NodeStatus


@pytest.fixture
async def h() -> AsyncIterator[EngineHarness]:
    async with open_test_engine() as harness:
        for agent in ("agent-a", "agent-b", "agent-c", "agent-d"):
            await _ready(harness, agent)
        yield harness


async def _ready(h: EngineHarness, agent_id: str) -> None:
    await h.register(agent_id)
    await h.engine.scheduler.agent_ready(agent_id)


def _wf(h: EngineHarness) -> Workflows:
    return h.engine.workflows


def diamond(workflow_id: str = "wf", **node_meta: dict[str, str]) -> WorkflowSpec:
    """a -> (b, c) -> d: a reads `source`, b and c read a's output, d joins them."""

    def meta(node: str) -> dict[str, str]:
        return node_meta.get(node, {})

    return WorkflowSpec(
        workflow_id,
        {
            "a": NodeSpec("a", "agent-a", input_mapping={"file": "source"},
                          output_mapping={"records": "parsed"}, metadata=meta("a")),
            "b": NodeSpec("b", "agent-b", ("a",), input_mapping={"rows": "parsed"},
                          output_mapping={"$.count": "stats.b"}, metadata=meta("b")),
            "c": NodeSpec("c", "agent-c", ("a",), input_mapping={"rows": "parsed.0"},
                          output_mapping={"$.count": "stats.c"}, metadata=meta("c")),
            "d": NodeSpec("d", "agent-d", ("b", "c"), input_mapping={"stats": "stats"},
                          output_mapping={"$": "report"}, metadata=meta("d")),
        },
    )  # fmt: skip


async def _state(h: EngineHarness, workflow_id: str = "wf") -> StoredWorkflow:
    return await _wf(h).state(workflow_id)


async def _statuses(h: EngineHarness, workflow_id: str = "wf") -> dict[str, str]:
    return {k: r.status.value for k, r in (await _state(h, workflow_id)).nodes.items()}


def _params(h: EngineHarness, task_id: str) -> dict[str, Any]:
    task = h.engine.scheduler.get(task_id)
    assert task is not None, f"task {task_id} is not live"
    result: dict[str, Any] = json.loads(task.params)
    return result


async def _finish(
    h: EngineHarness, task_id: str, output: Any = None, *, fail: str = "", drain: bool = True
) -> None:
    """The agent reads the task and completes it with `output` as JSON note (or fails it)."""
    task = h.engine.scheduler.get(task_id)
    assert task is not None and task.message_id, f"task {task_id} was not dispatched"
    await h.ack(task.agent_id, task.message_id, AckStage.READ)
    if fail:
        await h.ack(task.agent_id, task.message_id, AckStage.FAILED, fail, "it broke")
    else:
        note = output if isinstance(output, str) else json.dumps(output)
        await h.ack(task.agent_id, task.message_id, AckStage.FULFILLED, note=note)
    if drain:
        await _wf(h).drain()


def _task(node: str, n: int = 1, workflow_id: str = "wf") -> str:
    return f"workflow:{workflow_id}:{node}:{n}"


async def _workflow_events(h: EngineHarness) -> list[tuple[str, str]]:
    return [
        (e.event_type, str(e.details.get("node_id", "")))
        for e in await h.events()
        if e.event_type.startswith("workflow.")
    ]


# --- the diamond of Appendix D C.12 -----------------------------------------------------------


@pytest.mark.conformance(
    "workflow.ops.create", "workflow.ops.start", "workflow.ops.get-state",
    "workflow.roots.execute-first", "workflow.execution.deps-completed",
    "patterns.workflow.no-run-before-deps",
)  # fmt: skip
async def test_a_diamond_runs_root_first_then_both_branches_then_the_join(
    h: EngineHarness,
) -> None:
    await _wf(h).create(diamond())
    state = await _wf(h).start("wf", json.dumps({"source": "in.csv"}))
    assert state.run.status is WorkflowStatus.RUNNING
    assert await _statuses(h) == {"a": "RUNNING", "b": "PENDING", "c": "PENDING", "d": "PENDING"}
    assert _params(h, _task("a")) == {
        "workflow_id": "wf", "node_id": "a", "attempt": 1, "input": {"file": "in.csv"},
        "description": "workflow wf node a",
    }  # fmt: skip

    await _finish(h, _task("a"), {"records": [{"id": 1}, {"id": 2}]})
    # Both branches are dispatched at once, each to its own agent.
    assert await _statuses(h) == {"a": "COMPLETED", "b": "RUNNING", "c": "RUNNING", "d": "PENDING"}
    assert _params(h, _task("b"))["input"] == {"rows": [{"id": 1}, {"id": 2}]}
    assert _params(h, _task("c"))["input"] == {"rows": {"id": 1}}

    await _finish(h, _task("b"), {"count": 2})
    assert (await _statuses(h))["d"] == "PENDING"  # c is not COMPLETED yet
    assert h.engine.scheduler.get(_task("d")) is None
    await _finish(h, _task("c"), {"count": 1})
    assert _params(h, _task("d"))["input"] == {"stats": {"b": 2, "c": 1}}
    await _finish(h, _task("d"), {"ok": True})

    done = await _state(h)
    assert done.run.status is WorkflowStatus.COMPLETED and done.run.completed_at > 0
    assert json.loads(done.run.data) == {
        "source": "in.csv", "parsed": [{"id": 1}, {"id": 2}], "stats": {"b": 2, "c": 1},
        "report": {"ok": True},
    }  # fmt: skip
    assert json.loads(done.nodes["b"].output) == {"count": 2}
    events = await _workflow_events(h)
    assert events[:3] == [("workflow.created", ""), ("workflow.started", ""),
                          ("workflow.node_ready", "a")]  # fmt: skip
    assert events[-1] == ("workflow.completed", "")
    for node in "abcd":
        kinds = [kind for kind, n in events if n == node]
        assert kinds == ["workflow.node_ready", "workflow.node_running", "workflow.node_completed"]
    # b and c were both running before either completed.
    order = [(kind, n) for kind, n in events if n in "bc"]
    assert order.index(("workflow.node_running", "c")) < order.index(
        ("workflow.node_completed", "b")
    )


async def test_a_workflow_id_is_generated_when_left_empty(h: EngineHarness) -> None:
    spec = await _wf(h).create(diamond(""))
    assert spec.workflow_id and spec.created_at == h.clock.now()
    assert (await _state(h, spec.workflow_id)).run.status is WorkflowStatus.CREATED


@pytest.mark.conformance(
    "workflow.validation.at-create", "patterns.workflow.validation.at-create",
    "workflow.cycle.error-code", "patterns.workflow.cycle.error-code",
)  # fmt: skip
async def test_an_invalid_definition_is_refused_before_anything_is_stored(
    h: EngineHarness,
) -> None:
    cyclic = WorkflowSpec("bad", {"a": NodeSpec("a", "agent-a", ("b",)),
                                  "b": NodeSpec("b", "agent-b", ("a",))})  # fmt: skip
    with pytest.raises(WorkflowCycleDetectedError):
        await _wf(h).create(cyclic)
    missing = WorkflowSpec("bad", {"a": NodeSpec("a", "agent-a", ("zz",))})
    with pytest.raises(ValidationError) as caught:
        await _wf(h).create(missing)
    assert caught.value.details["field"] == "nodes.a.dependencies"
    assert await h.store.workflows.get("bad") is None
    assert [e for e in await h.events() if e.event_type.startswith("workflow.")] == []


async def test_requests_on_the_wrong_workflow_or_at_the_wrong_time_are_refused(
    h: EngineHarness,
) -> None:
    await _wf(h).create(diamond())
    with pytest.raises(AlreadyExistsError):
        await _wf(h).create(diamond())
    with pytest.raises(NotFoundError):
        await _wf(h).start("nope")
    with pytest.raises(ValidationError) as caught:
        await _wf(h).resume("wf", "a")
    assert caught.value.details["field"] == "workflow_id"  # never started
    with pytest.raises(ValidationError) as caught:
        await _wf(h).start("wf", "[1, 2]")
    assert caught.value.details["field"] == "workflow_data"
    await _wf(h).start("wf", '{"source": "x"}')
    with pytest.raises(AlreadyInProgressError):
        await _wf(h).start("wf")
    with pytest.raises(NotFoundError):
        await _wf(h).resume("wf", "zz")
    with pytest.raises(AlreadyInProgressError):
        await _wf(h).resume("wf", "a")  # running


async def test_a_finished_workflow_is_not_started_again(h: EngineHarness) -> None:
    await _wf(h).create(WorkflowSpec("one", {"a": NodeSpec("a", "agent-a")}))
    await _wf(h).start("one")
    await _finish(h, _task("a", workflow_id="one"), "plain words")
    state = await _state(h, "one")
    assert state.run.status is WorkflowStatus.COMPLETED
    assert json.loads(state.nodes["a"].output) == "plain words"  # a note that is not JSON
    with pytest.raises(AlreadyCompletedError):
        await _wf(h).start("one")


# --- failures, retries, propagation -----------------------------------------------------------


async def test_a_failed_attempt_is_retried_then_the_failure_skips_the_dependents(
    h: EngineHarness,
) -> None:
    await _wf(h).create(diamond(b={"retries": "1"}))
    await _wf(h).start("wf", '{"source": "x"}')
    await _finish(h, _task("a"), {"records": [1]})
    await _finish(h, _task("b"), fail="tool_timeout")
    state = await _state(h)
    assert state.nodes["b"].status is S.RUNNING and state.nodes["b"].task_id == _task("b", 2)
    assert _params(h, _task("b", 2))["attempt"] == 2
    await _finish(h, _task("b", 2), fail="tool_timeout")
    await _finish(h, _task("c"), {"count": 1})
    state = await _state(h)
    assert {k: r.status for k, r in state.nodes.items()} == {
        "a": S.COMPLETED, "b": S.FAILED, "c": S.COMPLETED, "d": S.SKIPPED,
    }  # fmt: skip
    assert state.nodes["b"].error == "tool_timeout: it broke"
    assert state.nodes["b"].attempts == 2
    assert state.nodes["d"].error == "dependency b failed"
    assert state.run.status is WorkflowStatus.FAILED
    kinds = [k for k, n in await _workflow_events(h) if n == "b"]
    assert kinds == [
        "workflow.node_ready", "workflow.node_running", "workflow.node_retrying",
        "workflow.node_running", "workflow.node_failed",
    ]  # fmt: skip


async def test_under_the_fail_policy_dependents_fail_as_upstream_failed(h: EngineHarness) -> None:
    spec = diamond()
    spec = WorkflowSpec("wf", spec.nodes, metadata={"on_failure": "fail"})
    await _wf(h).create(spec)
    await _wf(h).start("wf", '{"source": "x"}')
    await _finish(h, _task("a"), fail="internal_error")
    state = await _state(h)
    assert [state.nodes[k].status for k in "abcd"] == [S.FAILED] * 4
    assert state.nodes["d"].error.startswith("upstream_failed: dependency ")
    assert state.run.status is WorkflowStatus.FAILED


async def test_a_retry_delay_waits_in_virtual_time_and_doubles(h: EngineHarness) -> None:
    await _wf(h).create(
        WorkflowSpec("r", {"a": NodeSpec("a", "agent-a",
                                         metadata={"retries": "2", "retry_delay_s": "30"})})
    )  # fmt: skip
    await _wf(h).start("r")
    await _finish(h, _task("a", 1, "r"), fail="tool_timeout")
    run = (await _state(h, "r")).nodes["a"]
    assert run.status is S.READY and run.due_at == h.clock.now() + 30
    h.clock.advance(29.5)
    assert await _wf(h).fire_due() == 0
    assert h.engine.scheduler.get(_task("a", 2, "r")) is None
    h.clock.advance(0.5)
    assert await _wf(h).fire_due() == 1
    await _finish(h, _task("a", 2, "r"), fail="tool_timeout")
    assert (await _state(h, "r")).nodes["a"].due_at == h.clock.now() + 60


async def test_a_missing_output_key_fails_the_node_naming_the_mapping(h: EngineHarness) -> None:
    await _wf(h).create(diamond())
    await _wf(h).start("wf", '{"source": "x"}')
    await _finish(h, _task("a"), {"rows": []})
    node = (await _state(h)).nodes["a"]
    assert node.status is S.FAILED
    assert "nodes.a.output_mapping['records']" in node.error


async def test_a_missing_input_fails_the_node_without_running_it(h: EngineHarness) -> None:
    await _wf(h).create(diamond())
    await _wf(h).start("wf")  # no "source" in workflow_data
    node = (await _state(h)).nodes["a"]
    assert node.status is S.FAILED and node.attempts == 0
    assert "workflow_data has nothing at 'source'" in node.error
    assert h.engine.scheduler.get(_task("a")) is None


async def test_a_node_of_an_unknown_agent_fails_as_not_submitted(h: EngineHarness) -> None:
    await _wf(h).create(WorkflowSpec("u", {"a": NodeSpec("a", "ghost")}))
    await _wf(h).start("u")
    node = (await _state(h, "u")).nodes["a"]
    assert node.status is S.FAILED and node.error.startswith("not submitted: NOT_FOUND")


async def test_a_false_condition_skips_the_node_and_what_depends_on_it(h: EngineHarness) -> None:
    await _wf(h).create(diamond(c={"condition": "flags.enrich"}))
    await _wf(h).start("wf", '{"source": "x", "flags": {"enrich": false}}')
    await _finish(h, _task("a"), {"records": [1]})
    await _finish(h, _task("b"), {"count": 1})
    state = await _state(h)
    assert state.nodes["c"].status is S.SKIPPED and "is false" in state.nodes["c"].error
    assert state.nodes["d"].status is S.SKIPPED
    assert state.run.status is WorkflowStatus.COMPLETED  # skipping is not failing


# --- triggers ---------------------------------------------------------------------------------


async def test_a_schedule_node_runs_at_its_next_cron_time(h: EngineHarness) -> None:
    spec = WorkflowSpec("s", {
        "a": NodeSpec("a", "agent-a"),
        "b": NodeSpec("b", "agent-b", ("a",), TriggerType.SCHEDULE,
                      metadata={"cron": "0 * * * *"}),
    })  # fmt: skip
    await _wf(h).create(spec)
    await _wf(h).start("s")
    await _finish(h, _task("a", 1, "s"), {})
    run = (await _state(h, "s")).nodes["b"]
    hour = (int(h.clock.now()) // 3600 + 1) * 3600
    assert (run.status, run.due_at) == (S.PENDING, hour)
    h.clock.advance(hour - h.clock.now() - 1)
    assert await _wf(h).fire_due() == 0
    h.clock.advance(1)
    assert await _wf(h).fire_due() == 1
    assert (await _state(h, "s")).nodes["b"].status is S.RUNNING


async def test_an_event_node_fires_on_a_matching_message_even_one_that_came_early(
    h: EngineHarness,
) -> None:
    match = {"event_type": "NOTIFICATION", "event_producer": "agent-c",
             "event_match": '{"kind": "upload", "$.file.ext": "csv"}'}  # fmt: skip
    spec = WorkflowSpec("e", {
        "a": NodeSpec("a", "agent-a"),
        "b": NodeSpec("b", "agent-b", ("a",), TriggerType.EVENT, metadata=match),
    })  # fmt: skip
    await _wf(h).create(spec)
    await _wf(h).start("e")
    wrong = {"kind": "upload", "file": {"ext": "txt"}}
    with pytest.raises(NotFoundError):
        await h.send("agent-c", WORKFLOW, wrong, message_type=MessageType.NOTIFICATION)
    with pytest.raises(NotFoundError):  # right body, wrong producer
        await h.send("agent-d", WORKFLOW, {"kind": "upload", "file": {"ext": "csv"}},
                     message_type=MessageType.NOTIFICATION)  # fmt: skip
    body = {"kind": "upload", "file": {"ext": "csv", "name": "q3.csv"}}
    outcome = await h.send("agent-c", WORKFLOW, body, message_type=MessageType.NOTIFICATION)
    assert outcome.accepted
    run = (await _state(h, "e")).nodes["b"]
    assert run.status is S.PENDING and run.triggered  # a is not done: remembered
    await _finish(h, _task("a", 1, "e"), {})
    event = _params(h, _task("b", 1, "e"))["event"]
    assert event["producer_id"] == "agent-c" and event["payload"] == body
    assert event["message_type"] == "NOTIFICATION"


async def test_an_event_node_without_criteria_waits_for_a_message_naming_it(
    h: EngineHarness,
) -> None:
    await _wf(h).create(
        WorkflowSpec("e", {"a": NodeSpec("a", "agent-a", trigger=TriggerType.EVENT)})
    )
    await _wf(h).start("e")
    with pytest.raises(NotFoundError):
        await h.send("agent-c", WORKFLOW, {"workflow_id": "e", "node_id": "other"})
    await h.send("agent-c", WORKFLOW, {"workflow_id": "e", "node_id": "a"})
    assert (await _state(h, "e")).nodes["a"].status is S.RUNNING


@pytest.mark.conformance("workflow.ops.resume")
async def test_a_manual_node_waits_for_resume_and_a_failed_node_runs_again(
    h: EngineHarness,
) -> None:
    spec = WorkflowSpec("m", {
        "a": NodeSpec("a", "agent-a", trigger=TriggerType.MANUAL),
        "b": NodeSpec("b", "agent-b", ("a",), output_mapping={"n": "n"}),
    })  # fmt: skip
    await _wf(h).create(spec)
    await _wf(h).start("m")
    assert (await _statuses(h, "m")) == {"a": "PENDING", "b": "PENDING"}
    await _wf(h).resume("m", "a")
    await _finish(h, _task("a", 1, "m"), {})
    await _finish(h, _task("b", 1, "m"), fail="tool_timeout")
    assert (await _state(h, "m")).run.status is WorkflowStatus.FAILED
    # Recovery: fix the data, run b again (its next dispatch has a new task id).
    state = await _wf(h).resume("m", "b", '{"hint": "retry"}', {"by": "operator"})
    assert state.run.status is WorkflowStatus.RUNNING and state.nodes["b"].status is S.RUNNING
    assert state.run.metadata == {"by": "operator"}
    await _finish(h, _task("b", 2, "m"), {"n": 7})
    done = await _state(h, "m")
    assert done.run.status is WorkflowStatus.COMPLETED
    assert json.loads(done.run.data) == {"hint": "retry", "n": 7}
    assert ("workflow.node_reset", "b") in await _workflow_events(h)


async def test_resume_without_a_node_reruns_every_failed_and_skipped_node(
    h: EngineHarness,
) -> None:
    await _wf(h).create(diamond())
    await _wf(h).start("wf", '{"source": "x"}')
    await _finish(h, _task("a"), fail="tool_timeout")
    assert (await _state(h)).run.status is WorkflowStatus.FAILED
    await _wf(h).resume("wf")
    assert await _statuses(h) == {"a": "RUNNING", "b": "PENDING", "c": "PENDING", "d": "PENDING"}


# --- restart ----------------------------------------------------------------------------------


async def test_a_workflow_resumes_after_a_restart_from_its_sqlite_file(tmp_path: Path) -> None:
    url, clock, ids = f"sqlite:///{tmp_path / 'apiary.db'}", FakeClock(), SequentialIds()
    async with open_test_engine(store_url=url, data_dir=tmp_path, clock=clock, ids=ids) as h:
        for agent in ("agent-a", "agent-b", "agent-c", "agent-d"):
            await _ready(h, agent)
        await _wf(h).create(diamond())
        await _wf(h).start("wf", '{"source": "x"}')
        await _finish(h, _task("a"), {"records": [1, 2]})
        # b completes in the Scheduler, but the coordinator stops before the workflow
        # engine applies it; c is still running.
        await _finish(h, _task("b"), {"count": 2}, drain=False)
        c_message = (h.engine.scheduler.get(_task("c")) or pytest.fail("c")).message_id
        await h.engine.events.flush()

    async with open_test_engine(store_url=url, data_dir=tmp_path, clock=clock, ids=ids) as h:
        assert await _wf(h).drain() == 1  # b's end, found on reload
        assert await _statuses(h) == {"a": "COMPLETED", "b": "COMPLETED", "c": "RUNNING",
                                      "d": "PENDING"}  # fmt: skip
        for agent in ("agent-c", "agent-d"):  # their streams open again
            await h.engine.scheduler.agent_ready(agent)
        await h.ack("agent-c", c_message, AckStage.FULFILLED, note='{"count": 1}')
        await _wf(h).drain()
        await _finish(h, _task("d"), {"done": True})
        state = await _state(h)
        assert state.run.status is WorkflowStatus.COMPLETED
        assert json.loads(state.run.data)["stats"] == {"b": 2, "c": 1}
        await h.engine.events.flush()


async def test_retry_and_cron_timers_are_armed_again_after_a_restart(tmp_path: Path) -> None:
    url, clock, ids = f"sqlite:///{tmp_path / 'apiary.db'}", FakeClock(), SequentialIds()
    spec = WorkflowSpec("t", {
        "a": NodeSpec("a", "agent-a", metadata={"retries": "1", "retry_delay_s": "60"}),
        "s": NodeSpec("s", "agent-b", trigger=TriggerType.SCHEDULE,
                      metadata={"cron": "*/30 * * * *"}),
    })  # fmt: skip
    async with open_test_engine(store_url=url, data_dir=tmp_path, clock=clock, ids=ids) as h:
        for agent in ("agent-a", "agent-b"):
            await _ready(h, agent)
        await _wf(h).create(spec)
        await _wf(h).start("t")
        await _finish(h, _task("a", 1, "t"), fail="tool_timeout")
        before = await _state(h, "t")
        await h.engine.events.flush()
    assert before.nodes["a"].status is S.READY and before.nodes["s"].due_at > 0

    async with open_test_engine(store_url=url, data_dir=tmp_path, clock=clock, ids=ids) as h:
        for agent in ("agent-a", "agent-b"):
            await h.engine.scheduler.agent_ready(agent)
        assert _wf(h).next_deadline() == min(before.nodes["a"].due_at, before.nodes["s"].due_at)
        clock.advance(max(before.nodes["a"].due_at, before.nodes["s"].due_at) - clock.now())
        assert await _wf(h).fire_due() == 2
        assert await _statuses(h, "t") == {"a": "RUNNING", "s": "RUNNING"}
        assert _params(h, _task("a", 2, "t"))["attempt"] == 2
        await h.engine.events.flush()
