"""The cluster's leader in process (docs/cluster.md, "The leader"): three coordinators
serving one PostgreSQL schema as replicas, one of them the leader (the holder of the
leader's lease), where the Scheduler runs.

- A task submitted through one follower, for an agent whose stream is on the other
  follower, runs there and its result reaches the submitter waiting through the leader; and
  the other way round.
- A leader that stops without releasing anything (as a killed process) is replaced within
  the lease's time; the new leader loads the tasks from the store and a task accepted
  before runs to its end.
- The forwarding metadata is refused from a caller that is not a replica: unsigned, signed
  with another key, replayed, on a coordinator that is not in cluster mode.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

import apiary
from apiary.core.access.principal import Mechanism, Principal, PrincipalKind
from apiary.core.cluster.forwarding import FORWARD_KEY, Forwarded, sign_forward
from apiary.engine.assembly import Runtime
from apiary.engine.cluster.leader_role import LeaderRole
from apiary.engine.cluster.settings import ClusterSettings
from apiary.engine.hitl import HitlSettings
from apiary.engine.operators import OperatorEntry, token_digest
from apiary.errors import UnimplementedError
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from apiary.wire import pb
from apiary.wire.errordetail import error_from_trailers
from apiary.wire.handoff import seconds_duration
from tests.server.wire_client import descriptor

pytestmark = pytest.mark.postgres

WAIT_S = 30.0
PARTITIONS = 8
LEASE_S = 1.5
SCOPE = "repo:app"
TOKEN = "s3cret-operator-token"
OPERATORS = Runtime(
    hitl=HitlSettings(operators=(OperatorEntry("olivia", token_digest(TOKEN), ("admin",)),))
)
AUTH = (("authorization", f"Bearer {TOKEN}"),)


async def _until(condition: Callable[[], bool], what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"never: {what}")
        await asyncio.sleep(0.02)


@asynccontextmanager
async def _replica(
    tmp_path: Path, url: str, replica_id: str, runtime: Runtime | None
) -> AsyncIterator[Coordinator]:
    settings = ClusterSettings(True, replica_id, LEASE_S, PARTITIONS)
    async with open_test_coordinator(
        tmp_path / replica_id, url, cluster=settings, runtime=runtime
    ) as replica:
        yield replica


def _role(replica: Coordinator) -> LeaderRole:
    assert replica.cluster is not None and replica.cluster.leader is not None
    return replica.cluster.leader


@asynccontextmanager
async def _three(
    tmp_path: Path, url: str, runtime: Runtime | None = None
) -> AsyncIterator[list[Coordinator]]:
    """Three replicas, the leader first, once one leads."""
    async with AsyncExitStack() as stack:
        replicas = [
            await stack.enter_async_context(_replica(tmp_path, url, name, runtime))
            for name in "abc"
        ]
        await _until(lambda: sum(_role(r).leads() for r in replicas) == 1, "one leader")
        await _until(lambda: all(_role(r).lease.address for r in replicas), "every replica sees it")
        replicas.sort(key=lambda r: not _role(r).leads())
        yield replicas


class Doubler(apiary.Agent):
    agent_id = "doubler"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ran: list[str] = []

    async def on_task(self, task: apiary.TaskContext) -> object:
        self.ran.append(task.task_id)
        params = task.json()
        if "n" not in params:  # (a workflow's node: its input as the workflow gives it)
            return params
        return {"twice": params["n"] * 2}


@asynccontextmanager
async def _running(agent: apiary.Agent) -> AsyncIterator[None]:
    job = asyncio.create_task(agent.run())
    try:
        await _until(lambda: agent._runner is not None, f"{agent.agent_id} runs")
        yield
    finally:
        job.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await job


async def test_a_task_submitted_on_one_follower_runs_on_another_and_its_result_reaches_the_leader(
    tmp_path: Path, url: str
) -> None:
    async with _three(tmp_path, url) as (leader, f1, f2):
        agent = Doubler(coordinator=str(f1.grpc_address))
        async with (
            _running(agent),
            apiary.Client(str(f2.grpc_address), agent_id="app") as submitter,
            apiary.Client(str(leader.grpc_address), agent_id="app") as waiter,
            apiary.Client(str(f1.grpc_address), agent_id="app") as other,
        ):
            handle = await submitter.submit_task("doubler", {"n": 21}, scope=SCOPE)
            assert await waiter.task(handle.task_id).result(timeout=WAIT_S) == {"twice": 42}
            # The other way round: submitted through the leader, waited for on a follower.
            second = await waiter.submit_task("doubler", {"n": 5}, scope=SCOPE, task_id="t-2")
            assert await other.task(second.task_id).result(timeout=WAIT_S) == {"twice": 10}
            # The leader serves the waits' stream; a follower does not (it is not forwarded),
            # and that client waits with WaitTask, forwarded.
            assert waiter.task_waits.fallback is None and waiter.task_waits.opened == 1
            assert isinstance(other.task_waits.fallback, UnimplementedError)
            status = await submitter.task("t-2").status()
            assert (status.state, status.agent_id) == ("COMPLETED", "doubler")
            # The JSON gateway of a follower forwards the same way.
            async with aiohttp.ClientSession() as session:
                http = f"http://{f2.http_address}/v1/apiary.v1.TaskQueryService/GetTask"
                async with session.post(
                    http, json={"task_id": "t-2"}, headers={"sw4rm-agent-id": "app"}
                ) as response:
                    assert response.status == 200, await response.text()
                    view = await response.json()
            assert (view["task_id"], view["state"]) == ("t-2", "COMPLETED")
        assert agent.ran == [handle.task_id, "t-2"]
        assert leader.scheduler is not None and f1.scheduler is not None
        assert (await f1.scheduler.find("t-2")).state == "COMPLETED"  # (read from the store)


class Holder(apiary.Agent):
    """Holds each task until released."""

    agent_id = "holder"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.ran: list[str] = []

    async def on_task(self, task: apiary.TaskContext) -> object:
        self.ran.append(task.task_id)
        self.started.set()
        await self.release.wait()
        return "held"


async def test_a_killed_leader_is_replaced_and_the_task_it_dispatched_ends(
    tmp_path: Path, url: str
) -> None:
    async with _three(tmp_path, url) as (leader, f1, f2):
        agent = Holder(coordinator=str(f1.grpc_address))
        async with (
            _running(agent),
            apiary.Client(str(f2.grpc_address), agent_id="app") as client,
        ):
            handle = await client.submit_task("holder", {"n": 1}, scope=SCOPE, task_id="t-k")
            await asyncio.wait_for(agent.started.wait(), WAIT_S)
            assert leader.cluster is not None
            leader.cluster.halt()  # (as SIGKILL: nothing released)
            started = time.monotonic()
            await _until(lambda: _role(f1).leads() or _role(f2).leads(), "a new leader")
            print(f"a new leader after {time.monotonic() - started:.2f} s (lease_s {LEASE_S})")
            # The agent's ACK reaches the new leader through the relay.
            agent.release.set()
            assert await handle.result(timeout=WAIT_S) == "held"
            # And the new leader dispatches what comes next.
            second = await client.submit_task("holder", {"n": 2}, scope=SCOPE, task_id="t-l")
            assert await second.result(timeout=WAIT_S) == "held"
        assert agent.ran == ["t-k", "t-l"]


def _forwarded(key: str, method: str, name: str = "mallory") -> str:
    principal = Principal(PrincipalKind.OPERATOR, name, roles=frozenset({"admin"}),
                          mechanism=Mechanism.OPERATOR_TOKEN)  # fmt: skip
    forwarded = Forwarded(principal, "x", int(time.time() * 1000), secrets.token_hex(8))
    return sign_forward(key, method, forwarded)


async def _list_tasks(address: str, metadata: list[tuple[str, str]]) -> str:
    """The error code ListTasks answers with `metadata` ('ok' when it answers)."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb.apiary_pb2_grpc.TaskQueryServiceStub(channel)
        try:
            await stub.ListTasks(pb.apiary_pb2.ListTasksRequest(), metadata=metadata)
        except grpc.aio.AioRpcError as exc:
            error = error_from_trailers(exc.trailing_metadata() or ())
            assert error is not None
            return f"{exc.code().name} {error.code} {error.details.get('field', '')}"
    return "ok"


