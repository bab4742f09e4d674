"""Tool calls in progress, and the recently finished ones Cancel still answers for (RFC 18.6).

A `PendingCall` holds one call's state (driven by `core.tool_calls.ToolCallMachine`), its
counters and what Cancel needs to reach it: the provider running it, the pending HITL
invocation, and the deadline scope of the running attempt (which Cancel shortens to the
grace period). `CallTable` finds calls by call_id; it remembers the last `keep_finished`
finished calls so that Cancel can tell ALREADY_COMPLETED from NOT_FOUND, and refuses a new
call that reuses the id of a live or remembered one.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass, field

from apiary.core.tools.calls import ToolCallEffect, ToolCallInput, ToolCallMachine, ToolCallState
from apiary.engine.tools.providers import ToolProvider
from apiary.errors import AlreadyExistsError

KEEP_FINISHED = 10_000


@dataclass(eq=False)
class PendingCall:
    call_id: str
    provider_id: str
    tool_name: str
    caller: str
    stream: bool
    correlation_id: str
    started_at: float
    state: ToolCallState = ToolCallState.ACCEPTED
    provider: ToolProvider | None = None
    approval_id: str = ""
    attempts: int = 0
    frames: int = 0
    """Frames sent to the caller."""
    bytes: int = 0
    """Payload bytes received from the provider."""
    data_frames: int = 0
    """Frames from the provider that carried data (a partial result when cancelled)."""
    error_code: str = ""
    cancel_reason: str = ""
    scope: asyncio.Timeout | None = None
    """The running attempt's deadline, which Cancel shortens to the grace period."""
    cancel_deadline: float | None = None
    """When the grace period after Cancel ends (event loop time)."""
    stop_requested: asyncio.Event = field(default_factory=asyncio.Event)

    def apply(self, event: ToolCallInput) -> tuple[ToolCallEffect, ...]:
        """Move to the table's next state; IllegalTransitionError changes nothing."""
        row = ToolCallMachine.step(self.state, event)
        self.state = row.state
        return row.effects

    def allows(self, event: ToolCallInput) -> bool:
        return ToolCallMachine.allows(self.state, event)

    # Properties rather than comparisons at the call sites: the state changes behind awaits,
    # where a type checker's narrowing of `self.state` would be wrong.
    @property
    def cancelling(self) -> bool:
        return self.state is ToolCallState.CANCELLING

    @property
    def cancelled(self) -> bool:
        return self.state is ToolCallState.CANCELLED


class CallTable:
    def __init__(self, keep_finished: int = KEEP_FINISHED) -> None:
        self._live: dict[str, PendingCall] = {}
        self._finished: OrderedDict[str, ToolCallState] = OrderedDict()
        self._keep = keep_finished

    def open(self, call: PendingCall) -> PendingCall:
        if call.call_id in self._live or call.call_id in self._finished:
            raise AlreadyExistsError(
                f"tool call {call.call_id!r} exists already; leave call_id empty to get a "
                "fresh one",
                {"call_id": call.call_id},
            )
        self._live[call.call_id] = call
        return call

    def get(self, call_id: str) -> PendingCall | None:
        return self._live.get(call_id)

    def state_of(self, call_id: str) -> ToolCallState | None:
        """The call's state, live or remembered; None for a call never seen (or forgotten)."""
        live = self._live.get(call_id)
        return live.state if live is not None else self._finished.get(call_id)

    def close(self, call: PendingCall) -> None:
        """The call has ended: remember only its final state."""
        self._live.pop(call.call_id, None)
        self._finished[call.call_id] = call.state
        self._finished.move_to_end(call.call_id)
        while len(self._finished) > self._keep:
            self._finished.popitem(last=False)

    def live(self) -> list[PendingCall]:
        return list(self._live.values())
