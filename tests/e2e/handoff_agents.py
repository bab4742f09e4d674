"""The agent processes of test_handoff_processes.py, built on the SDK only:
`python -m tests.e2e.handoff_agents ROLE AGENT_ID COORDINATOR [TARGET]`.

origin
    Works on a context (a ticket with steps done and to do), then hands it off to TARGET
    ("" routes by capability) requiring `security-review`, waits for the outcome, stops
    working on the context, completes the handoff and checks that it can no longer read it.
reviewer
    Accepts every offer (`on_handoff` returns) and, once the handoff is completed, resumes
    the work from the context snapshot (`on_handoff_completed`).
refuser
    Has the capability but rejects every offer with a reason (`Rejected`).

Every step of interest is one JSON line on stdout: {"event": "ready"} once registered,
then "working", "requested", "outcome", "stopped", "completed", "barred" (origin),
"offered", "resumed" (reviewer), "offered", "refused" (refuser).
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from apiary.errors import ApiaryError
from apiary.sdk.agent import Agent, Rejected
from apiary.sdk.handoff import Handoff

CAPABILITY = "security-review"
CONTEXT = {"ticket": 42, "done": ["triage", "reproduce"], "todo": ["patch", "test"]}
WAIT_S = 30.0


def say(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


class Origin(Agent):
    handoff_poll_s = 0.0

    def __init__(self, agent_id: str, coordinator: str, target: str) -> None:
        super().__init__(agent_id, coordinator=coordinator)
        self.target = target
        self.working = False
        self._job: asyncio.Task[None] | None = None

    async def setup(self) -> None:
        say("ready", agent=self.agent_id)
        self._job = asyncio.ensure_future(self.work())

    async def work(self) -> None:
        self.working = True
        say("working", context=CONTEXT)
        ticket = await self.handoff(
            self.target, context=CONTEXT, capabilities=[CAPABILITY], timeout_s=WAIT_S,
            reason="the patch needs a security review",
        )  # fmt: skip
        say("requested", request_id=ticket.request_id)
        state = await ticket.outcome(WAIT_S)
        say("outcome", state=state, updates=[u["event"] for u in ticket.updates])
        if state != "ACCEPTED":
            return
        self.working = False  # RFC 17.6: no more work on the transferred context
        say("stopped")
        say("completed", message=await ticket.complete())
        try:
            await self.handoffs.get(ticket.request_id)
        except ApiaryError as exc:
            say("barred", code=exc.code)
        else:
            say("still_readable")


class Reviewer(Agent):
    capabilities = (CAPABILITY,)
    handoff_poll_s = 0.0

    async def setup(self) -> None:
        say("ready", agent=self.agent_id)

    async def on_handoff(self, offer: Handoff) -> None:
        say(
            "offered", request_id=offer.request_id, origin=offer.from_agent,
            attempt=offer.attempt, content_type=offer.content_type, snapshot=offer.json(),
        )  # fmt: skip

    async def on_handoff_completed(self, handoff: Handoff) -> None:
        context = handoff.json()
        finished = [*context["done"], *(f"{step} (by {self.agent_id})" for step in context["todo"])]
        say("resumed", request_id=handoff.request_id, ticket=context["ticket"], done=finished)


class Refuser(Reviewer):
    async def on_handoff(self, offer: Handoff) -> None:
        say("offered", request_id=offer.request_id, attempt=offer.attempt)
        say("refused", request_id=offer.request_id)
        raise Rejected(note="on leave this week")


async def main(role: str, agent_id: str, coordinator: str, target: str = "") -> None:
    agent: Agent
    if role == "origin":
        agent = Origin(agent_id, coordinator, target)
    elif role == "reviewer":
        agent = Reviewer(agent_id, coordinator=coordinator)
    elif role == "refuser":
        agent = Refuser(agent_id, coordinator=coordinator)
    else:
        raise SystemExit(f"unknown role {role!r}")
    await agent.run()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
