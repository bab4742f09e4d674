"""The planner: turns a brief into work for the other agents.

    apiary agent run demo_agents.planner:Planner --coordinator HOST:PORT

On a brief (a DATA message: the repository, the failing test, the function at fault) it

1. submits the indexer's background index of the repository (priority 10, low), so that
   lookups are fast later, and keeps the task's handle (the coordinator assigns its id);
2. creates and starts the workflow fix -> review -> merge (RFC 17.7): `fix` and `review` run
   on the coder, `merge` on the merger, each once the one before completed, with the change
   handed from node to node through the workflow's data;
3. follows the workflow to its end, takes the index's result through its handle (what the
   indexer's `on_task` returned) and answers the brief with both, in the brief's
   correlation.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import apiary
from apiary.wire import pb
from demo_agents.common import INDEXER, REPO_ID, say, say_result

w = pb.workflow_pb2
POLL_S = 0.5
WORKFLOW_TIMEOUT_S = 1800.0
"""The merge waits for a person: long enough for one to come back from lunch."""
INDEX_TIMEOUT_S = 300.0
"""For the background index's end once the workflow ended."""


def definition(workflow_id: str, brief: dict[str, Any]) -> w.WorkflowDefinition:
    nodes = [
        w.WorkflowNode(
            node_id="fix",
            agent_id="coder",
            output_mapping={"$": "change"},
            metadata={"description": f"fix {brief['symbol']}"},
        ),
        w.WorkflowNode(
            node_id="review",
            agent_id="coder",
            dependencies=["fix"],
            input_mapping={"commit": "change.commit", "branch": "change.branch"},
            output_mapping={"$": "approved"},
        ),
        w.WorkflowNode(
            node_id="merge",
            agent_id="merger",
            dependencies=["review"],
            input_mapping={
                "commit": "approved.commit",
                "branch": "approved.branch",
                "revisions": "approved.revisions",
            },
            output_mapping={"$": "merged"},
        ),
    ]
    built = w.WorkflowDefinition(workflow_id=workflow_id, metadata={"brief": brief["issue"]})
    for node in nodes:
        built.nodes[node.node_id].CopyFrom(node)
    return built


class Planner(apiary.Agent):
    agent_id = "planner"
    capabilities = ("planning",)
    description = "Plans a fix as a workflow and follows it to its end."

    async def on_data(self, msg: apiary.Message) -> str:
        brief: dict[str, Any] = msg.json()
        run = uuid.uuid4().hex[:6]
        repo_id = brief.get("repo_id", REPO_ID)
        params = {
            "kind": "full",
            "repo_id": repo_id,
            "rate": brief.get("index_rate", 100),
            "description": f"background index of {repo_id} and the standard library",
        }
        index = await self.client.submit_task(
            INDEXER, params, priority=10, scope=f"resource:index.{repo_id}"
        )
        say(f"background index: task {index.task_id} (priority 10): {index.reason}")

        workflow_id = f"fix-{brief['symbol'].replace('_', '-')}-{run}"
        flows = self.client.workflow
        await flows.CreateWorkflow(
            w.CreateWorkflowRequest(definition=definition(workflow_id, brief))
        )
        await flows.StartWorkflow(
            w.StartWorkflowRequest(workflow_id=workflow_id, workflow_data=json.dumps(brief))
        )
        say(f"started workflow {workflow_id}: fix -> review -> merge")
        state = await self.follow(workflow_id)
        status = state.metadata.get("status", "")
        report = {
            "workflow_id": workflow_id,
            "status": status,
            "index_task": index.task_id,
            "index": await self.index_result(index),
            "nodes": {
                k: {"status": w.NodeStatus.Name(n.status), "error": n.error}
                for k, n in state.node_states.items()
            },
            "data": json.loads(state.workflow_data or "{}"),
        }
        await msg.reply(report)
        say(f"workflow {workflow_id} {status}; reported to {msg.producer_id}")
        return status

    async def index_result(self, index: apiary.TaskHandle) -> dict[str, Any]:
        """What the indexer returned for the background index, through its handle; a
        failure as its code and message (the report says so, the run's judge decides)."""
        try:
            result: dict[str, Any] = await index.result(timeout=INDEX_TIMEOUT_S)
        except apiary.TaskFailedError as exc:  # the indexer's code and message
            say(f"background index {index.task_id} failed: {exc}")
            return {"error": exc.error_code, "message": exc.message}
        except apiary.TaskTimeoutError as exc:  # TaskHeldError too: still HELD, and why
            say(f"background index {index.task_id} has not ended: {exc}")
            return {"error": exc.code, "state": exc.state, "message": exc.message}
        say_result(
            f"background index {index.task_id}: {result['symbols']} symbols in "
            f"{result['files']} files (attempt {result['attempt']}, resumed after "
            f"{result['resumed_after']})"
        )
        return result

    async def follow(self, workflow_id: str) -> w.WorkflowState:
        request = w.GetWorkflowStateRequest(workflow_id=workflow_id)
        async with asyncio.timeout(WORKFLOW_TIMEOUT_S):
            while True:
                reply: w.GetWorkflowStateResponse = await self.client.workflow.GetWorkflowState(
                    request
                )
                state = reply.state
                if state.metadata.get("status") in ("COMPLETED", "FAILED"):
                    return state
                await asyncio.sleep(POLL_S)
