"""The agent of the runtime control plane's process tests (test_runtime_processes.py,
test_runtime_end_to_end.py), built on the SDK only:
`apiary agent run tests.e2e.runtime_agents:Answerer`. A turn's input chooses what it does:
{"value": V} answers {"answer": V}; {"mode": "loop"} steps with safe points until it is
interrupted; {"mode": "ask", "ask": WHAT} asks for a decision inside the turn
(sw4rm.hitl.HitlService.Decide, which the application sees as the thread's
`action.required`) and answers with the decision taken."""

from __future__ import annotations

import asyncio
import json

import apiary
from apiary.wire import pb


class Answerer(apiary.Agent):
    agent_id = "answerer"
    description = "Answers the runtime control plane's turns."

    async def on_task(self, task: apiary.TaskContext) -> object:
        turn = task.json()
        given = turn["input"]
        if isinstance(given, dict) and given.get("mode") == "loop":
            while True:
                await task.safe_point()
                await asyncio.sleep(0.01)
        if isinstance(given, dict) and given.get("mode") == "ask":
            return {"decision": await self._ask(str(given["ask"])), "turn": turn["turnId"]}
        value = given.get("value") if isinstance(given, dict) else given
        return {"answer": value, "turn": turn["turnId"]}

    async def _ask(self, what: str) -> str:
        """A person's decision on `what` (the call waits for it): the action it names."""
        decided = await self.client.hitl.Decide(
            pb.hitl_pb2.HitlInvocation(
                reason_type=pb.common_pb2.SECURITY_APPROVAL,
                context=json.dumps({"prompt": f"May I {what}?"}).encode(),
                proposed_actions=["approve", "deny"],
            )
        )
        return str(decided.action)