async def test_the_forwarding_metadata_is_refused_from_a_caller_that_is_not_a_replica(
    tmp_path: Path, url: str
) -> None:
    path = "/apiary.v1.TaskQueryService/ListTasks"
    refused = f"UNAUTHENTICATED unauthenticated {FORWARD_KEY}"
    async with _three(tmp_path, url) as (leader, f1, _f2):
        for replica in (leader, f1):
            address = str(replica.grpc_address)
            assert await _list_tasks(address, [(FORWARD_KEY, "v1.e30.00")]) == refused
            forged = _forwarded(secrets.token_hex(32), path)
            assert await _list_tasks(address, [(FORWARD_KEY, forged)]) == refused
        key = _role(leader).forward_key
        genuine = _forwarded(key, path)
        assert await _list_tasks(str(leader.grpc_address), [(FORWARD_KEY, genuine)]) == "ok"
        # Once only: the same metadata again is a replay.
        assert await _list_tasks(str(leader.grpc_address), [(FORWARD_KEY, genuine)]) == refused
        # Signed for another method: refused for this one.
        other = _forwarded(key, "/apiary.v1.TaskQueryService/GetTask")
        assert await _list_tasks(str(leader.grpc_address), [(FORWARD_KEY, other)]) == refused
    async with open_test_coordinator(tmp_path / "alone") as alone:
        forged = _forwarded(secrets.token_hex(32), path)
        assert await _list_tasks(str(alone.grpc_address), [(FORWARD_KEY, forged)]) == refused


