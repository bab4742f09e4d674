"""Apiary: a coordination server for process-isolated agents (the SW4RM protocol).

The agent SDK at the top level (imported on first use, so `import apiary.core...` stays light):

    import apiary

    class Echo(apiary.Agent):
        agent_id = "echo"

        async def on_data(self, msg: apiary.Message) -> str:
            await msg.reply(msg.json())
            return "echoed"

`apiary.Client` has typed clients for every service and submits tasks whose handles give
their results back (`await handle.result()`); exceptions are `apiary.errors`, a task's
outcome `TaskFailedError`, `TaskHeldError` and `TaskTimeoutError`. `apiary.RuntimeClient`
drives the runtime control plane (sessions, threads, turns) over the HTTP port.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from apiary.core.envelope import Ack, AckStage, Envelope, MessageType
    from apiary.errors import ApiaryError
    from apiary.sdk.agent import Agent, Message, Rejected
    from apiary.sdk.client import Client
    from apiary.sdk.connection import Connection, Delivery
    from apiary.sdk.errors import TaskFailedError, TaskHeldError, TaskTimeoutError
    from apiary.sdk.handoff import Handoff, HandoffTicket
    from apiary.sdk.runtime import RuntimeClient
    from apiary.sdk.scheduler import SchedulerClient
    from apiary.sdk.task_handle import TaskHandle, TaskStatus
    from apiary.sdk.tasks import Preempted, TaskContext, current_task
    from apiary.sdk.workspace import Workspace

_EXPORTS = {
    "Ack": "apiary.core.envelope",
    "AckStage": "apiary.core.envelope",
    "Envelope": "apiary.core.envelope",
    "MessageType": "apiary.core.envelope",
    "ApiaryError": "apiary.errors",
    "Agent": "apiary.sdk.agent",
    "Message": "apiary.sdk.agent",
    "Rejected": "apiary.sdk.agent",
    "Client": "apiary.sdk.client",
    "Connection": "apiary.sdk.connection",
    "Delivery": "apiary.sdk.connection",
    "Handoff": "apiary.sdk.handoff",
    "HandoffTicket": "apiary.sdk.handoff",
    "RuntimeClient": "apiary.sdk.runtime",
    "SchedulerClient": "apiary.sdk.scheduler",
    "TaskFailedError": "apiary.sdk.errors",
    "TaskHeldError": "apiary.sdk.errors",
    "TaskTimeoutError": "apiary.sdk.errors",
    "TaskHandle": "apiary.sdk.task_handle",
    "TaskStatus": "apiary.sdk.task_handle",
    "Preempted": "apiary.sdk.tasks",
    "TaskContext": "apiary.sdk.tasks",
    "current_task": "apiary.sdk.tasks",
    "Workspace": "apiary.sdk.workspace",
}

__all__ = [
    "Ack",
    "AckStage",
    "Agent",
    "ApiaryError",
    "Client",
    "Connection",
    "Delivery",
    "Envelope",
    "Handoff",
    "HandoffTicket",
    "Message",
    "MessageType",
    "Preempted",
    "Rejected",
    "RuntimeClient",
    "SchedulerClient",
    "TaskContext",
    "TaskFailedError",
    "TaskHandle",
    "TaskHeldError",
    "TaskStatus",
    "TaskTimeoutError",
    "Workspace",
    "__version__",
    "current_task",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'apiary' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
