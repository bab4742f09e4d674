"""The runtime contract's documents as Apiary's types (core/runtime/): the seven lime-profile
fixtures load and round-trip unchanged, the event types are the schema's, documents the
runtime writes validate against the schemas, and malformed ones are refused naming the
property."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from apiary.core.events import Event
from apiary.core.records import TaskRecord, TaskState
from apiary.core.runtime.events import EVENT_TYPES, RuntimeEvent, RuntimeEventType
from apiary.core.runtime.log import Fact, details, log_type, runtime_event
from apiary.core.runtime.packs import BenchmarkTrialPack, read_runtime_document
from apiary.core.runtime.records import SessionRecord, ThreadRecord, TurnRecord
from apiary.core.runtime.snapshot import RuntimeSnapshot, TaskView
from apiary.core.runtime.views import ThreadState, snapshot, task_view
from apiary.errors import ValidationError
from tests.server.runtime_harness import VECTORS, check_event, check_snapshot

FIXTURES = sorted((VECTORS / "fixtures" / "lime-profile").glob("*.json"))


def _load(path: Path) -> Any:
    return json.loads(path.read_text())


def test_there_are_the_seven_fixtures() -> None:
    assert len(FIXTURES) == 7


@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_every_fixture_loads_and_round_trips_through_apiarys_types(path: Path) -> None:
    doc = _load(path)
    typed = read_runtime_document(doc)
    assert typed.to_json() == doc
    assert json.dumps(typed.to_json(), sort_keys=True) == json.dumps(doc, sort_keys=True)
    if isinstance(typed, RuntimeEvent):
        check_event(doc)
        assert typed.type in EVENT_TYPES and typed.sequence is not None
    elif isinstance(typed, RuntimeSnapshot):
        check_snapshot(doc)
        assert typed.threads[0].thread_id == "thread_lime_001"
    else:
        assert isinstance(typed, BenchmarkTrialPack)
        assert typed.session_id == "sess_123" and typed.benchmark["role"] == "candidate"


def test_the_event_types_are_the_schemas_in_its_order() -> None:
    schema = _load(VECTORS / "agentruntime-event.schema.json")
    assert [t.value for t in RuntimeEventType] == schema["properties"]["type"]["enum"]
    assert len(EVENT_TYPES) == 120


def test_fields_are_typed_and_the_rest_kept() -> None:
    doc = _load(VECTORS / "fixtures" / "lime-profile" / "submit-turn-event.json")
    event = RuntimeEvent.from_json(doc)
    assert (event.type, event.turn_id, event.sequence) == ("turn.submitted", "turn_lime_001", 1)
    assert event.trace_id == "trace_lime_001" and event.payload["status"] == "accepted"
    odd = {**doc, "payload": None, "job": {"jobId": "j"}, "custom": [1, 2]}
    kept = RuntimeEvent.from_json(odd)
    assert kept.payload is None and kept.extra == {"payload": None, "job": {"jobId": "j"},
                                                    "custom": [1, 2]}  # fmt: skip
    assert kept.to_json() == odd


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"type": "turn.exploded"}, "type"),
        ({"eventId": ""}, "eventId"),
        ({"eventId": None}, "eventId"),
        ({"timestamp": "yesterday"}, "timestamp"),
        ({"timestamp": "2026-05-11T10:00:00"}, "timestamp"),  # no offset
        ({"sequence": -1}, "sequence"),
        ({"sequence": "1"}, "sequence"),
        ({"sessionId": ""}, "sessionId"),
        ({"turnId": 7}, "turnId"),
    ],
)
def test_a_malformed_event_is_refused_naming_the_property(
    change: dict[str, Any], field: str
) -> None:
    doc = {**_load(VECTORS / "fixtures" / "lime-profile" / "submit-turn-event.json"), **change}
    doc = {k: v for k, v in doc.items() if v is not None}
    with pytest.raises(ValidationError) as caught:
        RuntimeEvent.from_json(doc)
    assert caught.value.details["field"] == field


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("threads", 0, "status"), "busy", "threads[0].status"),
        (("tasks", 0, "status"), "done", "tasks[0].status"),
        (("tasks", 0, "attempts", 1, "status"), "fine", "tasks[0].attempts[1].status"),
        (("threads", 0, "turns"), {}, "threads[0].turns"),
        (("updatedAt",), "now", "updatedAt"),
    ],
)
def test_a_malformed_snapshot_is_refused_naming_the_property(
    path: tuple[Any, ...], value: object, field: str
) -> None:
    doc = _load(VECTORS / "fixtures" / "lime-profile" / "thread-read-snapshot.json")
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(ValidationError) as caught:
        RuntimeSnapshot.from_json(doc)
    assert caught.value.details["field"] == field


def test_a_document_of_no_known_kind_is_refused() -> None:
    with pytest.raises(ValidationError, match="neither"):
        read_runtime_document({"schemaVersion": "x"})
    with pytest.raises(ValidationError):
        read_runtime_document([])


T0 = 1_780_000_000.25


def test_a_logged_runtime_fact_is_a_contract_event_valid_against_the_schema() -> None:
    fact = Fact(
        RuntimeEventType.TURN_COMPLETED, "s-1", "t-1", "u-1", task_id="k-1", run_id="k-1/1",
        status="completed", payload={"result": {"answer": 42}}, agent_id="coder",
    )  # fmt: skip
    logged = Event(
        sequence=17, event_type=log_type(fact.type), actor="runtime", ts=T0,
        correlation_id="s-1", agent_id="coder", details=details(fact, "e-1", "apiary:default"),
    )  # fmt: skip
    doc = runtime_event(logged).to_json()
    check_event(doc)
    assert doc == {
        "type": "turn.completed", "eventId": "e-1", "timestamp": "2026-05-28T20:26:40.250Z",
        "sequence": 17, "schemaVersion": "apiary-runtime-0.1", "runtimeId": "apiary:default",
        "sessionId": "s-1", "threadId": "t-1", "turnId": "u-1", "taskId": "k-1",
        "runId": "k-1/1", "status": "completed", "payload": {"result": {"answer": 42}},
    }  # fmt: skip
    with pytest.raises(ValueError, match="not a runtime event"):
        runtime_event(Event(1, "task.completed", "scheduler", T0))


def _task(state: str, **fields: Any) -> TaskRecord:
    values: dict[str, Any] = {
        "task_id": "k-1", "agent_id": "coder", "priority": 0, "submitted_at": T0, "seq": 0,
        "state": state, "updated_at": T0 + 1, "attempts": 1, "submitter": "ci",
    }  # fmt: skip
    values.update(fields)
    return TaskRecord(**values)


@pytest.mark.parametrize(
    ("state", "code", "status"),
    [
        (TaskState.QUEUED, "", "queued"),
        (TaskState.HELD, "", "waiting_permission"),
        (TaskState.DISPATCHED, "", "preparing"),
        (TaskState.RUNNING, "", "running"),
        (TaskState.COMPLETED, "", "completed"),
        (TaskState.FAILED, "no_answer", "failed"),
        (TaskState.FAILED, "cancelled", "cancelled"),
    ],
)
def test_apiary_tasks_show_as_the_contracts_tasks(state: str, code: str, status: str) -> None:
    view = task_view(_task(state, error_code=code, result='{"a":1}'), result=True)
    assert (view.status, view.native_status) == (status, state)
    doc = view.to_json()
    check_snapshot({"schemaVersion": "v", "sessionId": "s", "threads": [], "tasks": [doc]})
    assert TaskView.from_json(doc).to_json() == doc


def test_a_snapshot_the_runtime_builds_is_valid_and_reads_back() -> None:
    session = SessionRecord("s-1", "application:ci", T0, T0, title="demo")
    thread = ThreadRecord("t-1", "s-1", "coder", "resource:x", "queue", "running", T0, T0,
                          active_turn_id="u-1", turn_count=3)  # fmt: skip
    turns = [
        TurnRecord("u-0", "s-1", "t-1", 0, "failed", "1", "k-0", T0, T0, ended_at=T0 + 1,
                   error_code="no_answer", message="no"),
        TurnRecord("u-1", "s-1", "t-1", 1, "running", '"x"', "k-1", T0, T0, started_at=T0 + 2),
        TurnRecord("u-2", "s-1", "t-1", 2, "queued", "{}", "k-2", T0 + 3, T0 + 3),
    ]  # fmt: skip
    tasks = {"k-1": _task(TaskState.RUNNING, task_id="k-1")}
    built = snapshot(
        session, [ThreadState(thread, turns, tasks)], cursor=40, runtime_id="apiary:default",
        now=T0 + 5, detail=True,
    )  # fmt: skip
    doc = built.to_json()
    check_snapshot(doc)
    assert RuntimeSnapshot.from_json(doc).to_json() == doc
    (view,) = doc["threads"]
    assert view["queuedTurns"] == [{"turnId": "u-2", "position": 1,
                                    "submittedAt": "2026-05-28T20:26:43.250Z"}]  # fmt: skip
    assert [t["status"] for t in view["turns"]] == ["failed", "running", "queued"]
    assert "taskId" not in view["turns"][2]  # a queued turn has no task yet
    assert view["incidents"][0]["error"]["code"] == "no_answer"
    assert view["lastOutcome"]["error"]["code"] == "no_answer"
    assert doc["cursor"] == {"sequence": 40} and doc["taskSummary"]["active"] == 1
