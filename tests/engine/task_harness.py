"""Scheduler steps the engine's task tests share: an agent made ready, a task submitted
(to an agent, or to a shared queue by `capability`/`agent_type`), read back and ACKed."""

from __future__ import annotations

import json
from typing import Any

from apiary.core.envelope import AckStage
from apiary.core.records import TaskRecord
from apiary.engine.scheduler.scheduler import Submission, SubmitResult
from apiary.testing.engine import EngineHarness


async def ready_agent(h: EngineHarness, agent_id: str, *capabilities: str, **options: Any) -> None:
    await h.register(agent_id, capabilities=list(capabilities), **options)
    await h.engine.scheduler.agent_ready(agent_id)


async def submit(h: EngineHarness, task_id: str, agent_id: str = "", **fields: Any) -> SubmitResult:
    """The task `{"task": task_id}` with its own scope unless `fields` name one."""
    fields.setdefault("scope", f"repo:{task_id}")
    params = json.dumps({"task": task_id}).encode()
    return await h.engine.scheduler.submit(Submission(agent_id, task_id, params=params, **fields))


async def task(h: EngineHarness, task_id: str) -> TaskRecord:
    return await h.engine.scheduler.find(task_id)


async def ack_task(h: EngineHarness, task_id: str, stage: AckStage, note: str = "") -> None:
    """The agent holding the task acknowledges its current dispatch."""
    held = await task(h, task_id)
    await h.ack(held.agent_id, held.message_id, stage, note=note)
