"""The agent of test_runtime_processes.py, built on the SDK only:
`apiary agent run tests.e2e.runtime_agents:Answerer`. A turn's input chooses what it does:
{"value": V} answers {"answer": V}; {"mode": "loop"} steps with safe points until it is
interrupted."""

from __future__ import annotations

import asyncio

import apiary


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
        value = given.get("value") if isinstance(given, dict) else given
        return {"answer": value, "turn": turn["turnId"]}
