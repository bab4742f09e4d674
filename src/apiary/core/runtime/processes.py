"""Runtime processes (spec/runtime-control-plane.txt, "Process and Channel Control"): a tool
call made by a thread's agent while it runs a turn or an agent task's run is a process of
that thread, known by its call id (controlplane/processes.py follows them).

This module holds the rules without I/O: the process record, how a tool call's end is
reported (`ending`), how output is cut into bounded `process.output` events without
splitting a UTF-8 character (`OutputCutter`), and the payloads of the events.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from apiary.core.runtime.events import RuntimeEventType
from apiary.core.tools.calls import ToolCallState

_T = RuntimeEventType


class ProcessState(StrEnum):
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    TERMINATED = "terminated"

    @property
    def ended(self) -> bool:
        return self is not ProcessState.RUNNING


@dataclass(slots=True)
class ProcessRecord:
    """One process: its call, the thread (and turn, or task and run) it belongs to."""

    process_id: str
    """The tool call's id."""
    session_id: str
    thread_id: str
    agent_id: str
    tool_id: str
    """`provider/tool`."""
    interactive: bool
    """Its standard input is open for write_process_stdin (a `stdin = "stream"` command)."""
    started_at: float
    turn_id: str = ""
    task_id: str = ""
    """The turn's Scheduler task, or the runtime task whose run holds it."""
    run_id: str = ""
    state: ProcessState = ProcessState.RUNNING
    output_bytes: int = 0
    """Output bytes reported in process.output events."""
    dropped_bytes: int = 0
    """Output bytes past the per-process bound, counted but not reported."""
    input_bytes: int = 0
    stdin_closed: bool = False
    terminate_reason: str = ""
    terminated_by: str = ""

    def scope(self) -> dict[str, str]:
        ids = {"sessionId": self.session_id, "threadId": self.thread_id,
               "turnId": self.turn_id, "taskId": self.task_id, "runId": self.run_id}  # fmt: skip
        return {k: v for k, v in ids.items() if v}

    def owned_by(self, ids: set[str]) -> bool:
        """Whether the turn, task or run among `ids` is this process's owner."""
        return bool(({self.turn_id, self.task_id, self.run_id} - {""}) & ids)

    def view(self) -> dict[str, Any]:
        """The process as write_process_stdin and terminate_process answer it."""
        return {
            "processId": self.process_id, "status": self.state.value, "toolId": self.tool_id,
            "agentId": self.agent_id, "interactive": self.interactive,
            "stdinOpen": self.interactive and not self.stdin_closed and not self.state.ended,
            "inputBytes": self.input_bytes, "outputBytes": self.output_bytes,
            "droppedBytes": self.dropped_bytes, **self.scope(),
        }  # fmt: skip


STOPPING_FACTS: frozenset[str] = frozenset({
    _T.TASK_CANCEL_REQUESTED, _T.TASK_CANCELLED, _T.TASK_PAUSED, _T.TASK_FAILED,
    _T.TASK_TIMED_OUT, _T.TASK_LOST, _T.TASK_COMPLETED, _T.TURN_COMPLETED, _T.TURN_FAILED,
})  # fmt: skip
"""Facts after which a turn's or task's processes must not run on: cancellation is asked
(the intent), or the owner ended (nothing waits on the process any more)."""


def ending(call_state: ToolCallState) -> tuple[str, ProcessState]:
    """The event and state that report a tool call that ended in `call_state`: completed,
    terminated (cancelled: by terminate_process, its owner's cancellation, or the caller),
    else failed."""
    if call_state is ToolCallState.COMPLETED:
        return _T.PROCESS_COMPLETED, ProcessState.COMPLETED
    if call_state is ToolCallState.CANCELLED:
        return _T.PROCESS_TERMINATED, ProcessState.TERMINATED
    return _T.PROCESS_FAILED, ProcessState.FAILED


def _incomplete_tail(data: bytes) -> int:
    """How many bytes at the end of `data` begin a UTF-8 character not yet complete."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:  # a continuation byte: look further back
            continue
        if byte & 0x80 == 0:
            return 0
        need = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4
        return back if back < need else 0
    return 0


def _cut(data: bytes, size: int) -> list[bytes]:
    """`data` in pieces of at most `size` bytes, cut between UTF-8 characters when it can."""
    pieces = []
    while len(data) > size:
        end = size
        while end > size - 4 and end > 0 and data[end] & 0xC0 == 0x80:
            end -= 1
        end = end if end > 0 else size
        pieces.append(data[:end])
        data = data[end:]
    if data:
        pieces.append(data)
    return pieces


class OutputCutter:
    """A process's output as bounded pieces: at most `chunk_bytes` each, `limit_bytes` in
    all (the rest is counted as dropped), never splitting a UTF-8 character across pieces
    (an incomplete one waits for the next output, or `flush`)."""

    def __init__(self, chunk_bytes: int, limit_bytes: int) -> None:
        self._chunk = chunk_bytes
        self._left = limit_bytes
        self._pending = b""
        self.dropped = 0

    def feed(self, data: bytes) -> list[bytes]:
        data = self._pending + data
        tail = _incomplete_tail(data)
        data, self._pending = (data[:-tail], data[-tail:]) if tail else (data, b"")
        return self._take(data)

    def flush(self) -> list[bytes]:
        data, self._pending = self._pending, b""
        return self._take(data)

    def _take(self, data: bytes) -> list[bytes]:
        kept = data[: self._left]
        self.dropped += len(data) - len(kept)
        self._left -= len(kept)
        return _cut(kept, self._chunk) if kept else []


def output_payload(process: ProcessRecord, piece: bytes, offset: int) -> dict[str, Any]:
    """process.output's payload: the piece as text (invalid UTF-8 replaced), where it lies
    in the output and its size."""
    return {
        "processId": process.process_id, "stream": "stdout",
        "text": piece.decode("utf-8", "replace"), "offset": offset, "bytes": len(piece),
    }  # fmt: skip


def ended_payload(
    process: ProcessRecord, *, error_code: str, attempts: int, duration_ms: int, reason: str
) -> dict[str, Any]:
    """The payload of process.completed, process.failed or process.terminated."""
    payload: dict[str, Any] = {
        "processId": process.process_id, "toolId": process.tool_id,
        "outputBytes": process.output_bytes, "droppedBytes": process.dropped_bytes,
        "inputBytes": process.input_bytes, "attempts": attempts, "durationMs": duration_ms,
    }  # fmt: skip
    if error_code:
        payload["errorCode"] = error_code
    if process.state is ProcessState.TERMINATED:
        payload["reason"] = process.terminate_reason or reason
        if process.terminated_by:
            payload["terminatedBy"] = process.terminated_by
    return payload