async def test_a_hitl_escalation_opened_through_one_follower_is_decided_through_another(
    tmp_path: Path, url: str
) -> None:
    """HITL runs on the leader: its services' calls, on any replica, reach the invocation
    the leader holds, and a waiter there sees the decision."""
    a = pb.apiary_pb2
    async with (
        _three(tmp_path, url, OPERATORS) as (leader, f1, f2),
        grpc.aio.insecure_channel(str(f1.grpc_address)) as one,
        grpc.aio.insecure_channel(str(f2.grpc_address)) as two,
    ):
        opened = await pb.apiary_pb2_grpc.HitlOperatorServiceStub(one).Escalate(
            a.EscalateRequest(reason_type="SECURITY_APPROVAL", requested_by="planner"),
            metadata=AUTH,
        )
        assert leader.hitl is not None and f1.hitl is not None
        assert opened.invocation_id not in {r.invocation_id for r in await f1.hitl.list()}
        waiting = asyncio.create_task(leader.hitl.wait(opened.invocation_id))
        listed = await pb.apiary_pb2_grpc.HitlOperatorServiceStub(two).List(
            a.ListInvocationsRequest(), metadata=AUTH
        )
        assert opened.invocation_id in {i.invocation_id for i in listed.invocations}
        assert opened.state == "PENDING"
        await pb.apiary_pb2_grpc.HitlOperatorServiceStub(two).Decide(
            a.DecideInvocationRequest(
                invocation_id=opened.invocation_id, action="approve", rationale="ok"
            ),
            metadata=AUTH,
        )
        decided = await asyncio.wait_for(waiting, WAIT_S)
        assert decided.state != "PENDING" and "olivia" in json.dumps(decided.decision)


async def _workflow_status(client: apiary.Client, workflow_id: str, status: str) -> str:
    """The workflow's status once it is `status` (or as it stands after WAIT_S)."""
    w = pb.workflow_pb2
    loop = asyncio.get_running_loop()
    until = loop.time() + WAIT_S
    found = ""
    while found != status and loop.time() < until:
        got = await client.workflow.GetWorkflowState(
            w.GetWorkflowStateRequest(workflow_id=workflow_id)
        )
        found = got.state.metadata["status"]
        await asyncio.sleep(0.05)
    return found


async def test_a_workflow_started_through_a_follower_runs_its_task_on_an_agent_of_another(
    tmp_path: Path, url: str
) -> None:
    """Workflows run on the leader: created and started through one follower, their tasks
    run by an agent streaming on the other, their state read through either; a message to
    `workflow` admitted by a follower reaches the leader's workflows (an EVENT node)."""
    w = pb.workflow_pb2
    plain = w.WorkflowDefinition(workflow_id="wf")
    plain.nodes["double"].CopyFrom(w.WorkflowNode(node_id="double", agent_id="doubler"))
    evented = w.WorkflowDefinition(workflow_id="wf-event")
    evented.nodes["wait"].CopyFrom(
        w.WorkflowNode(node_id="wait", agent_id="doubler", trigger_type=w.EVENT)
    )
    async with _three(tmp_path, url) as (_leader, f1, f2):
        agent = Doubler(coordinator=str(f1.grpc_address))
        async with (
            _running(agent),
            apiary.Client(str(f2.grpc_address)) as client,
            apiary.Client(str(f1.grpc_address)) as other,
        ):
            for definition in (plain, evented):
                await client.workflow.CreateWorkflow(w.CreateWorkflowRequest(definition=definition))
                await client.workflow.StartWorkflow(
                    w.StartWorkflowRequest(
                        workflow_id=definition.workflow_id, workflow_data='{"n": 4}'
                    )
                )
            assert await _workflow_status(other, "wf", "COMPLETED") == "COMPLETED"
            event = agent.envelope({"workflow_id": "wf-event", "node_id": "wait"})
            await agent.send_envelope(event, "workflow")  # (admitted by f1, a follower)
            assert await _workflow_status(client, "wf-event", "COMPLETED") == "COMPLETED"
        assert len(agent.ran) == 2


