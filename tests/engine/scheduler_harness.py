"""What the Scheduler's engine tests share: an operator, a scope, and the steps of a task."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from apiary.core.envelope import AckStage
from apiary.engine.operators import OperatorEntry, token_digest
from apiary.engine.scheduler.scheduler import Scheduler, Submission
from apiary.testing.engine import EngineHarness

ALICE = OperatorEntry("alice", token_digest("alice-token"), ("admin",))
SCOPE = "repo:app path:src/a.py"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "scheduler.md"


def _sched(h: EngineHarness) -> Scheduler:
    return h.engine.scheduler


async def _ready(h: EngineHarness, agent_id: str, **options: Any) -> None:
    await h.register(agent_id, **options)
    await _sched(h).agent_ready(agent_id)


async def _submit(
    h: EngineHarness, task_id: str, agent_id: str = "worker", priority: object = None,
    scope: str = SCOPE, **fields: Any,
) -> Any:  # fmt: skip
    return await _sched(h).submit(
        Submission(agent_id, task_id, priority, json.dumps({"task": task_id}).encode(),
                   scope=scope, **fields)
    )  # fmt: skip


async def _inbox(h: EngineHarness, agent_id: str) -> list[dict[str, Any]]:
    return [m for m in await h.inbox_payloads(agent_id) if m["type"] != "NOTIFICATION"]


async def _finish(h: EngineHarness, task_id: str, note: str = "done") -> None:
    task = _sched(h).get(task_id)
    assert task is not None and task.message_id
    await h.ack(task.agent_id, task.message_id, AckStage.READ)
    await h.ack(task.agent_id, task.message_id, AckStage.FULFILLED, note=note)


async def _state(h: EngineHarness, task_id: str) -> str:
    return (await _sched(h).find(task_id)).state
