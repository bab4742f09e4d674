"""The agent processes of test_negotiation_processes.py (Appendix D C.9), built on the SDK
only: `python -m tests.e2e.negotiation_agents ROLE COORDINATOR`.

frontend
    On `open`, proposes draft A through NegotiationService.Propose; on graphql's `counter`,
    evaluates it below the threshold with a NEGOTIATION envelope to the Scheduler.
graphql
    On frontend's `propose`, counters with draft B as a NEGOTIATION envelope.
hitl
    A HITL component (capability "hitl"): on a DEBATE_DEADLOCK invocation it decides for
    graphql's draft through SchedulerPolicyService.HitlAction with its operator token
    (APIARY_TOKEN).

Every NEGOTIATION event received is one JSON line on stdout ({"event": "negotiation",
"kind": ...}), after {"event": "ready"}; a decision adds {"event": "decided", ...}.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import apiary
from apiary.sdk import negotiation
from apiary.wire import pb

DRAFT_A = json.dumps({
    "path": "/api/v3/orders", "method": "GET",
    "response": {"id": "string", "total": "number", "currency": "string"},
    "paging": "offset",
}).encode()  # fmt: skip
DRAFT_B = json.dumps({
    "path": "/api/v3/orders", "method": "GET",
    "response": {"id": "string", "total": "number", "currency": "string"},
    "paging": "cursor",
}).encode()  # fmt: skip
JSON = "application/json"


def say(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


class Participant(apiary.Agent):
    capabilities = ("negotiation",)

    async def setup(self) -> None:
        say("ready", agent=self.agent_id)

    async def on_negotiation(self, msg: apiary.Message) -> str:
        event = negotiation.decode(msg.payload)
        say("negotiation", agent=self.agent_id, kind=event.kind, sender=event.sender,
            negotiation_id=event.negotiation_id, correlation_id=msg.correlation_id)  # fmt: skip
        if event.kind == "decide":
            say("decided", agent=self.agent_id, by=event.by, result=event.result().decode())
        else:
            await self.react(event)
        return event.kind

    async def react(self, event: negotiation.NegotiationEvent) -> None:
        """What this participant does on `event`."""


class Frontend(Participant):
    agent_id = "frontend"

    async def react(self, event: negotiation.NegotiationEvent) -> None:
        if event.kind == "open":
            await self.client.negotiation.Propose(pb.negotiation_pb2.Proposal(
                negotiation_id=event.negotiation_id, from_agent=self.agent_id,
                content_type=JSON, payload=DRAFT_A,
            ))  # fmt: skip
        elif event.kind == "counter" and event.sender == "graphql":
            body = negotiation.evaluation(
                event.negotiation_id, 0.6, "cursor paging breaks our offset-based tables"
            )
            await negotiation.send(self, body)


class Graphql(Participant):
    agent_id = "graphql"

    async def react(self, event: negotiation.NegotiationEvent) -> None:
        if event.kind == "propose" and event.sender == "frontend":
            body = negotiation.proposal(event.negotiation_id, DRAFT_B, counter=True)
            await negotiation.send(self, body)


class Operator(apiary.Agent):
    agent_id = "hitl"
    capabilities = ("hitl",)

    async def setup(self) -> None:
        say("ready", agent=self.agent_id)

    async def on_hitl_invocation(self, msg: apiary.Message) -> str:
        body = msg.json()
        say("invocation", reason_type=body.get("reason_type"), subject=body.get("subject"))
        if body.get("reason_type") != "DEBATE_DEADLOCK":
            return "ignored"
        nid = body["subject"]["negotiation_id"]
        token = os.environ["APIARY_TOKEN"]
        address = os.environ["APIARY_COORDINATOR"]
        async with apiary.Client(address, metadata={"authorization": f"Bearer {token}"}) as c:
            reply = await c.scheduler_policy.HitlAction(pb.scheduler_policy_pb2.HitlActionRequest(
                negotiation_id=nid, action="decide=graphql",
                rationale="cursor paging scales; the frontend adapts its tables",
            ))  # fmt: skip
        say("hitl_decided", reason=reply.reason)
        return "decided"


ROLES: dict[str, type[apiary.Agent]] = {"frontend": Frontend, "graphql": Graphql, "hitl": Operator}


if __name__ == "__main__":
    import asyncio

    role, address = sys.argv[1], sys.argv[2]
    os.environ["APIARY_COORDINATOR"] = address
    asyncio.run(ROLES[role](coordinator=address).run())
