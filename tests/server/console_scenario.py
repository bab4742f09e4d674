"""A coordinator with some of everything the console's pages show, made through its real
interfaces (the JSON gateway, the SDK, an SDK agent running tasks), on a real SQLite file:

- `worker`, an SDK agent that runs tasks: `task-ok-1`, `task-ok-2` completed, `task-bad`
  failed (its handler raises);
- the workflow run `wf-1` (a -> b, both on the worker), completed;
- HITL invocations: one decided by the operator `olivia`, one pending, and `bulk` more decided;
- the room `ops`: a decided proposal (its only critic voted) and an open one (one of two
  critics voted);
- the negotiation `neg-1`, decided, and `neg-2`, open;
- `ghost`, registered without a stream, of the agent type `fragile` whose lifecycle times out
  in fractions of a second: its start-up and then its recovery time out and it ends FAILED;
  presence has lost it too (UNAVAILABLE in the registry), as after its missed heartbeats.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from apiary.core.agent_lifecycle import LifecycleTimeouts
from apiary.core.events import Event
from apiary.engine.assembly import Runtime
from apiary.engine.hitl import HitlSettings
from apiary.engine.lifecycle import LifecycleSettings
from apiary.engine.operators import OperatorEntry, token_digest
from apiary.engine.settings import SchedulerSettings
from apiary.sdk.agent import Agent
from apiary.sdk.scheduler import SchedulerClient
from apiary.sdk.tasks import TaskContext, TaskRunner
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from apiary.testing.events import wait_for_event

TOKEN = "console-pages-operator-token"
OPERATOR = "olivia"
HITL = HitlSettings(operators=(OperatorEntry(OPERATOR, token_digest(TOKEN), ("admin",)),))
FRAGILE = "fragile"
SCHEDULER = SchedulerSettings(
    lifecycle=LifecycleSettings(
        per_type={FRAGILE: LifecycleTimeouts(initializing=0.2, recovering=0.2)},
        max_auto_recoveries=1,
    )
)
WAIT_S = 30.0
ROOMS = "sw4rm.negotiation_room.NegotiationRoomService"
OPERATOR_HEADERS = {"Authorization": f"Bearer {TOKEN}"}


@dataclass
class World:
    coordinator: Coordinator
    http: aiohttp.ClientSession
    decided_hitl: str
    pending_hitl: str
    bulk_hitl: list[str]
    decided_artifact: str
    open_artifact: str

    async def call(
        self, path: str, body: object, headers: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """A gateway call that must succeed."""
        async with self.http.post(f"/v1/{path}", json=body, headers=headers or {}) as resp:
            answer: dict[str, Any] = await resp.json()
            assert resp.status == 200, (path, answer)
            return answer

    async def get(self, path: str, **params: str) -> tuple[int, dict[str, Any]]:
        async with self.http.get(path, params=params) as resp:
            return resp.status, await resp.json()


async def _handler(task: TaskContext) -> str:
    if task.json().get("fail"):
        raise KeyError("no such page")
    return f"done {task.task_id}"


async def _event(coordinator: Coordinator, event_type: str, **details: str) -> Event:
    def wanted(e: Event) -> bool:
        return e.event_type == event_type and all(e.details.get(k) == v for k, v in details.items())

    return await wait_for_event(coordinator.events, wanted, timeout_s=WAIT_S)


async def _tasks(world: World) -> None:
    coordinator = world.coordinator
    async with SchedulerClient(str(coordinator.grpc_address)) as client:
        for task_id, params in (("task-ok-1", {}), ("task-ok-2", {}), ("task-bad", {"fail": 1})):
            outcome = await client.submit_task("worker", task_id, params, scope="repo:app")
            assert outcome.accepted, outcome
            ended = ("task.failed",) if params else ("task.completed",)
            await _event(coordinator, ended[0], task_id=task_id)
    nodes = {
        "a": {"node_id": "a", "agent_id": "worker"},
        "b": {"node_id": "b", "agent_id": "worker", "dependencies": ["a"]},
    }
    workflows = "sw4rm.workflow.WorkflowService"
    await world.call(
        f"{workflows}/CreateWorkflow", {"definition": {"workflow_id": "wf-1", "nodes": nodes}}
    )
    await world.call(f"{workflows}/StartWorkflow", {"workflow_id": "wf-1"})
    await _event(coordinator, "workflow.completed", workflow_id="wf-1")


async def _hitl(world: World, bulk: int) -> tuple[str, str, list[str]]:
    hitl = "apiary.v1.HitlOperatorService"

    async def escalate(n: int) -> str:
        view = await world.call(f"{hitl}/Escalate", {
            "reason_type": "TOOL_PRIVILEGE_ESCALATION", "requested_by": "worker",
            "subject_json": json.dumps({"agent_id": "worker", "n": n}),
        })  # fmt: skip
        return str(view["invocation_id"])

    async def decide(invocation: str, why: str) -> None:
        body = {"invocation_id": invocation, "action": "approve", "rationale": why}
        await world.call(f"{hitl}/Decide", body, OPERATOR_HEADERS)

    decided = await escalate(0)
    await decide(decided, "reviewed the diff")
    many = []
    for n in range(bulk):
        many.append(await escalate(n + 1))
        await decide(many[-1], f"batch {n}")
    return decided, await escalate(-1), many


async def _rooms(world: World) -> tuple[str, str]:
    artifact = base64.b64encode(b"replicas: 3\n").decode()

    async def propose(critics: list[str]) -> str:
        proposal = {"proposal": {
            "artifact_type": "DEPLOYMENT", "artifact": artifact,
            "artifact_content_type": "application/yaml", "requested_critics": critics,
            "negotiation_room_id": "ops",
        }}  # fmt: skip
        answer = await world.call(f"{ROOMS}/SubmitProposal", proposal,
                                  {"sw4rm-agent-id": "producer"})  # fmt: skip
        return str(answer["artifact_id"])

    async def vote(artifact_id: str, critic: str) -> None:
        body = {"vote": {"artifact_id": artifact_id, "score": 8, "confidence": 0.9,
                         "passed": True}}  # fmt: skip
        await world.call(f"{ROOMS}/SubmitVote", body, {"sw4rm-agent-id": critic})

    decided = await propose(["c1"])
    await vote(decided, "c1")
    still_open = await propose(["c1", "c2"])
    await vote(still_open, "c1")
    return decided, still_open


async def _negotiations(world: World) -> None:
    for agent in ("frontend", "graphql"):
        descriptor = {
            "agent_id": agent,
            "name": agent,
            "modalities_supported": ["application/json"],
            "reasoning_connectors": ["builtin://rules"],
        }
        register = "sw4rm.registry.RegistryService/RegisterAgent"
        answer = await world.call(register, {"agent": descriptor})
        assert answer.get("accepted"), answer
    service = "sw4rm.negotiation.NegotiationService"
    for nid in ("neg-1", "neg-2"):
        await world.call(f"{service}/Open", {
            "negotiation_id": nid, "topic": f"/api/{nid}", "participants": ["frontend", "graphql"],
            "intensity": "LOW", "debate_timeout": "600s",
        })  # fmt: skip
    draft = base64.b64encode(b'{"fields": ["id"]}').decode()
    await world.call(
        f"{service}/Propose",
        {
            "negotiation_id": "neg-1",
            "from_agent": "frontend",
            "content_type": "application/json",
            "payload": draft,
        },
    )
    await world.call(f"{service}/Evaluate", {"negotiation_id": "neg-1", "from_agent": "graphql",
                                             "confidence_score": 0.95})  # fmt: skip


async def _ghost(world: World) -> None:
    descriptor = {"agent_id": "ghost", "name": FRAGILE, "reasoning_connectors":
                  ["builtin://rules"]}  # fmt: skip
    answer = await world.call("sw4rm.registry.RegistryService/RegisterAgent",
                              {"agent": descriptor})  # fmt: skip
    assert answer.get("accepted"), answer
    coordinator = world.coordinator
    await wait_for_event(
        coordinator.events,
        lambda e: e.event_type == "agent.auto_recovery_exhausted" and e.agent_id == "ghost",
        timeout_s=WAIT_S,
    )
    # What presence does to an agent that missed its heartbeats (engine/presence.py).
    await coordinator.registry.set_state("ghost", "UNAVAILABLE", "3 missed heartbeats")


@asynccontextmanager
async def open_world(tmp_path: Path, *, bulk: int = 0) -> AsyncIterator[World]:
    """The coordinator with everything above; the worker runs until the block ends."""
    store = f"sqlite:///{tmp_path / 'apiary.db'}"
    async with (
        open_test_coordinator(
            tmp_path, store, runtime=Runtime(hitl=HITL), scheduler_settings=SCHEDULER
        ) as coordinator,
        aiohttp.ClientSession(base_url=f"http://{coordinator.http_address}") as http,
        Agent("worker", coordinator=str(coordinator.grpc_address)) as agent,
    ):
        job = asyncio.create_task(TaskRunner(agent, _handler).run())
        try:
            world = World(coordinator, http, "", "", [], "", "")
            await _tasks(world)
            world.decided_hitl, world.pending_hitl, world.bulk_hitl = await _hitl(world, bulk)
            world.decided_artifact, world.open_artifact = await _rooms(world)
            await _negotiations(world)
            await _ghost(world)
            yield world
        finally:
            job.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await job
