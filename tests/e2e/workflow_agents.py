"""The agent processes of test_workflow_processes.py, built on the SDK only:
`python -m tests.e2e.workflow_agents AGENT_ID COORDINATOR ROLE`.

Each runs workflow nodes as Scheduler tasks in `on_task` and returns the node's output as a
dict (the SDK sends it as the JSON note of the FULFILLED ACK). Roles:

parse
    Input `{"file": NAME}`; returns `{"records": [{"id": 0, "file": NAME}, ...]}` (3 records).
branch
    Input `{"rows": [...]}`; waits for a DATA message `{"release": NODE_ID}`, then returns
    `{"count": len(rows), "by": AGENT_ID}`. The test releases both branches only once both
    are running: proof that they run in parallel.
join
    Input `{"stats": {...}}`; returns `{"total": sum of the stats' values}`.
flaky
    Fails its first attempt of each node (tool_timeout), returns `{"attempt": n}` after.

Every step is one JSON line on stdout: {"event": "ready"}, then "started" and "released".
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import apiary
from apiary.errors import ToolTimeoutError


def say(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


class WorkflowWorker(apiary.Agent):
    def __init__(self, agent_id: str, coordinator: str, role: str) -> None:
        super().__init__(agent_id, coordinator=coordinator)
        self.role = role
        self.releases: dict[str, asyncio.Event] = {}

    def release(self, node_id: str) -> asyncio.Event:
        return self.releases.setdefault(node_id, asyncio.Event())

    async def setup(self) -> None:
        say("ready", agent=self.agent_id)

    async def on_data(self, msg: apiary.Message) -> str:
        self.release(str(msg.json()["release"])).set()
        return "released"

    async def on_task(self, task: apiary.TaskContext) -> object:
        params = task.json()
        node, given = params["node_id"], params["input"]
        say("started", node=node, attempt=params["attempt"], input=given)
        if self.role == "parse":
            return {"records": [{"id": i, "file": given["file"]} for i in range(3)]}
        if self.role == "branch":
            await self.release(node).wait()
            say("released", node=node)
            return {"count": len(given["rows"]), "by": self.agent_id}
        if self.role == "join":
            return {"total": sum(given["stats"].values())}
        if self.role == "flaky":
            if params["attempt"] == 1:
                raise ToolTimeoutError("the first attempt always times out")
            return {"attempt": params["attempt"]}
        raise ValueError(f"unknown role {self.role!r}")


if __name__ == "__main__":
    asyncio.run(WorkflowWorker(sys.argv[1], sys.argv[2], sys.argv[3]).run())
