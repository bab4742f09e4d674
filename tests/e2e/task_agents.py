"""The agent process of test_preemption_processes.py and test_shared_queue_processes.py, built
on the SDK only: `python -m tests.e2e.task_agents AGENT_ID COORDINATOR [CAPABILITY ...]` (the
capabilities it offers, for shared queues).

It runs Scheduler tasks with `TaskRunner`; the task's params choose the behaviour:

quick
    Returns at once.
yield_once
    First attempt: steps (one `safe_point()` before each) until preempted, at most
    `max_steps`; later attempts return at once.
section
    Enters `non_preemptible(max_duration)` and waits for an event that never fires: only
    a terminate (the runner cancels it) ends it.
stubborn
    As `section`, but swallows every cancellation: only the Scheduler's kill ends it (the
    runner abandons it).
hold
    Waits until a DATA message `{"release": TASK_ID}` from another agent arrives.

Every step of interest is one JSON line on stdout: {"event": "ready"} once registered, then
"started", "yielding", "cancelled", "ignored_cancel", "released" and "notice" (coordinator
NOTIFICATIONs such as task_deferred, delivered marked as notices).
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from apiary.core.envelope import AckStage, MessageType
from apiary.sdk.agent import Agent
from apiary.sdk.connection import Delivery
from apiary.sdk.tasks import Preempted, TaskContext, TaskRunner

STEP_S = 0.01
"""The duration of one simulated unit of work between safe points."""


def say(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


class Behaviours:
    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.releases: dict[str, asyncio.Event] = {}

    def release(self, task_id: str) -> asyncio.Event:
        return self.releases.setdefault(task_id, asyncio.Event())

    async def on_message(self, delivery: Delivery) -> None:
        env = delivery.envelope
        if delivery.notice:  # a coordinator notice: reported, never acknowledged
            say("notice", body=json.loads(env.payload or b"{}"))
            return
        if env.message_type is MessageType.ACKNOWLEDGEMENT:
            return
        if env.message_type is MessageType.DATA:
            body = json.loads(env.payload or b"{}")
            if "release" in body:
                self.release(str(body["release"])).set()
        await self.agent.ack(env, AckStage.FULFILLED)

    async def handle(self, task: TaskContext) -> str:
        params = task.json() or {}
        mode = params.get("mode", "quick")
        say("started", task=task.task_id, attempt=task.attempt, mode=mode)
        if mode == "quick":
            return "done"
        if mode == "yield_once":
            return await self.yield_once(task, int(params.get("max_steps", 3000)))
        if mode in ("section", "stubborn"):
            async with task.non_preemptible(max_duration=float(params["max_duration"])):
                say("in_section", task=task.task_id)
                await (self.stubborn(task) if mode == "stubborn" else self.blocked(task))
            return "section ended"  # never reached: nothing sets the event
        if mode == "hold":
            await self.release(task.task_id).wait()
            say("released", task=task.task_id)
            return "released"
        raise ValueError(f"unknown mode {mode!r}")

    async def yield_once(self, task: TaskContext, max_steps: int) -> str:
        if task.attempt > 1:
            return "resumed"
        for step in range(max_steps):
            try:
                await task.safe_point()
            except Preempted:
                say("yielding", task=task.task_id, step=step)
                raise
            await asyncio.sleep(STEP_S)  # one unit of work
        return "never preempted"

    async def blocked(self, task: TaskContext) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            say("cancelled", task=task.task_id)
            raise

    async def stubborn(self, task: TaskContext) -> None:
        never = asyncio.Event()
        while True:
            try:
                await never.wait()
            except asyncio.CancelledError:
                say("ignored_cancel", task=task.task_id)


async def main(agent_id: str, coordinator: str, capabilities: list[str]) -> None:
    async with Agent(agent_id, coordinator=coordinator, capabilities=capabilities) as agent:
        behaviours = Behaviours(agent)
        runner = TaskRunner(agent, behaviours.handle, on_message=behaviours.on_message)
        say("ready", agent=agent_id)
        await runner.run()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3:]))
