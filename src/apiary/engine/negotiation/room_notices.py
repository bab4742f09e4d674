"""What the room service tells agents (RFC 17.5, Appendix C.10): critics learn of a proposal
to review, the producer of its decision.

Each is a NOTIFICATION envelope from the participant `negotiation_room` with a JSON payload
`{"event": "room.<kind>", ...}` and the room id as correlation id (RFC 17: room semantics).
Unlike the coordinator's own notices these are tracked messages: acknowledged by the agent,
retried after the ack timeout, dead-lettered if never taken, so a critic that is offline for
a while still gets its review request. Each carries an idempotency token naming what it
announces, so announcing it again (after a restart) never reaches an agent twice while the
first one is remembered (RFC 11.2 window).

Payloads (`event`):
- room.proposal: artifact_id, negotiation_room_id, producer_id, artifact_type,
  artifact_content_type, artifact_size, artifact_sha256, policy_version, vote_deadline
  (ISO-8601), requested_critics; artifact_b64 when the artifact is small enough to travel
  inline (`inline_artifact_bytes`), else the critic reads it with
  apiary.v1.NegotiationRoomQueryService.GetProposal.
- room.escalated: artifact_id, negotiation_room_id, outcome ESCALATED_TO_HITL, reason,
  triggers, invocation_id, policy_version, aggregated_score, vote_count.
- room.decided: artifact_id, negotiation_room_id, outcome, reason, policy_version,
  aggregated_score, vote_count, decided_by, via, and the operator's patch when there is one.
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

from apiary.core.dedup import iso_utc
from apiary.core.envelope import MessageType
from apiary.core.rooms.machine import ROOM_SERVICE
from apiary.core.rooms.records import DecisionOutcome, DecisionRecord, ProposalRecord
from apiary.engine.eventlog import EventRecorder
from apiary.engine.notices import NoticeFactory
from apiary.engine.router.admission import Outbound
from apiary.engine.router.router import Router

JSON = "application/json"
ANNOUNCED = frozenset({"duplicate_detected", "already_in_progress"})
"""Refusals that mean the same notification was sent before: nothing to report."""


def proposal_notice(proposal: ProposalRecord, inline_limit: int) -> dict[str, Any]:
    """The review request a requested critic receives."""
    body: dict[str, Any] = {
        "event": "room.proposal",
        "artifact_id": proposal.artifact_id,
        "negotiation_room_id": proposal.negotiation_room_id,
        "producer_id": proposal.producer_id,
        "artifact_type": proposal.artifact_type,
        "artifact_content_type": proposal.artifact_content_type,
        "artifact_size": len(proposal.artifact),
        "artifact_sha256": hashlib.sha256(proposal.artifact).hexdigest(),
        "policy_version": proposal.policy_version,
        "vote_deadline": iso_utc(proposal.vote_deadline),
        "requested_critics": list(proposal.requested_critics),
    }
    if len(proposal.artifact) <= inline_limit:
        body["artifact_b64"] = base64.b64encode(proposal.artifact).decode("ascii")
    return body


def decision_notice(proposal: ProposalRecord, decision: DecisionRecord) -> dict[str, Any]:
    """What the producer learns of a decision (an escalation, or the final one)."""
    escalated = decision.outcome == DecisionOutcome.ESCALATED_TO_HITL
    scores = decision.aggregated_score
    body: dict[str, Any] = {
        "event": "room.escalated" if escalated else "room.decided",
        "artifact_id": proposal.artifact_id,
        "negotiation_room_id": proposal.negotiation_room_id,
        "outcome": decision.outcome,
        "reason": decision.reason,
        "triggers": list(decision.triggers),
        "policy_version": decision.policy_version,
        "aggregated_score": scores.as_dict() if scores else None,
        "vote_count": len(decision.votes),
        "decided_by": decision.decided_by,
        "via": decision.via,
    }
    if decision.invocation_id:
        body["invocation_id"] = decision.invocation_id
    patch = decision.details.get("patch")
    if patch:
        body["patch"] = patch
    return body


class RoomNotifier:
    """Sends the room service's notifications through the router and logs refusals."""

    def __init__(self, router: Router, notices: NoticeFactory, events: EventRecorder) -> None:
        self._router = router
        self._notices = notices
        self._events = events

    async def load(self) -> None:
        """Number notifications on from those sent before a restart (at start-up)."""
        await self._notices.resume(self._router.last_sequence)

    async def send(self, recipient: str, body: dict[str, Any], token: str, room_id: str) -> bool:
        """Deliver one notification; False (and a room.notice_refused event) when the router
        refused it, e.g. an unregistered agent (no_route) or a full buffer. The same token
        sent before counts as delivered."""
        payload = json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
        env = self._notices.envelope(
            MessageType.NOTIFICATION, payload, JSON, room_id, idempotency_token=token
        )
        (outcome,) = await self._router.send_many([Outbound(env, recipient)])
        if outcome.error_code in ANNOUNCED:
            return True
        if not outcome.accepted:
            await self._events.record(
                "room.notice_refused", ROOM_SERVICE, correlation_id=room_id, agent_id=recipient,
                notice=body["event"], artifact_id=body["artifact_id"],
                error_code=outcome.error_code, reason=outcome.reason,
            )  # fmt: skip
        return outcome.accepted
