"""Correlation ids (RFC 11.1, 11.3): one id per flow, and UUIDv4 only when asked for.

By default a correlation_id is any non-empty string, as the other SDKs send ("wf123", the
RFC's own example). With `[router] strict_correlation_ids` every correlation_id is a UUIDv4:
agents' envelopes with another one are refused, the ids that become the correlation ids of
the coordinator's own messages are refused where they are given, and every message the
coordinator produces carries a UUIDv4.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest

from apiary.core.envelope import AckStage, Envelope, MessageType
from apiary.core.handoff_request import HandoffDraft
from apiary.core.ids import is_uuid4
from apiary.core.rooms.validation import ProposalDraft
from apiary.core.workflow.definition import NodeSpec, WorkflowSpec
from apiary.engine.hitl import HitlSettings
from apiary.engine.router.admission import Outbound
from apiary.engine.scheduler.scheduler import Submission
from apiary.engine.settings import RouterSettings
from apiary.errors import ApiaryError, ValidationError
from apiary.store.protocols import Store
from apiary.testing.engine import EngineHarness, open_test_engine

STRICT = RouterSettings(strict_correlation_ids=True)
SCOPE = "repo:app"
AGENTS = ("alice", "bob", "worker")


@pytest.fixture
async def strict() -> AsyncIterator[EngineHarness]:
    async with open_test_engine(STRICT, hitl=HitlSettings()) as harness:
        for agent in AGENTS:
            await harness.register(agent)
            await harness.engine.scheduler.agent_ready(agent)
        yield harness


@pytest.fixture
async def lenient() -> AsyncIterator[EngineHarness]:
    async with open_test_engine() as harness:
        for agent in AGENTS:
            await harness.register(agent)
            await harness.engine.scheduler.agent_ready(agent)
        yield harness


def _uuid() -> str:
    return str(uuid.uuid4())


async def _envelopes(store: Store, h: EngineHarness, agent: str) -> list[Envelope]:
    return [
        h.engine.router.codec.decode(m.envelope)
        for m in await store.messages.inbox(agent, 0, 10_000)
    ]


# --- agents' envelopes ------------------------------------------------------------------------


async def test_by_default_any_correlation_id_is_accepted(lenient: EngineHarness) -> None:
    outcome = await lenient.send("alice", "bob", {"n": 1}, correlation_id="wf123")
    assert outcome.accepted


@pytest.mark.conformance(
    "router.fields.correlation-id", "ids.correlation-id.uuid4", "envelope.correlation-id.uuid4"
)
async def test_strict_ids_refuse_an_envelope_whose_correlation_id_is_not_a_uuid4(
    strict: EngineHarness,
) -> None:
    h = strict
    env = h.envelope("alice", {"n": 1}, correlation_id="wf123")
    with pytest.raises(ValidationError) as caught:
        await h.send_env(env, "bob")
    assert caught.value.details["field"] == "correlation_id"
    assert "UUIDv4" in caught.value.message
    assert await h.store.messages.get(env.message_id) is None
    # The producer learns it from a NACK too, which cannot echo the bad id: it carries a
    # correlation id of its own.
    nacks = [
        e
        for e in await _envelopes(h.store, h, "alice")
        if e.message_type is MessageType.ACKNOWLEDGEMENT
    ]
    assert [json.loads(n.payload)["ack_for_message_id"] for n in nacks] == [env.message_id]
    assert is_uuid4(nacks[0].correlation_id)
    assert (await h.send("alice", "bob", {"n": 2}, correlation_id=_uuid())).accepted


@pytest.mark.conformance("router.fields.correlation-id", "envelope.correlation-id.uuid4")
async def test_strict_ids_hold_for_every_member_of_a_frame_and_for_acks(
    strict: EngineHarness,
) -> None:
    h = strict
    good = h.envelope("alice", {"n": 1})
    bad = h.envelope("alice", {"n": 2}, correlation_id="session-7")
    outcomes = await h.engine.router.send_many([Outbound(good, "bob"), Outbound(bad, "bob")])
    assert [o.accepted for o in outcomes] == [True, False]
    assert outcomes[1].error is not None
    assert outcomes[1].error.details["field"] == "correlation_id"
    # An ACK is an envelope like any other: its correlation_id is held to the same rule.
    ack = await h.ack("bob", good.message_id, AckStage.RECEIVED)
    assert ack.accepted
    payload = json.dumps({"ack_for_message_id": good.message_id, "ack_stage": "FULFILLED"}).encode()
    late = h.envelope(
        "bob", payload, message_type=MessageType.ACKNOWLEDGEMENT, correlation_id="wf123"
    )
    (refused,) = await h.engine.router.send_many([Outbound(late)])
    assert not refused.accepted and refused.error is not None
    assert refused.error.details["field"] == "correlation_id"
    assert (await h.message(good.message_id)).state.value == "RECEIVED"


# --- ids that become correlation ids ----------------------------------------------------------


def _diamond(workflow_id: str) -> WorkflowSpec:
    return WorkflowSpec(workflow_id, {"a": NodeSpec("a", "worker")})


def _draft(request_id: str) -> HandoffDraft:
    return HandoffDraft(
        request_id=request_id, from_agent="alice", to_agent="bob", reason="review",
        context_snapshot=b"{}", snapshot_content_type="application/json", timeout_s=30.0,
    )  # fmt: skip


def _proposal(room_id: str) -> ProposalDraft:
    return ProposalDraft(
        "PLAN", "", "alice", b'{"steps": []}', "application/json", ["bob"], room_id
    )


async def _negotiation(h: EngineHarness, negotiation_id: str) -> Any:
    return await h.engine.negotiations.open(
        negotiation_id=negotiation_id, topic="api", participants=["alice", "bob"],
        intensity="MEDIUM", opened_by="scheduler",
    )  # fmt: skip


FLOW_IDS = {
    "task_id": lambda h, bad: h.engine.scheduler.submit(
        Submission("worker", bad, None, b"{}", "application/json", SCOPE)
    ),
    "correlation_id": lambda h, bad: h.engine.scheduler.submit(
        Submission("worker", _uuid(), None, b"{}", "application/json", SCOPE, correlation_id=bad)
    ),
    "workflow_id": lambda h, bad: h.engine.workflows.create(_diamond(bad)),
    "negotiation_id": _negotiation,
    "proposal.negotiation_room_id": lambda h, bad: h.engine.rooms.submit(_proposal(bad), "alice"),
    "request_id": lambda h, bad: h.engine.handoffs.request(_draft(bad), caller="alice"),
    "hitl": lambda h, bad: h.engine.hitl.open(
        "SECURITY_APPROVAL", {"why": "test"}, requested_by="alice", correlation_id=bad
    ),
}


@pytest.mark.conformance("ids.correlation-id.uuid4")
@pytest.mark.parametrize("field", sorted(FLOW_IDS))
async def test_strict_ids_refuse_a_flow_id_that_is_not_a_uuid4_where_it_is_given(
    strict: EngineHarness, field: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        await FLOW_IDS[field](strict, "wf123")
    expected = "correlation_id" if field == "hitl" else field
    assert caught.value.details["field"] == expected
    assert caught.value.details["value"] == "wf123"
    # The same request with a UUIDv4 goes through.
    await FLOW_IDS[field](strict, _uuid())


@pytest.mark.parametrize("field", sorted(FLOW_IDS))
async def test_by_default_flow_ids_are_free_strings(lenient: EngineHarness, field: str) -> None:
    await FLOW_IDS[field](lenient, f"{field}-7")


# --- the coordinator's own messages -----------------------------------------------------------


@pytest.mark.conformance(
    "router.fields.correlation-id", "ids.correlation-id.uuid4", "envelope.correlation-id.uuid4"
)
async def test_under_strict_ids_every_message_of_the_coordinator_carries_a_uuid4(
    strict: EngineHarness,
) -> None:
    h = strict
    # Join notices and the directory (done by the fixture), a task's dispatch, a workflow's
    # node task, a negotiation's fanout, a room's notices, a handoff's notices, a HITL
    # invocation, a NACK and a forwarded ACK.
    await h.engine.scheduler.submit(
        Submission("worker", _uuid(), None, b"{}", "application/json", SCOPE)
    )
    await h.engine.workflows.create(_diamond(_uuid()))
    await _negotiation(h, _uuid())
    await h.engine.rooms.submit(_proposal(_uuid()), "alice")
    await h.engine.handoffs.request(_draft(_uuid()), caller="alice")
    await h.engine.hitl.open("SECURITY_APPROVAL", {"why": "x"}, requested_by="alice")
    refused = h.envelope("alice", {"n": 1}, content_length=1)
    with pytest.raises(ApiaryError):
        await h.send_env(refused, "bob")
    sent = await h.send("alice", "bob", {"n": 2})
    await h.ack("bob", sent.message_id, AckStage.FULFILLED)
    await h.connect("bob")  # its directory, and heartbeats from now on
    await h.engine.presence.tick()

    own = [
        e
        for agent in AGENTS
        for e in await _envelopes(h.store, h, agent)
        if e.producer_id not in AGENTS
    ]
    kinds = {e.message_type for e in own}
    assert {MessageType.DATA, MessageType.NOTIFICATION, MessageType.ACKNOWLEDGEMENT,
            MessageType.NEGOTIATION, MessageType.HEARTBEAT} <= kinds, kinds  # fmt: skip
    assert [e.correlation_id for e in own if not is_uuid4(e.correlation_id)] == []
    # ... and none of them was refused on its way in (only alice's bad envelope was).
    rejected = await h.events("message.rejected")
    assert [e.details["message_id"] for e in rejected] == [refused.message_id]


async def test_a_workflows_node_tasks_carry_the_workflow_id_as_correlation_id(
    lenient: EngineHarness,
) -> None:
    h = lenient
    spec = await h.engine.workflows.create(_diamond("wf-orders"))
    await h.engine.workflows.start(spec.workflow_id)
    # A task of its own, held back behind the node task by the conflict gate: its deferral
    # notice is its own flow's.
    alone = await h.engine.scheduler.submit(
        Submission("bob", "t-alone", None, b"{}", "application/json", "repo:other")
    )
    assert alone.accepted and alone.reason.startswith("queued")
    (dispatch,) = [
        e for e in await _envelopes(h.store, h, "worker") if e.message_type is MessageType.DATA
    ]
    (deferred,) = [
        e
        for e in await _envelopes(h.store, h, "bob")
        if json.loads(e.payload).get("event") == "task_deferred"
    ]
    # The node task's id names workflow, node and attempt; its messages are the workflow's.
    assert (dispatch.correlation_id, deferred.correlation_id) == ("wf-orders", "t-alone")
    node_task = next(t for t in await h.store.tasks.list() if t.task_id != "t-alone")
    assert node_task.task_id.startswith("workflow:wf-orders:a:")
    assert (node_task.correlation_id, node_task.flow_id) == ("wf-orders", "wf-orders")
    assert replace(node_task, correlation_id="").flow_id == node_task.task_id
