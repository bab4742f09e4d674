"""Work in the event log (core/history.py): which events are a subject's history, which
events finish each kind of work (derived from the machines' tables), what a finished item
says, and what a search finds."""

from __future__ import annotations

import pytest

from apiary.core.events import Event, EventFilter
from apiary.core.history import (
    FINISHING,
    FinishedItem,
    Subject,
    finished_item,
    finishing_filter,
    history_query,
)


def _event(
    event_type: str,
    seq: int = 1,
    *,
    agent_id: str = "",
    correlation_id: str = "",
    details: dict[str, object] | None = None,
) -> Event:
    return Event(seq, event_type, "x", 1.0, correlation_id, agent_id, details or {})


def test_an_agents_history_is_its_events_and_the_others_are_correlated_by_id() -> None:
    assert history_query(Subject.AGENT, "a1").where == EventFilter(agent_id="a1")
    for subject in (Subject.TASK, Subject.WORKFLOW, Subject.ROOM, Subject.NEGOTIATION):
        query = history_query(subject, "x-1")
        assert query.where == EventFilter(correlation_id="x-1")
        assert query.keeps(_event("anything"))


def test_a_hitl_invocations_history_is_the_events_naming_it() -> None:
    correlated = history_query(Subject.HITL, "inv-1", "task-9")
    assert correlated.where == EventFilter(correlation_id="task-9")
    uncorrelated = history_query(Subject.HITL, "inv-1")
    assert uncorrelated.where == EventFilter(event_types=frozenset({"hitl."}))
    mine = _event("hitl.decided", details={"invocation_id": "inv-1"})
    other = _event("hitl.decided", details={"invocation_id": "inv-2"})
    unnamed = _event("task.held", details={})
    for query in (correlated, uncorrelated):
        assert [query.keeps(e) for e in (mine, other, unnamed)] == [True, False, False]


def test_finishing_events_are_the_terminal_rows_of_each_machine() -> None:
    assert FINISHING[Subject.TASK] == {"task.completed", "task.failed"}
    assert FINISHING[Subject.HITL] == {
        "hitl.decided", "hitl.timed_out", "hitl.fallback", "hitl.cancelled",
    }  # fmt: skip
    assert FINISHING[Subject.ROOM] == {"room.decided"}
    assert FINISHING[Subject.NEGOTIATION] == {"negotiation.decided", "negotiation.aborted"}
    assert FINISHING[Subject.WORKFLOW] == {
        "workflow.completed", "workflow.failed", "workflow.cancelled",
    }  # fmt: skip
    every = finishing_filter().event_types
    assert every == frozenset({
        "task.completed", "task.failed",
        "hitl.decided", "hitl.timed_out", "hitl.fallback", "hitl.cancelled",
        "room.decided", "negotiation.decided", "negotiation.aborted",
        "workflow.completed", "workflow.failed", "workflow.cancelled",
    })  # fmt: skip
    # Nothing that leaves the work going is taken for its end.
    assert every is not None and "task.running" not in every and "room.voted" not in every
    assert finishing_filter(Subject.ROOM).event_types == frozenset({"room.decided"})


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        (
            _event("task.failed", 7, agent_id="w", correlation_id="t-1",
                   details={"task_id": "t-1", "state": "FAILED", "error_code": "cancelled"}),
            ("task", "t-1", "FAILED", "w", "", "cancelled"),
        ),
        (
            _event("workflow.completed", 8, details={"workflow_id": "wf", "status": "COMPLETED"}),
            ("workflow", "wf", "COMPLETED", "", "", ""),
        ),
        (
            _event("room.decided", 9, agent_id="p", correlation_id="ops",
                   details={"artifact_id": "art-1", "negotiation_room_id": "ops",
                            "producer_id": "p", "to_state": "APPROVED", "reason": "approved"}),
            ("room", "ops", "APPROVED", "p", "art-1", "approved"),
        ),
        (
            _event("negotiation.aborted", 10, correlation_id="n-1",
                   details={"negotiation_id": "n-1", "to_state": "ABORTED", "reason": "scope"}),
            ("negotiation", "n-1", "ABORTED", "", "", "scope"),
        ),
        (
            _event("hitl.decided", 11, agent_id="merger",
                   details={"invocation_id": "inv-1", "reason_type": "TOOL_PRIVILEGE_ESCALATION",
                            "by": "olivia", "why": "ok", "to_state": "DECIDED"}),
            ("hitl", "inv-1", "DECIDED", "merger", "", "TOOL_PRIVILEGE_ESCALATION · olivia · ok"),
        ),
    ],
)  # fmt: skip
def test_a_finishing_event_says_what_finished(event: Event, expected: tuple[str, ...]) -> None:
    item = finished_item(event)
    assert item is not None
    assert (item.kind.value, item.id, item.state, item.agent_id, item.detail, item.summary) == (
        expected
    )
    assert (item.sequence, item.as_json()["sequence"]) == (event.sequence, event.sequence)


def test_other_events_finish_nothing_and_odd_details_do_not_break_an_item() -> None:
    assert finished_item(_event("task.running", details={"task_id": "t"})) is None
    bare = finished_item(_event("task.completed", correlation_id="t-9"))
    assert bare is not None and (bare.id, bare.state) == ("t-9", "COMPLETED")


def test_a_search_finds_an_ids_start_or_any_text_ignoring_case() -> None:
    item = FinishedItem(Subject.ROOM, "ops-room", "APPROVED", 3, 1.0, "producer", "ART-77",
                        "weighted mean 8.0")  # fmt: skip
    for query in ("", "  ", "ops", "OPS-R", "art-7", "Producer", "approved", "mean 8", "room"):
        assert item.matches(query), query
    for query in ("ops-room-2", "critic", "denied"):
        assert not item.matches(query), query
