"""The lifecycle of one tool call (RFC 18.2, 18.6) as a pure, table-driven machine.

A call is ACCEPTED once its request is valid, may wait AWAITING_APPROVAL for a HITL decision
(TOOL_PRIVILEGE_ESCALATION), then RUNNING, and ends COMPLETED, FAILED or CANCELLED.

Cancellation is best effort (18.6): Cancel moves a running call to CANCELLING and asks the
provider to stop; frames already in flight still arrive there (FRAME keeps the state). The
provider's answer decides the end: its normal final frame (it finished before it could stop)
ends COMPLETED, and the normal terminal frame is what the caller gets; anything else
(stopped, or failed because it was stopped, or the grace period passed) ends CANCELLED.

`cancel_answer` is what the Cancel RPC says: CANCELLED when cancellation was initiated (or
already under way), ALREADY_COMPLETED for a call that has ended, NOT_FOUND for a call the
coordinator does not know.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

from apiary.core.machine import TransitionTable


class ToolCallState(StrEnum):
    ACCEPTED = "ACCEPTED"
    AWAITING_APPROVAL = "AWAITING_APPROVAL"
    RUNNING = "RUNNING"
    CANCELLING = "CANCELLING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        return self in (ToolCallState.COMPLETED, ToolCallState.FAILED, ToolCallState.CANCELLED)


class ToolCallInput(StrEnum):
    ESCALATE = "ESCALATE"
    """The policy needs a human's approval first."""
    START = "START"
    """Run it (no approval needed, or approved)."""
    DENY = "DENY"
    """Approval refused (or the HITL fallback denied it)."""
    FRAME = "FRAME"
    """The provider produced a non-final frame."""
    RETRY = "RETRY"
    """A transient failure of an idempotent tool: run it again."""
    FINISH = "FINISH"
    """The provider's normal final frame."""
    FAIL = "FAIL"
    """The provider (or the coordinator's wall clock) failed the call."""
    CANCEL = "CANCEL"
    """Cancel was called (or the caller went away)."""
    STOPPED = "STOPPED"
    """The provider stopped on request, or the cancel grace period passed."""


class ToolCallEffect(StrEnum):
    """What the engine does beside the state change. Reaching a terminal state always means
    the same thing (record the call's end with its counts, release what it holds), so the
    engine does that wherever a call ends rather than per row."""

    SIGNAL_PROVIDER = "SIGNAL_PROVIDER"
    """Ask the provider to stop the call (best effort), and start the grace period."""
    WITHDRAW_APPROVAL = "WITHDRAW_APPROVAL"
    """Cancel the pending HITL invocation."""


@dataclass(frozen=True, slots=True)
class ToolCallRow:
    state: ToolCallState
    effects: tuple[ToolCallEffect, ...] = ()


_S = ToolCallState
_I = ToolCallInput
_F = ToolCallEffect


def _table() -> dict[ToolCallState, dict[ToolCallInput, ToolCallRow]]:
    failed = ToolCallRow(_S.FAILED)
    cancelled = ToolCallRow(_S.CANCELLED)
    return {
        _S.ACCEPTED: {
            _I.ESCALATE: ToolCallRow(_S.AWAITING_APPROVAL),
            _I.START: ToolCallRow(_S.RUNNING),
            _I.FAIL: failed,
            _I.CANCEL: cancelled,
        },
        _S.AWAITING_APPROVAL: {
            _I.START: ToolCallRow(_S.RUNNING),
            _I.DENY: failed,
            _I.FAIL: failed,
            _I.CANCEL: ToolCallRow(_S.CANCELLED, (_F.WITHDRAW_APPROVAL,)),
        },
        _S.RUNNING: {
            _I.FRAME: ToolCallRow(_S.RUNNING),
            _I.RETRY: ToolCallRow(_S.RUNNING),
            _I.FINISH: ToolCallRow(_S.COMPLETED),
            _I.FAIL: failed,
            _I.CANCEL: ToolCallRow(_S.CANCELLING, (_F.SIGNAL_PROVIDER,)),
        },
        _S.CANCELLING: {
            # 18.6: frames already buffered may still be delivered after Cancel.
            _I.FRAME: ToolCallRow(_S.CANCELLING),
            # Too late to stop it: the normal terminal frame is sent.
            _I.FINISH: ToolCallRow(_S.COMPLETED),
            # A failure after the request is the stop taking effect (a killed process).
            _I.FAIL: cancelled,
            _I.STOPPED: cancelled,
            _I.CANCEL: ToolCallRow(_S.CANCELLING),
        },
        _S.COMPLETED: {},
        _S.FAILED: {},
        _S.CANCELLED: {},
    }


class ToolCallMachine:
    """The transition table of a tool call."""

    TABLE: dict[ToolCallState, dict[ToolCallInput, ToolCallRow]] = _table()
    TRANSITIONS: TransitionTable[ToolCallState, ToolCallInput, ToolCallRow] = TransitionTable(
        TABLE, "tool call"
    )

    @classmethod
    def step(cls, state: ToolCallState, event: ToolCallInput) -> ToolCallRow:
        """The row for (state, event); IllegalTransitionError when there is none."""
        return cls.TRANSITIONS.step(state, event)

    @classmethod
    def allows(cls, state: ToolCallState, event: ToolCallInput) -> bool:
        return cls.TRANSITIONS.allows(state, event)


CANCELLED_CODE: Final = "CANCELLED"
NOT_FOUND_CODE: Final = "NOT_FOUND"
ALREADY_COMPLETED_CODE: Final = "ALREADY_COMPLETED"


def cancel_answer(state: ToolCallState | None) -> str:
    """The Cancel RPC's error_code for a call in `state` (None: unknown call), RFC 18.6."""
    if state is None:
        return NOT_FOUND_CODE
    if state.terminal:
        return ALREADY_COMPLETED_CODE
    return CANCELLED_CODE


def mermaid() -> str:
    """The state diagram of the table (docs/tool-call-lifecycle.md is generated from it)."""
    terminal = (s for s in ToolCallState if s.terminal)
    return ToolCallMachine.TRANSITIONS.mermaid((_S.ACCEPTED,), terminal, lambda row: row.state)


@dataclass(frozen=True, slots=True)
class ToolFrame:
    """One frame of a call's results (`sw4rm.tool.ToolFrame` as a domain value): a streamed
    frame, or the final one with its summary. The engine yields them; the SDK hands them to
    callers (as `apiary.sdk.tools.ToolResult`)."""

    call_id: str
    frame_no: int
    final: bool
    content_type: str
    data: bytes
    summary: Mapping[str, Any] = field(default_factory=dict)

    @property
    def cancelled(self) -> bool:
        return bool(self.summary.get("cancelled"))

    def json(self) -> Any:
        """The data as JSON."""
        return json.loads(self.data or b"null")

    def text(self) -> str:
        return self.data.decode("utf-8", "replace")
