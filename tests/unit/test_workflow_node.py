"""The workflow node machine (RFC 17.7 "Node Status Transitions") over every (status, input)
pair, its decisions (readiness, retries, propagation), and workflow_data mapping."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace

import pytest

from apiary.core.machine import IllegalTransitionError
from apiary.core.workflow.data import (
    MissingPathError,
    apply_output,
    assign,
    lookup,
    node_input,
    parse_data,
    parse_output,
    parse_path,
)
from apiary.core.workflow.definition import FailurePolicy, NodeOptions, NodeSpec, TriggerType
from apiary.core.workflow.event import EventMessage, event_matches, parse_event_match
from apiary.core.workflow.node import (
    NodeEffect,
    NodeInput,
    NodeMachine,
    NodeRun,
    NodeStatus,
    after_failure,
    descendants,
    mermaid,
    propagation,
    ready_to_activate,
)
from apiary.core.workflow.run import WorkflowStatus, derive_status
from apiary.errors import ValidationError

S, I, F = NodeStatus, NodeInput, NodeEffect  # noqa: E741
T0 = 1_700_000_000.0

EXPECTED = {
    (S.PENDING, I.ACTIVATE): S.READY,
    (S.PENDING, I.SKIP): S.SKIPPED,
    (S.PENDING, I.UPSTREAM_FAILED): S.FAILED,
    (S.PENDING, I.TRIGGER): S.PENDING,
    (S.PENDING, I.ARM): S.PENDING,
    (S.READY, I.DISPATCHED): S.RUNNING,
    (S.READY, I.RETRY): S.READY,
    (S.READY, I.FAIL): S.FAILED,
    (S.RUNNING, I.COMPLETE): S.COMPLETED,
    (S.RUNNING, I.RETRY): S.READY,
    (S.RUNNING, I.FAIL): S.FAILED,
    (S.COMPLETED, I.RESET): S.PENDING,
    (S.FAILED, I.RESET): S.PENDING,
    (S.SKIPPED, I.RESET): S.PENDING,
    (S.PENDING, I.CANCEL): S.SKIPPED,
    (S.READY, I.CANCEL): S.SKIPPED,
    (S.RUNNING, I.CANCEL): S.FAILED,
}
"""The whole table: every other pair is illegal."""


@pytest.mark.parametrize(("status", "event"), list(itertools.product(S, I)))
def test_every_status_and_input_pair_is_a_row_or_illegal(status: S, event: I) -> None:
    run = NodeRun("n", status, attempts=1, task_id="t-1")
    expected = EXPECTED.get((status, event))
    if expected is None:
        assert not NodeMachine.allows(status, event)
        with pytest.raises(IllegalTransitionError):
            NodeMachine.step(run, event, T0, task_id="t-2")
        return
    step = NodeMachine.step(run, event, T0, task_id="t-2", error="e", output="1", due_at=T0)
    assert step.run.status is expected and step.run.updated_at == T0
    assert step.effects[:2] == (F.PERSIST, F.EMIT_EVENT)
    assert step.event_type.startswith("workflow.node_")


def test_each_transition_does_what_it_says() -> None:
    run = NodeRun("n")
    ready = NodeMachine.step(run, I.ACTIVATE, T0)
    assert F.SUBMIT_TASK in ready.effects
    running = NodeMachine.step(ready.run, I.DISPATCHED, T0 + 1, task_id="t-1")
    assert (running.run.attempts, running.run.dispatches, running.run.started_at) == (1, 1, T0 + 1)
    retry_now = NodeMachine.step(running.run, I.RETRY, T0 + 2, error="x", due_at=T0 + 2)
    assert F.SUBMIT_TASK in retry_now.effects and F.START_TIMER not in retry_now.effects
    retry_later = NodeMachine.step(running.run, I.RETRY, T0 + 2, error="x", due_at=T0 + 9)
    assert F.START_TIMER in retry_later.effects and F.SUBMIT_TASK not in retry_later.effects
    again = NodeMachine.step(retry_now.run, I.DISPATCHED, T0 + 3, task_id="t-2")
    assert (again.run.attempts, again.run.started_at) == (2, T0 + 1)  # first start kept
    done = NodeMachine.step(again.run, I.COMPLETE, T0 + 4, output='{"k":1}')
    assert (done.run.output, done.run.completed_at, done.run.error) == ('{"k":1}', T0 + 4, "")
    assert F.RELEASE_DEPENDENTS in done.effects
    reset = NodeMachine.step(done.run, I.RESET, T0 + 5)
    assert reset.run == NodeRun("n", dispatches=2, updated_at=T0 + 5)  # next task id is new
    failed = NodeMachine.step(running.run, I.FAIL, T0 + 6, error="boom")
    assert F.PROPAGATE in failed.effects and failed.run.error == "boom"
    triggered = NodeMachine.step(run, I.TRIGGER, T0, payload='{"m":1}')
    assert triggered.run.triggered and triggered.run.event == '{"m":1}'
    with pytest.raises(ValidationError):
        NodeMachine.step(ready.run, I.DISPATCHED, T0)  # a dispatch names its task


def test_cancel_ends_an_unfinished_node_and_stops_only_a_running_nodes_task() -> None:
    why = "cancelled by ops: wrong input"
    waiting = NodeMachine.step(NodeRun("n", due_at=T0 + 60), I.CANCEL, T0, error=why)
    assert (waiting.run.status, waiting.run.error, waiting.run.due_at) == (S.SKIPPED, why, 0.0)
    assert waiting.run.completed_at == T0 and F.STOP_TASK not in waiting.effects
    assert waiting.event_type == "workflow.node_cancelled"
    retrying = NodeRun("n", S.READY, attempts=1, dispatches=1, task_id="t-1", due_at=T0 + 9)
    assert NodeMachine.step(retrying, I.CANCEL, T0, error=why).effects == (
        F.PERSIST, F.EMIT_EVENT
    )  # fmt: skip
    running = NodeRun("n", S.RUNNING, attempts=1, dispatches=1, task_id="t-1")
    stopped = NodeMachine.step(running, I.CANCEL, T0, error=why)
    assert (stopped.run.status, stopped.run.task_id, stopped.run.error) == (S.FAILED, "t-1", why)
    assert stopped.effects == (F.PERSIST, F.EMIT_EVENT, F.STOP_TASK)
    assert F.PROPAGATE not in stopped.effects  # every other unfinished node is cancelled too
    for ended in (S.COMPLETED, S.FAILED, S.SKIPPED):
        with pytest.raises(IllegalTransitionError):
            NodeMachine.step(NodeRun("n", ended), I.CANCEL, T0)


def test_readiness_needs_every_dependency_completed_and_the_trigger() -> None:
    node = NodeSpec("c", "x", ("a", "b"))
    pending = NodeRun("c")
    assert not ready_to_activate(node, pending, {"a": S.COMPLETED, "b": S.RUNNING})
    assert not ready_to_activate(node, pending, {"a": S.COMPLETED, "b": S.SKIPPED})
    assert ready_to_activate(node, pending, {"a": S.COMPLETED, "b": S.COMPLETED})
    manual = replace(node, trigger=TriggerType.MANUAL)
    both = {"a": S.COMPLETED, "b": S.COMPLETED}
    assert not ready_to_activate(manual, pending, both)
    assert ready_to_activate(manual, replace(pending, triggered=True), both)
    assert not ready_to_activate(node, replace(pending, status=S.READY), both)


def test_retries_then_failure_and_propagation_per_policy() -> None:
    options = NodeOptions(scope="resource:x", max_attempts=3, retry_delay_s=10)
    assert after_failure(NodeRun("n", attempts=1), options, T0) == (I.RETRY, T0 + 10)
    assert after_failure(NodeRun("n", attempts=2), options, T0) == (I.RETRY, T0 + 20)
    assert after_failure(NodeRun("n", attempts=3), options, T0) == (I.FAIL, 0.0)
    assert propagation(S.FAILED, FailurePolicy.SKIP) is I.SKIP
    assert propagation(S.FAILED, FailurePolicy.FAIL) is I.UPSTREAM_FAILED
    assert propagation(S.SKIPPED, FailurePolicy.FAIL) is I.SKIP
    dependents = {"a": ["b", "c"], "b": ["d"], "c": ["d"], "d": []}
    assert descendants("a", dependents) == ["b", "c", "d"]


def test_the_workflow_status_follows_its_nodes() -> None:
    def runs(*statuses: S) -> list[NodeRun]:
        return [NodeRun(f"n{i}", s) for i, s in enumerate(statuses)]

    assert derive_status(runs(S.COMPLETED, S.PENDING)) is WorkflowStatus.RUNNING
    assert derive_status(runs(S.COMPLETED, S.SKIPPED)) is WorkflowStatus.COMPLETED
    assert derive_status(runs(S.COMPLETED, S.FAILED, S.SKIPPED)) is WorkflowStatus.FAILED
    # Only an unfinished run can be cancelled; a cancelled one is finished for good.
    assert [w for w in WorkflowStatus if w.cancellable] == [
        WorkflowStatus.CREATED, WorkflowStatus.RUNNING
    ]  # fmt: skip
    assert WorkflowStatus.CANCELLED.finished and not WorkflowStatus.RUNNING.finished


def test_the_diagram_shows_every_row() -> None:
    diagram = mermaid()
    for (status, event), target in EXPECTED.items():
        assert f"    {status} --> {target}: {event}" in diagram


# --- workflow_data --------------------------------------------------------------------------


def test_paths_in_both_forms() -> None:
    assert parse_path("a.b.0", "f") == ("a", "b", "0")
    assert parse_path("$", "f") == ()
    assert parse_path("$.a[2]['x.y'][\"q\"]", "f") == ("a", 2, "x.y", "q")
    for bad in ("", "a..b", ".a", "$.a[", "$x", "$.a[-1]"):
        with pytest.raises(ValidationError) as caught:
            parse_path(bad, "nodes.n.input_mapping['p']")
        assert caught.value.details["field"] == "nodes.n.input_mapping['p']"
    doc = {"a": {"items": [{"name": "x"}], "0": "key"}}
    assert lookup(doc, parse_path("a.items.0.name", "f")) == "x"
    assert lookup(doc, parse_path("$.a['0']", "f")) == "key"
    with pytest.raises(MissingPathError):
        lookup(doc, parse_path("a.items.3", "f"))
    assert assign({}, ("x", "y"), 1) == {"x": {"y": 1}}
    with pytest.raises(MissingPathError):
        assign({"x": 1}, ("x", "y"), 2)  # a value is never silently replaced by an object


def test_inputs_and_outputs_map_through_workflow_data() -> None:
    data = {"records": [1, 2], "cfg": {"mode": "fast"}}
    assert node_input(data, {}, "f") == data  # no mapping: all of it
    assert node_input(data, {"rows": "records", "opts.mode": "$.cfg.mode"}, "f") == {
        "rows": [1, 2], "opts": {"mode": "fast"}
    }  # fmt: skip
    with pytest.raises(ValidationError) as caught:
        node_input(data, {"x": "missing"}, "nodes.n.input_mapping")
    assert caught.value.details["field"] == "nodes.n.input_mapping['x']"
    output = {"summary": {"n": 2}, "rows": []}
    updated = apply_output(data, output, {"summary.n": "stats.count", "$": "last"}, "f")
    assert updated["stats"] == {"count": 2} and updated["last"] == output
    assert "stats" not in data  # the argument is left as it was
    assert apply_output(data, {"a": 1}, {"$": "$"}, "f") == {"a": 1}
    with pytest.raises(ValidationError):
        apply_output(data, [1], {"$": "$"}, "f")
    assert parse_output('{"a": 1}') == {"a": 1}
    assert parse_output("done") == "done" and parse_output("  ") is None
    assert parse_data("") == {}
    with pytest.raises(ValidationError):
        parse_data("nope")


# --- event matching ------------------------------------------------------------------------


def test_an_event_matches_on_type_producer_correlation_and_payload_fields() -> None:
    def message(body: object, producer: str = "p", kind: str = "DATA") -> EventMessage:
        return EventMessage("m", kind, producer, "corr-1", "application/json",
                            json.dumps(body).encode())  # fmt: skip

    match = parse_event_match(
        {"event_type": "data", "event_producer": "p", "event_correlation_id": "corr-1",
         "event_match": '{"kind": "upload", "$.meta.size": 3}'},
        "nodes.n.metadata",
    )  # fmt: skip
    good = {"kind": "upload", "meta": {"size": 3}}
    assert event_matches(match, message(good), "wf", "n")
    assert not event_matches(match, message(good, producer="q"), "wf", "n")
    assert not event_matches(match, message(good, kind="NOTIFICATION"), "wf", "n")
    assert not event_matches(match, message({"kind": "upload"}), "wf", "n")
    assert not event_matches(match, message({**good, "workflow_id": "other"}), "wf", "n")
    default = parse_event_match({}, "f")
    assert event_matches(default, message({"workflow_id": "wf", "node_id": "n"}), "wf", "n")
    assert not event_matches(default, message({"workflow_id": "wf"}), "wf", "n")
    assert not event_matches(default, EventMessage("m", "DATA", "p", "", "text/plain",
                                                   b"hi"), "wf", "n")  # fmt: skip
