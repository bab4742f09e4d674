"""The agents of test_room_processes.py (Appendix C.10), written with the SDK only and run as
`apiary agent run tests.e2e.room_agents:CLASS --id AGENT_ID --coordinator HOST:PORT`.

Critics review what the room service announces (a `room.proposal` NOTIFICATION), check the
artifact they were sent against its digest, and vote with their class's judgement. The
producer proposes a plan to the critics named in $ROOM_CRITICS once registered, blocks on
WaitForDecision, and reports the decision; it also reports the room's notifications to it.

Every step of interest is one JSON line on stdout: {"event": "ready"} once registered, then
"voted" (critics), "proposed", "notice" and "decision" (producer).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
from typing import Any, ClassVar

from google.protobuf import json_format

from apiary.sdk.agent import Agent, Message
from apiary.wire import pb

nr = pb.negotiation_room_pb2
PLAN = b'{"plan": ["add column nullable", "backfill", "make column required"]}'


def say(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


class Critic(Agent):
    """Votes `score`/`confidence` on every artifact it is asked to review."""

    capabilities = ("review",)
    score: ClassVar[float] = 8.0
    confidence: ClassVar[float] = 0.9
    recommendations: ClassVar[tuple[str, ...]] = ()

    async def setup(self) -> None:
        say("ready", agent=self.agent_id)

    async def on_notification(self, msg: Message) -> str:
        body = msg.json()
        if body.get("event") != "room.proposal":
            return "ignored"
        artifact = base64.b64decode(body["artifact_b64"])
        if hashlib.sha256(artifact).hexdigest() != body["artifact_sha256"]:
            raise ValueError("the artifact does not match its digest")
        vote = nr.NegotiationVote(
            artifact_id=body["artifact_id"], negotiation_room_id=body["negotiation_room_id"],
            score=self.score, confidence=self.confidence, passed=self.score >= 5,
            strengths=[f"{len(json.loads(artifact)['plan'])} reversible steps"],
            recommendations=list(self.recommendations),
        )  # fmt: skip
        await self.client.negotiation_room.SubmitVote(nr.SubmitVoteRequest(vote=vote))
        say("voted", agent=self.agent_id, artifact_id=body["artifact_id"], score=self.score)
        return "voted"


class GenerousCritic(Critic):
    score = 8.0
    confidence = 0.9


class CautiousCritic(Critic):
    score = 6.0
    confidence = 0.7


class WaryCritic(Critic):
    """Likes the plan but wants a human to look at the data migration."""

    score = 7.5
    confidence = 0.8
    recommendations = ("ESCALATE_TO_HITL: the backfill touches billing data",)


class Producer(Agent):
    """Proposes one plan to $ROOM_CRITICS and waits for the decision."""

    capabilities = ("planning",)

    async def setup(self) -> None:
        say("ready", agent=self.agent_id)
        self._proposing = asyncio.ensure_future(self._propose_and_wait())

    async def _propose_and_wait(self) -> None:
        try:
            proposal = nr.NegotiationProposal(
                artifact_type=nr.PLAN, artifact_id=os.environ["ROOM_ARTIFACT_ID"],
                artifact=PLAN, artifact_content_type="application/json",
                requested_critics=os.environ["ROOM_CRITICS"].split(","),
                negotiation_room_id=os.environ["ROOM_ID"],
            )  # fmt: skip
            room = self.client.negotiation_room
            reply = await room.SubmitProposal(nr.SubmitProposalRequest(proposal=proposal))
            say("proposed", artifact_id=reply.artifact_id, room=reply.negotiation_room_id)
            waited = await room.WaitForDecision(
                nr.WaitForDecisionRequest(artifact_id=reply.artifact_id, timeout_seconds=60)
            )
            say("decision", decision=json_format.MessageToDict(
                waited.decision, preserving_proto_field_name=True
            ))  # fmt: skip
        except Exception as exc:  # reported, so that the test fails with the reason
            say("failed", error=f"{type(exc).__name__}: {exc}")

    async def on_notification(self, msg: Message) -> str:
        say("notice", body=msg.json())
        return "noted"
