"""Message ACLs at admission (core/acl.py, `[router.acl]`): an agent's envelope its producer
may not send is refused like any refusal (permission_denied naming the field, a NACK, the DLQ)
and the decision is logged; ACKs and the coordinator's own messages pass."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from apiary.core.acl import AclPolicy, MessageGrant
from apiary.core.envelope import AckStage, MessageType
from apiary.engine.router.admission import Outbound
from apiary.engine.settings import RouterSettings
from apiary.testing.engine import EngineHarness, open_test_engine

ACL = AclPolicy(
    messages=(
        MessageGrant(("planner",), ("DATA",), ("coder",)),
        MessageGrant(("coder",), ("NOTIFICATION",), ("planner",)),
    )
)


@pytest.fixture
async def h() -> AsyncIterator[EngineHarness]:
    async with open_test_engine(RouterSettings(acl=ACL)) as harness:
        for agent in ("planner", "coder", "intruder"):
            await harness.register(agent)
        yield harness


async def _send(h: EngineHarness, producer: str, to: str, **fields: object) -> Outbound:
    env = h.envelope(producer, {"n": 1}, **fields)
    return Outbound(env, to, remote=True)


async def test_a_frame_is_admitted_member_by_member_against_the_grants(
    h: EngineHarness,
) -> None:
    allowed = await _send(h, "planner", "coder")
    wrong_type = await _send(h, "planner", "coder", message_type=MessageType.CONTROL)
    wrong_recipient = await _send(h, "planner", "intruder")
    stranger = await _send(h, "intruder", "coder")
    outcomes = await h.engine.router.send_many([allowed, wrong_type, wrong_recipient, stranger])
    assert [o.accepted for o in outcomes] == [True, False, False, False]
    fields = [o.error.details["field"] for o in outcomes[1:] if o.error is not None]
    assert fields == ["message_type", "recipient", "message_type"]
    assert {o.error.code for o in outcomes[1:] if o.error is not None} == {"permission_denied"}

    # Refused like any refusal: nothing stored, a NACK to the producer, counted, and no dead
    # letter (a refused envelope was never admitted).
    refused = [wrong_type, wrong_recipient, stranger]
    for item in refused:
        assert await h.store.messages.get(item.envelope.message_id) is None
    nacked = {
        p["ack_for_message_id"]
        for agent in ("planner", "intruder")
        for p in await h.inbox_payloads(agent)
        if p["type"] == "ACKNOWLEDGEMENT"
    }
    assert nacked == {item.envelope.message_id for item in refused}
    assert h.engine.router.stats.admission_refused == {"permission_denied": 3}
    assert await h.store.dlq.list() == []

    # Every decision is in the event log: the refusals as acl.denied (and message.rejected),
    # the admission as message.received.
    denied = await h.events("acl.denied")
    assert [(e.actor, e.details["message_type"], e.details["recipient"], e.details["field"])
            for e in denied] == [
        ("planner", "CONTROL", "coder", "message_type"),
        ("planner", "DATA", "intruder", "recipient"),
        ("intruder", "DATA", "coder", "message_type"),
    ]  # fmt: skip
    (received,) = [
        e for e in await h.events("message.received") if e.actor in ("planner", "intruder")
    ]
    assert received.details["message_id"] == allowed.envelope.message_id


async def test_acks_and_the_coordinators_own_messages_are_never_refused(
    h: EngineHarness,
) -> None:
    sent = await h.engine.router.send(await _send(h, "planner", "coder"))
    # coder has no grant to send anything to planner but NOTIFICATIONs: its ACK still passes.
    payload = json.dumps({"ack_for_message_id": sent.message_id, "ack_stage": "FULFILLED"})
    ack = h.envelope("coder", payload.encode(), message_type=MessageType.ACKNOWLEDGEMENT)
    (outcome,) = await h.engine.router.send_many([Outbound(ack, remote=True)])
    assert outcome.accepted
    assert (await h.message(sent.message_id)).state.value == "FULFILLED"
    # A request to one of the coordinator's own endpoints is its service's to authorize.
    control = h.envelope(
        "intruder", {"action": "status"}, message_type=MessageType.WORKTREE_CONTROL
    )
    (to_service,) = await h.engine.router.send_many([Outbound(control, "worktrees", remote=True)])
    assert to_service.error is None or to_service.error.code != "permission_denied"
    # What the coordinator produces itself (remote=False) is not an agent's to grant.
    internal = await h.send("intruder", "coder", {"n": 2})
    assert internal.accepted
    assert await h.events("acl.denied") == []
    assert (await h.ack("coder", internal.message_id, AckStage.READ)).accepted


async def test_without_grants_every_agent_may_send(h: EngineHarness) -> None:
    async with open_test_engine() as open_engine:
        await open_engine.register("a")
        await open_engine.register("b")
        env = open_engine.envelope("a", {"n": 1}, message_type=MessageType.CONTROL)
        (outcome,) = await open_engine.engine.router.send_many([Outbound(env, "b", remote=True)])
        assert outcome.accepted
