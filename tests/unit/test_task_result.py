"""A task's result as JSON text (core/tasks/result.py): what an ACK's note means, the note
that carries a value (read back as that value, whatever it is), and the rule of a task_id
given twice."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apiary.core.json_reader import JsonError, parse_json
from apiary.core.records import TaskRecord, TaskState
from apiary.core.tasks.result import (
    SUBMISSION_FIELDS,
    decode_result,
    note_for,
    result_from_note,
    result_text,
    same_submission,
)
from apiary.core.workflow.data import parse_output

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**30), 10**30)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)  # fmt: skip


@pytest.mark.parametrize(
    ("note", "result"),
    [
        ("", ""),
        ("   ", ""),
        ('{"a": 1}', '{"a": 1}'),
        (" [1, 2] ", "[1, 2]"),
        ("42", "42"),
        ('"quoted"', '"quoted"'),
        ("done", '"done"'),
        ("NaN", '"NaN"'),  # not JSON: the text itself
        ("{broken", '"{broken"'),
        ("héllo 🐝", '"héllo 🐝"'),
    ],
)
def test_a_note_is_json_when_it_reads_as_json_else_the_text_itself(note: str, result: str) -> None:
    assert result_from_note(note) == result


@given(JSON_VALUES)
def test_the_note_for_a_value_reads_back_as_that_value(value: Any) -> None:
    try:
        note = note_for(value)
    except ValueError:  # only what the coordinator would not keep (a NUL in a string)
        with pytest.raises(JsonError):
            parse_json(json.dumps(value), kept=True)
        return
    assert decode_result(result_from_note(note)) == value


@given(st.text())
def test_a_result_means_what_a_workflow_reads_from_the_same_note(note: str) -> None:
    """The result of a note is the workflow engine's node output of that note."""
    text = result_from_note(note)
    assert decode_result(text) == parse_output(note)


def test_text_results_stay_readable_in_notes_and_json_looking_text_is_quoted() -> None:
    assert note_for("all done") == "all done"
    assert note_for("42") == '"42"'
    assert note_for("  ") == '"  "'
    assert note_for({"a": [1, "é"]}) == '{"a":[1,"é"]}'
    assert note_for(None) == result_text(None) == ""
    for bad in ({1, 2}, float("nan"), object(), {"k": ["\x00"]}):
        with pytest.raises((TypeError, ValueError)):
            note_for(bad)


def test_the_same_submission_is_every_field_a_submitter_gives() -> None:
    task = TaskRecord(
        task_id="t1", agent_id="a", priority=0, submitted_at=1.0, seq=0,
        state=TaskState.QUEUED, updated_at=1.0, scope="repo:x", params=b"{}",
        content_type="application/json", submitter="app",
    )  # fmt: skip
    later = replace(task, state=TaskState.COMPLETED, seq=9, updated_at=5.0, result="1", note="x")
    assert same_submission(task, later) == ()
    changes: dict[str, Any] = {
        "agent_id": "b", "priority": 3, "params": b"[]", "content_type": "text/plain",
        "scope": "repo:y", "correlation_id": "wf", "submitter": "other",
        "queue": "capability:review",
    }  # fmt: skip
    assert set(changes) == set(SUBMISSION_FIELDS)
    for name, value in changes.items():
        assert same_submission(task, replace(task, **{name: value})) == (name,)
    assert json.loads(result_text({"k": "v"})) == {"k": "v"}
