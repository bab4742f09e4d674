"""Model and reasoning progress from SDK agents, against a real coordinator (the agent over
gRPC, the application over HTTP): an agent reports model.requested, model.delta,
model.completed and reasoning.summary from inside a turn's task (or an agent task's run),
and they are events of the thread, valid against the contract's event schema; long deltas
are sent in pieces; bad reports are refused naming the field; an agent that does not hold
the task is refused."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from apiary.core.envelope import MessageType
from apiary.core.runtime.model_reports import DELTA_BYTES, SUMMARY_BYTES
from apiary.errors import ApiaryError
from apiary.sdk.agent import Agent
from apiary.sdk.tasks import TaskContext, TaskRunner
from apiary.server.coordinator import Coordinator
from tests.server.runtime_harness import WAIT_S, RuntimeHttp, session_events

ANSWER = "é" + "x" * DELTA_BYTES  # more than one delta carries


class Thinker:
    """Reports a model request, its answer, its end and a reasoning summary, then the
    refusals it meets; holds the task until released when the input says `hold`."""

    def __init__(self) -> None:
        self.refusals: list[tuple[str, str]] = []
        self.holding = asyncio.Event()
        self.release = asyncio.Event()
        self.task_id = ""

    async def handle(self, task: TaskContext) -> object:
        given = task.json()["input"]
        self.task_id = task.task_id
        if given == "hold":
            self.holding.set()
            await self.release.wait()
            return "held"
        request = await task.model.requested("m-large", provider="acme", input_tokens=12)
        await task.model.delta(request, ANSWER)
        await task.model.completed(request, finish_reason="stop", output_tokens=3)
        await task.model.reasoning_summary("checked the call sites", request_id=request)
        for bad in (
            lambda: task.model.reasoning_summary("y" * (SUMMARY_BYTES + 1)),
            lambda: task.model.requested(""),
            lambda: task.model.completed("", model="m"),
            lambda: _raw(task, event="model.guessed", modelRequestId="r"),
            lambda: _raw(task, event="model.delta", modelRequestId="r", index=-1, text="t"),
        ):
            try:
                await bad()
            except ApiaryError as exc:
                self.refusals.append((exc.code, str(exc.details.get("field"))))
        return {"answer": len(ANSWER)}


async def _raw(task: TaskContext, **fields: Any) -> None:
    """A report sent as it stands (the SDK's methods send only well-formed ones)."""
    body = {"command": "report", "task_id": task.task_id, **fields}
    env = task.agent.envelope(body, message_type=MessageType.CONTROL,
                              correlation_id=task.task_id)  # fmt: skip
    await task.agent.send_envelope(env, "scheduler")


@asynccontextmanager
async def running_thinker(coordinator: Coordinator, agent_id: str) -> AsyncIterator[Thinker]:
    thinker = Thinker()
    async with Agent(agent_id, coordinator=str(coordinator.grpc_address)) as agent:
        job = asyncio.create_task(TaskRunner(agent, thinker.handle).run())
        try:
            yield thinker
        finally:
            job.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await job


def _reports(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["type"].startswith(("model.", "reasoning."))]


async def test_a_turns_model_and_reasoning_progress_are_events_of_its_thread(
    coordinator: Coordinator, runtime: RuntimeHttp
) -> None:
    async with running_thinker(coordinator, "thinker") as thinker:
        turn = await runtime.ok("submit_turn", agent_id="thinker", turn_id="t-1", input="go")
        await runtime.thread_status(turn["threadId"], "completed")
    assert thinker.refusals == [
        ("validation_error", "summary"), ("validation_error", "model"),
        ("validation_error", "modelRequestId"), ("validation_error", "event"),
        ("validation_error", "index"),
    ]  # fmt: skip
    events = await session_events(coordinator, turn["sessionId"])  # each schema-checked
    reports = _reports(events)
    assert [e["type"] for e in reports] == [
        "model.requested",
        "model.delta",
        "model.delta",
        "model.completed",
        "reasoning.summary",
    ]
    request_id = reports[0]["modelRequestId"]
    for event in reports:
        assert (event["threadId"], event["turnId"]) == (turn["threadId"], "t-1")
        assert event["taskId"] == turn["taskId"] and event["modelRequestId"] == request_id
    assert reports[0]["payload"] == {"model": "m-large", "provider": "acme", "inputTokens": 12}
    deltas = [e["payload"] for e in reports if e["type"] == "model.delta"]
    assert [d["index"] for d in deltas] == [0, 1]
    assert "".join(d["text"] for d in deltas) == ANSWER
    assert all(len(d["text"].encode()) <= DELTA_BYTES for d in deltas)
    assert reports[3]["payload"] == {"finishReason": "stop", "usage": {"outputTokens": 3}}
    assert reports[4]["payload"] == {"summary": "checked the call sites"}
    kinds = [e["type"] for e in events]
    assert kinds.index("reasoning.summary") < kinds.index("turn.completed")


async def test_an_agent_tasks_run_reports_on_its_task(
    coordinator: Coordinator, runtime: RuntimeHttp
) -> None:
    async with running_thinker(coordinator, "thinker"):
        created = await runtime.ok("create_task", agent_id="thinker", task_id="fix-1",
                                   input="go", start=True)  # fmt: skip
        done = await runtime.until(
            "get_task", lambda d: d["task"]["status"] == "completed", task_id="fix-1"
        )
    run_id = done["task"]["currentRunId"]
    reports = _reports(await session_events(coordinator, created["sessionId"]))
    assert len(reports) == 5
    for event in reports:
        assert (event["taskId"], event["runId"], event["attemptId"]) == ("fix-1", run_id,
                                                                           "fix-1#1")  # fmt: skip


async def test_only_the_agent_holding_the_task_reports_on_it(
    coordinator: Coordinator, runtime: RuntimeHttp
) -> None:
    address = str(coordinator.grpc_address)
    async with running_thinker(coordinator, "thinker") as thinker, Agent(
        "intruder", coordinator=address
    ) as intruder:  # fmt: skip
        turn = await runtime.ok("submit_turn", agent_id="thinker", input="hold")
        await asyncio.wait_for(thinker.holding.wait(), WAIT_S)
        body = {"command": "report", "task_id": turn["taskId"], "event": "reasoning.summary",
                "summary": "not mine"}  # fmt: skip
        env = intruder.envelope(body, message_type=MessageType.CONTROL,
                                correlation_id=turn["taskId"])  # fmt: skip
        with pytest.raises(ApiaryError) as refused:
            await intruder.send_envelope(env, "scheduler")
        assert refused.value.code == "permission_denied"
        thinker.release.set()
        await runtime.thread_status(turn["threadId"], "completed")
    events = await session_events(coordinator, turn["sessionId"])
    assert _reports(events) == []
