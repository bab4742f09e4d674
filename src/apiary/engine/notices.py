"""Envelopes the coordinator itself produces: NACKs, forwarded ACKs, duplicate notices,
join/leave notifications and heartbeats."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from apiary.core.clock import Clock
from apiary.core.dedup import iso_utc
from apiary.core.envelope import Ack, Envelope, MessageType
from apiary.core.hlc import HybridLogicalClock, format_hlc, physical_us
from apiary.core.ids import IdGenerator
from apiary.core.rooms.machine import ROOM_SERVICE

COORDINATOR = "coordinator"
"""producer_id of every envelope the coordinator produces."""
SCHEDULER = "scheduler"
"""producer_id of the Scheduler's task and control envelopes (RFC Appendix C.3 names it so);
unlike the coordinator's notices they are tracked messages that agents acknowledge."""
WORKTREES = "worktrees"
"""The coordinator endpoint agents send WORKTREE_CONTROL requests to
(engine/worktrees/control.py)."""
TOOLS = "tools"
"""The tool service's endpoint: producer of TOOL_CALL envelopes to agent providers, recipient
of their TOOL_RESULT and TOOL_ERROR envelopes (docs/tools.md)."""
SWARM_BRIDGE = "swarm"
"""producer_id of the envelopes the Agent Swarm Protocol bridge delivers, and the endpoint its
replies are sent to (apiary/swarm/bridge.py)."""
SELF_KEPT_TOKENS = frozenset({SCHEDULER})
"""Producers whose idempotency tokens records of their own keep unique: the Scheduler's
`task:<id>:<attempt>` names one dispatch attempt, counted in the task record that commits
with the envelope's admission. The router starts no token record for them at admission and
keeps none while the producer's own writes record the message's fate
(engine/router/dedup_gate.py `kept_by_producer`)."""
RESERVED_IDS = frozenset({COORDINATOR, SCHEDULER, WORKTREES, ROOM_SERVICE, TOOLS, SWARM_BRIDGE})
"""Participant ids no agent may register under (ROOM_SERVICE: the negotiation-room service,
producer of the rooms' notifications)."""


class NoticeFactory:
    def __init__(self, clock: Clock, ids: IdGenerator, producer: str = COORDINATOR) -> None:
        self._clock = clock
        self._ids = ids
        self._producer = producer
        self._sequence = 0
        # Every notice carries an HLC timestamp, so that it passes admission when the router
        # requires one (RFC 11: with HLC enabled, messages MUST include hlc_timestamp).
        self._hlc = HybridLogicalClock(producer)

    async def resume(self, last_sequence: Callable[[str], Awaitable[int]]) -> None:
        """Number on after `last_sequence(producer)`, the highest sequence number the
        producer's stored messages carry (`Router.last_sequence`), at start-up: the router
        deduplicates by (producer_id, sequence_number) (RFC 11.2), so a restarted coordinator
        that numbered from 1 again would have its new messages refused as ones it sent
        before the restart (sequence numbers are monotonic per producer, RFC 11.3)."""
        self._sequence = max(self._sequence, await last_sequence(self._producer))

    def _envelope(
        self, message_type: MessageType, body: dict[str, Any], correlation_id: str
    ) -> Envelope:
        payload = json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
        return self.envelope(message_type, payload, "application/json", correlation_id)

    def envelope(
        self, message_type: MessageType, payload: bytes, content_type: str,
        correlation_id: str = "", idempotency_token: str = "",
    ) -> Envelope:  # fmt: skip
        """An envelope from this factory's producer with the next sequence number."""
        self._sequence += 1
        message_id = self._ids.new_id()
        now = self._clock.now()
        return Envelope(
            message_id=message_id,
            producer_id=self._producer,
            message_type=message_type,
            payload=payload,
            content_type=content_type,
            content_length=len(payload),
            correlation_id=correlation_id or message_id,
            sequence_number=self._sequence,
            timestamp=now,
            hlc_timestamp=format_hlc(self._hlc.send(physical_us(now))),
            idempotency_token=idempotency_token,
        )

    def control(self, body: dict[str, Any], correlation_id: str = "") -> Envelope:
        """A CONTROL command (message-types: {"command": ..., ...})."""
        return self._envelope(MessageType.CONTROL, body, correlation_id)

    def ack(self, ack: Ack, correlation_id: str, extra: dict[str, Any] | None = None) -> Envelope:
        """An ACKNOWLEDGEMENT (a NACK when the stage is REJECTED/FAILED/TIMED_OUT).

        The error code is written in upper case, as the RFC's examples do. `extra` adds
        fields; it cannot replace the acknowledgement's own four.
        """
        body: dict[str, Any] = {
            **(extra or {}),
            "ack_for_message_id": ack.ack_for_message_id,
            "ack_stage": ack.ack_stage.name,
            "error_code": ack.error_code.upper(),
            "note": ack.note,
        }
        return self._envelope(MessageType.ACKNOWLEDGEMENT, body, correlation_id)

    def notification(self, body: dict[str, Any], correlation_id: str = "") -> Envelope:
        return self._envelope(MessageType.NOTIFICATION, body, correlation_id)

    def worktree_control(self, body: dict[str, Any], correlation_id: str = "") -> Envelope:
        """A WORKTREE_CONTROL status for an agent (RFC 16; engine/worktrees/control.py)."""
        return self._envelope(MessageType.WORKTREE_CONTROL, body, correlation_id)

    def hitl_invocation(self, body: dict[str, Any], correlation_id: str = "") -> Envelope:
        """A HITL_INVOCATION (RFC 15.2 payload) for a HITL component."""
        return self._envelope(MessageType.HITL_INVOCATION, body, correlation_id)

    def heartbeat(self, agent_id: str) -> Envelope:
        # Timestamps in payloads are ISO 8601 with a timezone (message-types rule 7).
        body = {"command": "heartbeat", "agent_id": agent_id, "at": iso_utc(self._clock.now())}
        return self._envelope(MessageType.HEARTBEAT, body, "")