async def test_a_handoff_requested_through_one_follower_is_accepted_through_another(
    tmp_path: Path, url: str
) -> None:
    """Handoffs run on the leader: requested, accepted and completed through the replicas
    the two agents use, seen by the leader as one handoff."""
    h = pb.handoff_pb2
    async with (
        _three(tmp_path, url) as (leader, f1, f2),
        apiary.Client(str(f1.grpc_address), agent_id="alice") as alice,
        apiary.Client(str(f2.grpc_address), agent_id="bob") as bob,
    ):
        for client, agent_id in ((alice, "alice"), (bob, "bob")):
            agent = descriptor(agent_id, capabilities=["review"])
            reply = await client.registry.RegisterAgent(
                pb.registry_pb2.RegisterAgentRequest(agent=agent)
            )
            assert reply.accepted, reply.reason
        await _until(
            lambda: all(leader.registry.known(a) is not None for a in ("alice", "bob")),
            "the leader knows both agents",
        )
        await alice.handoff.RequestHandoff(
            h.HandoffRequest(
                request_id="h-1", from_agent="alice", to_agent="bob", reason="review it",
                context_snapshot=b'{"pr": 7}', capabilities_required=["review"],
                timeout=seconds_duration(60),
            )
        )  # fmt: skip
        pending = await bob.handoff.GetPendingHandoffs(h.GetPendingHandoffsRequest(agent_id="bob"))
        assert [p.request_id for p in pending.pending_requests] == ["h-1"]
        await bob.handoff.AcceptHandoff(h.HandoffResponse(request_id="h-1", accepted=True))
        done = await alice.handoff.CompleteHandoff(
            h.CompleteHandoffRequest(request_id="h-1", status=h.COMPLETED)
        )
        assert done.success, done.message
        assert leader.handoffs is not None
        found = await leader.handoffs.get("h-1", caller="alice")
        assert (found.state, found.to_agent) == ("COMPLETED", "bob")


async def test_a_negotiation_opened_through_one_follower_goes_on_through_another(
    tmp_path: Path, url: str
) -> None:
    """Negotiations run on the leader: opened, proposed, countered and evaluated through
    the two followers, decided there once; its artifacts read through either."""
    n = pb.negotiation_pb2
    async with (
        _three(tmp_path, url, OPERATORS) as (leader, f1, f2),
        apiary.Client(str(f1.grpc_address)) as one,
        apiary.Client(str(f2.grpc_address)) as two,
    ):
        for client, agent_id in ((one, "frontend"), (two, "graphql")):
            reply = await client.registry.RegisterAgent(
                pb.registry_pb2.RegisterAgentRequest(agent=descriptor(agent_id))
            )
            assert reply.accepted, reply.reason
        await _until(
            lambda: all(leader.registry.known(a) for a in ("frontend", "graphql")),
            "the leader knows both agents",
        )
        await one.negotiation.Open(
            n.NegotiationOpen(
                negotiation_id="neg-1", topic="/api/v3/orders",
                participants=["frontend", "graphql"], intensity=pb.common_pb2.HIGH,
                debate_timeout=Duration(seconds=300), correlation_id="neg-1",
            )
        )  # fmt: skip
        await two.negotiation.Propose(
            n.Proposal(negotiation_id="neg-1", from_agent="frontend",
                       content_type="application/json", payload=b'{"fields": ["id"]}')
        )  # fmt: skip
        await one.negotiation.Counter(
            n.CounterProposal(negotiation_id="neg-1", from_agent="graphql",
                              content_type="application/json", payload=b'{"fields": ["n"]}')
        )  # fmt: skip
        await two.negotiation.Evaluate(
            n.Evaluation(negotiation_id="neg-1", from_agent="frontend", confidence_score=0.95)
        )
        assert leader.negotiations is not None
        assert (await leader.negotiations.get("neg-1")).state == "DECIDED"
        listed = await one.activity.ListArtifacts(
            pb.activity_pb2.ListArtifactsRequest(negotiation_id="neg-1")
        )
        assert "decision" in {item.kind for item in listed.items}
        async with apiary.Client(str(f2.grpc_address), metadata=dict(AUTH)) as operator:
            view = await operator.negotiation_operator.Get(
                pb.apiary_pb2.GetNegotiationRequest(negotiation_id="neg-1")
            )
        assert view.state == "DECIDED"


