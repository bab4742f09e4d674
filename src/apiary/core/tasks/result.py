"""A task's result: the JSON value its agent returned, kept with the task as JSON text.

An agent gives it in one of two ways (docs/scheduler.md, "Results"): as the note of its
FULFILLED ACK when it fits in an ACK (at most 4 KB), or through
TaskQueryService.CompleteTask (JSON text up to `[limits] task_result_bytes`). A note is read
as the workflow engine reads a node's output: JSON text is that value, any other text the
string itself, an empty note no result. So that a string result is never taken for JSON, an
agent writes a string that reads as JSON (or is blank) as a JSON string: `note_for`.

`same_submission` is the rule of a task_id given twice: the same submission is the existing
task (an idempotent retry), any other is a conflict naming the fields that differ.
"""

from __future__ import annotations

import json
from typing import Any, Final

from apiary.core.json_reader import JsonError, parse_json
from apiary.core.records import TaskRecord

SUBMISSION_FIELDS: Final = (
    "agent_id", "queue", "priority", "params", "content_type", "scope", "correlation_id",
    "submitter",
)  # fmt: skip
"""What makes two submissions of one task_id the same submission (the job identity follows
from them)."""


def _reads_as_json(text: str) -> bool:
    """Whether the coordinator reads `text` as a JSON value it keeps (json_reader)."""
    try:
        parse_json(text, kept=True)
    except JsonError:
        return False
    return True


def result_from_note(note: str) -> str:
    """The result (JSON text, '' for none) of a FULFILLED ACK's note."""
    text = note.strip()
    if not text:
        return ""
    return text if _reads_as_json(text) else json.dumps(note, ensure_ascii=False)


def result_text(value: object) -> str:
    """`value` as compact JSON text ('' for None); TypeError or ValueError when it has no
    JSON form (a set, NaN, an object) or one the coordinator does not keep (a NUL in a
    string, a number that overflows: core/json_reader.py)."""
    if value is None:
        return ""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    try:
        parse_json(text, kept=True)
    except JsonError as exc:
        raise ValueError(f"the coordinator keeps no such value: {exc}") from None
    return text


def note_for(value: object) -> str:
    """The FULFILLED note that `result_from_note` reads back as `value` (None: no note): a
    string as it is unless it reads as JSON or is blank, anything else as JSON text
    (TypeError or ValueError when it has no JSON form)."""
    if isinstance(value, str) and value.strip() and not _reads_as_json(value.strip()):
        return value
    return result_text(value)


def decode_result(text: str) -> Any:
    """The value of a stored result (None for none)."""
    return json.loads(text) if text else None


def same_submission(existing: TaskRecord, again: TaskRecord) -> tuple[str, ...]:
    """The fields in which `again` differs from the task submitted under its task_id
    (`SUBMISSION_FIELDS`); empty: the same submission."""
    return tuple(f for f in SUBMISSION_FIELDS if getattr(existing, f) != getattr(again, f))
