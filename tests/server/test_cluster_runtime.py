"""The runtime control plane on any replica of a cluster (docs/control-plane.md, "Cluster
mode"; docs/cluster.md, "The leader"): three coordinators serving one PostgreSQL schema; the
default tenant's control plane runs on the leader, and the other replicas decide each
command and forward it there.

- A turn submitted over HTTP through a follower runs as a task of an agent streaming on the
  other follower; its result is read back through the first follower, over HTTP JSON,
  JSON-RPC and gRPC (RuntimeControlService.Call), and its work was the leader's; a turn
  followed on the first follower's event stream ends there.
- A caller whose credential does not hold is refused on the follower, before anything is
  forwarded: the follower counts the refusal, the leader sees no call.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import grpc
import pytest

from apiary.sdk.runtime import RuntimeClient
from apiary.server.coordinator import Coordinator
from apiary.wire import pb
from tests.server.runtime_harness import running_answerer, runtime_http
from tests.server.test_cluster_leader import AUTH, OPERATORS, TOKEN, WAIT_S, _three

pytestmark = pytest.mark.postgres

a = pb.apiary_pb2
HEADERS = {"Authorization": f"Bearer {TOKEN}"}
FORGED = {"Authorization": "Bearer not-a-token-of-this-cluster"}


async def _call(replica: Coordinator, command: str, metadata: object, **params: object) -> str:
    """RuntimeControlService.Call's result (JSON text), or its error's code name."""
    async with grpc.aio.insecure_channel(str(replica.grpc_address)) as channel:
        stub = pb.apiary_pb2_grpc.RuntimeControlServiceStub(channel)
        try:
            answer = await stub.Call(
                a.RuntimeCommandRequest(command=command, params_json=json.dumps(params).encode()),
                metadata=metadata,
            )
        except grpc.aio.AioRpcError as exc:
            return str(exc.code().name)
    return str(answer.result_json)


async def _denied(replica: Coordinator, action: str) -> float:
    """The replica's count of refused calls of `action` (its /metrics)."""
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://{replica.http_address}/metrics", headers=HEADERS) as response,
    ):
        assert response.status == 200
        text = await response.text()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("apiary_access_denied_total{") and f'action="{action}"' in line
    )


async def test_a_turn_submitted_through_a_follower_runs_and_is_read_back_through_it(
    tmp_path: Path, url: str
) -> None:
    async with (
        _three(tmp_path, url, OPERATORS) as (leader, f1, f2),
        running_answerer(f1) as answerer,
        runtime_http(f2, HEADERS) as runtime,
    ):
        submitted = await runtime.ok(
            "submit_turn", agent_id="answerer", turn_id="turn-1", input={"value": 42}
        )
        assert submitted["created"] and submitted["turnId"] == "turn-1"
        read = await runtime.thread_status(submitted["threadId"], "completed")
        assert read["threads"][0]["lastOutcome"] == {
            "turnId": "turn-1", "status": "completed", "result": {"answer": 42}
        }  # fmt: skip
        # The same turn read over JSON-RPC and gRPC through the follower.
        got = await runtime.call("get_task", task_id=submitted["taskId"])
        assert got["result"]["task"]["result"] == {"answer": 42}
        over_grpc = json.loads(await _call(f2, "get_task", AUTH, task_id=submitted["taskId"]))
        assert over_grpc["task"]["status"] == "completed"
        # A retry through another follower is the turn submitted first.
        async with runtime_http(f1, HEADERS) as other:
            again = await other.ok(
                "submit_turn", agent_id="answerer", turn_id="turn-1", input={"value": 42}
            )
        assert (again["created"], again["taskId"]) == (False, submitted["taskId"])
        # A turn followed on the follower's event stream: the leader's events reach it.
        async with RuntimeClient(f"http://{f2.http_address}", headers=HEADERS) as client:
            held = await client.submit_turn(
                {"mode": "hold"}, agent_id="answerer", thread_id=submitted["threadId"],
                turn_id="turn-2",
            )  # fmt: skip
            waiting = asyncio.create_task(
                client.wait_turn(held.session_id, "turn-2", timeout=WAIT_S)
            )
            await answerer.running("turn-2")
            answerer.release("turn-2")
            ended = await waiting
        assert (ended.status, ended.result) == ("completed", {"answer": None})
        # The leader ran it: its Scheduler, its control plane following the turn.
        assert leader.scheduler is not None
        assert (await leader.scheduler.find(submitted["taskId"])).state == "COMPLETED"
        for follower in (f1, f2):
            assert follower.control_planes is not None
            control = follower.control_planes.opened()
            assert control is None or control.turns.following() == 0


async def test_a_caller_whose_credential_does_not_hold_is_refused_on_the_follower(
    tmp_path: Path, url: str
) -> None:
    action = "POST /runtime/v1/{command}"  # (HTTP refusals count under the route)
    async with (
        _three(tmp_path, url, OPERATORS) as (leader, f1, _f2),
        runtime_http(f1, FORGED) as forged,
    ):
        error = await forged.error(401, "submit_turn", agent_id="answerer", input="x")
        assert error["code"] == "unauthenticated"
        forged_grpc = (("authorization", FORGED["Authorization"]),)
        refused = await _call(f1, "submit_turn", forged_grpc, agent_id="answerer")
        assert refused == "UNAUTHENTICATED"
        assert await _denied(f1, action) == 1
        assert await _denied(leader, action) == 0
        assert await _denied(f1, "/apiary.v1.RuntimeControlService/Call") == 1
        assert await _denied(leader, "/apiary.v1.RuntimeControlService/Call") == 0