async def test_a_room_proposal_submitted_through_one_follower_is_read_through_another(
    tmp_path: Path, url: str
) -> None:
    """Negotiation rooms run on the leader."""
    nr = pb.negotiation_room_pb2
    async with (
        _three(tmp_path, url, OPERATORS) as (leader, f1, f2),
        apiary.Client(str(f1.grpc_address), agent_id="producer") as one,
        apiary.Client(str(f2.grpc_address)) as two,
    ):
        for agent_id in ("producer", "critic"):
            reply = await one.registry.RegisterAgent(
                pb.registry_pb2.RegisterAgentRequest(agent=descriptor(agent_id))
            )
            assert reply.accepted, reply.reason
        await _until(
            lambda: all(leader.registry.known(a) for a in ("producer", "critic")),
            "the leader knows both agents",
        )
        proposal = nr.NegotiationProposal(
            artifact_type=nr.CODE, artifact_id="art-1", artifact=b"def f(): return 1\n",
            artifact_content_type="text/x-python", requested_critics=["critic"],
            negotiation_room_id="room-1",
        )  # fmt: skip
        await one.negotiation_room.SubmitProposal(nr.SubmitProposalRequest(proposal=proposal))
        found = await two.negotiation_room_query.GetProposal(
            pb.apiary_pb2.GetRoomProposalRequest(artifact_id="art-1")
        )
        assert (found.proposal.artifact_id, found.state) == ("art-1", "OPEN")


async def _agent_state(address: str, agent_id: str) -> tuple[str, str]:
    """The agent's state through DiscoveryService at `address`: (GetAgent, ListAgents)."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb.apiary_pb2_grpc.DiscoveryServiceStub(channel)
        one = await stub.GetAgent(pb.apiary_pb2.GetAgentRequest(agent_id=agent_id))
        listed = await stub.ListAgents(pb.apiary_pb2.ListAgentsRequest())
    (found,) = [a.state for a in listed.agents if a.descriptor.agent_id == agent_id]
    return one.state, found


async def _metrics(replica: Coordinator) -> str:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://{replica.http_address}/metrics") as response,
    ):
        assert response.status == 200
        return await response.text()


async def test_agent_states_read_through_any_replica_are_the_leaders(
    tmp_path: Path, url: str
) -> None:
    """The lifecycle of an agent streaming on one follower is on the leader: DiscoveryService
    on every replica shows it (RUNNING its task, then SUSPENDED by an operator through the
    other follower); /metrics shows the Scheduler's figures on the leader only."""
    async with _three(tmp_path, url) as (leader, f1, f2):
        assert leader.scheduler is not None and f2.scheduler is not None
        lifecycles = leader.scheduler.lifecycles
        agent = Holder(coordinator=str(f1.grpc_address))
        async with (
            _running(agent),
            apiary.Client(str(f2.grpc_address), agent_id="app") as client,
        ):
            handle = await client.submit_task("holder", {"n": 1}, scope=SCOPE, task_id="t-s")
            await asyncio.wait_for(agent.started.wait(), WAIT_S)
            await _until(lambda: str(lifecycles.state("holder")) == "RUNNING", "running")
            assert f2.scheduler.lifecycles.state("holder") is None  # (idle off the leader)
            for replica in (leader, f1, f2):
                assert await _agent_state(str(replica.grpc_address), "holder") == (
                    "RUNNING", "RUNNING",
                )  # fmt: skip
            async with grpc.aio.insecure_channel(str(f2.grpc_address)) as channel:
                control = pb.apiary_pb2_grpc.AgentControlServiceStub(channel)
                request = pb.apiary_pb2.AgentControlRequest(agent_id="holder", reason="test")
                assert (await control.Suspend(request)).state == "SUSPENDED"
            for replica in (f1, f2):
                assert await _agent_state(str(replica.grpc_address), "holder") == (
                    "SUSPENDED", "SUSPENDED",
                )  # fmt: skip
            assert handle.task_id == "t-s"
        leading, following = await _metrics(leader), await _metrics(f1)
        assert "apiary_cluster_leader 1.0" in leading
        assert "apiary_cluster_leader 0.0" in following
        for family in ("apiary_scheduler_tasks", "apiary_activity_buffer_entries"):
            assert f"# TYPE {family} gauge" in leading
            assert f"# TYPE {family} " not in following
        assert "# TYPE apiary_router_inbound_queue_depth gauge" in following  # (its own)
