"""The Scheduler's own DATA envelopes (docs/scheduler.md, "Events of a task's messages"):
the task's events record its dispatch's admission and the ACKs that commit with its
transitions, one event for both; a task under a flow of its own keeps its messages' events
under that flow; the params are checked at submission and the dispatch is not validated
again."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from apiary.core.envelope import AckStage, Envelope
from apiary.core.events import Event
from apiary.engine.router import admission
from apiary.engine.scheduler.scheduler import Submission
from apiary.errors import ValidationError
from apiary.testing.engine import EngineHarness, open_test_engine
from tests.engine.scheduler_harness import SCOPE, _ready, _sched, _submit


@pytest.fixture
async def h() -> AsyncIterator[EngineHarness]:
    async with open_test_engine() as harness:
        yield harness


def _of(events: list[Event], message_id: str) -> list[tuple[str, dict[str, Any]]]:
    """The message and task events that name `message_id` (a failed one's `dlq.added`
    aside)."""
    return [
        (e.event_type, e.details) for e in events
        if e.details.get("message_id") == message_id and e.event_type.startswith(_KINDS)
    ]  # fmt: skip


_KINDS = ("message.", "task.", "idempotency.")


async def _run(h: EngineHarness, task_id: str, stage: AckStage, **fields: Any) -> str:
    """Submit `task_id`, READ it and end it with `stage`; its dispatch's message id."""
    assert (await _submit(h, task_id, **fields)).accepted
    message_id = (await _sched(h).find(task_id)).message_id
    await h.ack("worker", message_id, AckStage.READ)
    code = "" if stage is AckStage.FULFILLED else "LINT_FAILED"
    await h.ack("worker", message_id, stage, code, '"done"')
    return message_id


@pytest.mark.conformance("observability.log.every-transition")
@pytest.mark.parametrize("stage", [AckStage.FULFILLED, AckStage.FAILED], ids=lambda s: s.name)
async def test_a_tasks_events_record_its_dispatchs_message_states(
    h: EngineHarness, stage: AckStage
) -> None:
    await _ready(h, "worker")
    message_id = await _run(h, "t1", stage)
    end, state = ("task.completed", "FULFILLED")
    if stage is AckStage.FAILED:
        end, state = ("task.failed", "FAILED")
    logged = _of(await h.events(), message_id)
    assert [kind for kind, _ in logged] == ["task.dispatched", "task.running", end]
    dispatched, running, ended = (details for _, details in logged)
    assert (dispatched["message_state"], dispatched["message_type"], dispatched["token"]) == (
        "RECEIVED", "DATA", "task:t1:1",
    )  # fmt: skip
    assert dispatched["lane"] == "STANDARD"
    moves = [(d["message_from"], d["message_state"], d["message_input"]) for d in (running, ended)]
    assert moves == [("RECEIVED", "READ", "ACK_READ"), ("READ", state, f"ACK_{state}")]
    assert ended.get("message_error_code", "") == ("" if state == "FULFILLED" else "LINT_FAILED")
    # Nothing else records them: no message.* nor idempotency.* event of the dispatch.
    assert not [e for e in await h.events() if e.event_type.startswith("idempotency.")]
    stored = await h.message(message_id)
    assert stored.state.value == state  # (the state the last event names)


async def test_a_task_under_a_flow_of_its_own_keeps_its_messages_events(
    h: EngineHarness,
) -> None:
    """Its task events are found under its id, its messages' under the flow: each keeps
    its own events there (a workflow run's history lists its nodes' messages)."""
    await _ready(h, "worker")
    message_id = await _run(h, "t1", AckStage.FULFILLED, correlation_id="flow-1")
    events = await h.events()
    flow = [(e.event_type, e.details) for e in events if e.correlation_id == "flow-1"]
    assert [kind for kind, _ in flow] == ["message.received", "message.state", "message.state"]
    assert {d["message_id"] for _, d in flow} == {message_id}
    assert [d["to"] for kind, d in flow if kind == "message.state"] == ["READ", "FULFILLED"]
    tasks = [e.details for e in events if e.correlation_id == "t1"]
    assert [d["state"] for d in tasks] == ["QUEUED", "DISPATCHED", "RUNNING", "COMPLETED"]
    assert not [d for d in tasks if "message_state" in d]


@pytest.mark.parametrize(
    ("params", "content_type"),
    [(b"{not json", "application/json"), (b"\xff\xfe", "text/plain"), (b"x", "no type")],
    ids=["json", "text", "content-type"],
)
async def test_params_its_dispatch_would_not_pass_are_refused_at_submission(
    h: EngineHarness, params: bytes, content_type: str
) -> None:
    await _ready(h, "worker", modalities_supported=["*/*"])
    with pytest.raises(ValidationError) as caught:
        await _sched(h).submit(
            Submission("worker", "t1", None, params, scope=SCOPE, content_type=content_type)
        )
    field = "content_type" if content_type == "no type" else "params"
    assert caught.value.details["field"] == field
    assert await h.store.tasks.list() == []


async def test_a_dispatch_is_admitted_without_being_validated_again(
    h: EngineHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The router validates what comes in (the agent's ACKs) and not the envelope the
    Scheduler built from params checked at submission."""
    validated: list[Envelope] = []
    validate = admission.validate_envelope

    def spy(env: Envelope, **settings: Any) -> None:
        validated.append(env)
        validate(env, **settings)

    monkeypatch.setattr(admission, "validate_envelope", spy)
    await _ready(h, "worker")
    message_id = await _run(h, "t1", AckStage.FULFILLED)
    ids = {env.message_id for env in validated}
    assert message_id not in ids
    acks = [json.loads(env.payload)["ack_for_message_id"] for env in validated]
    assert acks.count(message_id) == 2  # (the READ and the FULFILLED)
