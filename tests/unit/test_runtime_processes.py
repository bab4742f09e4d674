"""The pure rules of runtime processes (core/runtime/processes.py): how output is cut into
bounded events without splitting a UTF-8 character, how a call's end is reported, and which
owners a process has."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from apiary.core.runtime.processes import (
    OutputCutter,
    ProcessRecord,
    ProcessState,
    ended_payload,
    ending,
)
from apiary.core.tools.calls import ToolCallState


def _record(**fields: object) -> ProcessRecord:
    return ProcessRecord("call-1", "s", "t", "agent", "sh/chat", True, 0.0, **fields)  # type: ignore[arg-type]


def test_output_is_cut_into_chunks_between_characters() -> None:
    cutter = OutputCutter(chunk_bytes=4, limit_bytes=1000)
    pieces = cutter.feed("aéé€b".encode())  # 1 + 2 + 2 + 3 + 1 bytes
    assert all(len(p) <= 4 for p in pieces)
    assert [p.decode() for p in pieces] == ["aé", "é", "€b"]


def test_a_character_split_across_outputs_waits_for_its_end() -> None:
    cutter = OutputCutter(chunk_bytes=64, limit_bytes=1000)
    euro = "€".encode()
    assert cutter.feed(b"x" + euro[:2]) == [b"x"]
    assert cutter.feed(euro[2:] + b"y") == ["€y".encode()]
    assert cutter.feed(euro[:1]) == []
    assert cutter.flush() == [euro[:1]]  # the end: what is left goes out as it is


def test_output_past_the_limit_is_counted_not_reported() -> None:
    cutter = OutputCutter(chunk_bytes=4, limit_bytes=6)
    assert cutter.feed(b"abcdefgh") == [b"abcd", b"ef"]
    assert cutter.feed(b"ij") == [] and cutter.dropped == 4
    nothing = OutputCutter(chunk_bytes=4, limit_bytes=0)
    assert nothing.feed(b"abc") == [] and nothing.dropped == 3


@given(st.lists(st.text(max_size=20), max_size=10), st.integers(4, 16))
def test_cutting_keeps_the_text_whole_and_every_piece_bounded(parts: list[str], size: int) -> None:
    cutter = OutputCutter(chunk_bytes=size, limit_bytes=1 << 20)
    pieces = [p for part in parts for p in cutter.feed(part.encode())] + cutter.flush()
    assert b"".join(pieces) == "".join(parts).encode()
    assert all(0 < len(p) <= size for p in pieces)
    assert all(p.decode() for p in pieces)  # each piece whole characters


def test_a_calls_end_is_completed_terminated_or_failed() -> None:
    assert ending(ToolCallState.COMPLETED) == ("process.completed", ProcessState.COMPLETED)
    assert ending(ToolCallState.CANCELLED) == ("process.terminated", ProcessState.TERMINATED)
    assert ending(ToolCallState.FAILED) == ("process.failed", ProcessState.FAILED)
    assert not ProcessState.RUNNING.ended and ProcessState.FAILED.ended


def test_owners_and_the_end_payload() -> None:
    turn = _record(turn_id="u", task_id="task-1")
    assert turn.owned_by({"u"}) and turn.owned_by({"task-1"}) and not turn.owned_by({"x", ""})
    run = _record(task_id="rt", run_id="run-1")
    assert run.owned_by({"run-1"}) and run.scope() == {
        "sessionId": "s", "threadId": "t", "taskId": "rt", "runId": "run-1",
    }  # fmt: skip
    turn.state = ProcessState.TERMINATED
    payload = ended_payload(turn, error_code="", attempts=1, duration_ms=5, reason="by x")
    assert payload["reason"] == "by x" and "errorCode" not in payload
    failed = _record(state=ProcessState.FAILED)
    payload = ended_payload(failed, error_code="TOOL_FAILED", attempts=2, duration_ms=5,
                            reason="")  # fmt: skip
    assert payload["errorCode"] == "TOOL_FAILED" and "reason" not in payload
