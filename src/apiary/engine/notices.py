"""Envelopes the coordinator itself produces: NACKs, forwarded ACKs, duplicate notices,
join/leave notifications and heartbeats."""

from __future__ import annotations

import json
from typing import Any

from apiary.core.clock import Clock
from apiary.core.dedup import iso_utc
from apiary.core.envelope import Ack, Envelope, MessageType
from apiary.core.hlc import HybridLogicalClock, format_hlc, physical_us
from apiary.core.ids import IdGenerator

COORDINATOR = "coordinator"
"""producer_id of every envelope the coordinator produces."""


class NoticeFactory:
    def __init__(self, clock: Clock, ids: IdGenerator) -> None:
        self._clock = clock
        self._ids = ids
        self._sequence = 0
        # Every notice carries an HLC timestamp, so that it passes admission when the router
        # requires one (RFC 11: with HLC enabled, messages MUST include hlc_timestamp).
        self._hlc = HybridLogicalClock(COORDINATOR)

    def _envelope(
        self, message_type: MessageType, body: dict[str, Any], correlation_id: str
    ) -> Envelope:
        self._sequence += 1
        payload = json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
        message_id = self._ids.new_id()
        return Envelope(
            message_id=message_id,
            producer_id=COORDINATOR,
            message_type=message_type,
            payload=payload,
            content_type="application/json",
            content_length=len(payload),
            correlation_id=correlation_id or message_id,
            sequence_number=self._sequence,
            timestamp=self._clock.now(),
            hlc_timestamp=format_hlc(self._hlc.send(physical_us(self._clock.now()))),
        )

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

    def hitl_invocation(self, body: dict[str, Any], correlation_id: str = "") -> Envelope:
        """A HITL_INVOCATION (RFC 15.2 payload) for a HITL component."""
        return self._envelope(MessageType.HITL_INVOCATION, body, correlation_id)

    def heartbeat(self, agent_id: str) -> Envelope:
        # Timestamps in payloads are ISO 8601 with a timezone (message-types rule 7).
        body = {"command": "heartbeat", "agent_id": agent_id, "at": iso_utc(self._clock.now())}
        return self._envelope(MessageType.HEARTBEAT, body, "")
