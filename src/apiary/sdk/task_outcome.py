"""How a task attempt's end reaches the coordinator (docs/scheduler.md, "Results"): the
outcome of a handler (`Outcome`), in the FULFILLED or FAILED ACK's note when it fits (an ACK
carries at most 4 KB), else through TaskQueryService.CompleteTask first (`complete`), after
which the ACK settles the DATA message only. The TaskRunner (sdk/tasks.py) decides the
outcome and sends the ACK.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Final

from apiary.core.envelope import Ack, AckStage, Envelope
from apiary.core.envelope_rules import PayloadLimits
from apiary.core.limits import DEFAULT_LIMITS
from apiary.core.tasks.result import note_for, result_text
from apiary.errors import (
    AlreadyCompletedError,
    ApiaryError,
    ForcedPreemptionError,
    OversizePayloadError,
    UnimplementedError,
)
from apiary.sdk import errors
from apiary.sdk.connection import Connection
from apiary.wire import pb
from apiary.wire.convert import ack_to_json

log = logging.getLogger("apiary.sdk.tasks")

YIELDED: Final = "yielded"
TERMINATED: Final = "terminated"
MESSAGE_BYTES: Final = DEFAULT_LIMITS.text_bytes
"""A failure's message at most (CompleteTask's `message` is free text)."""
NOTE_BYTES: Final = 1024
"""An ACK's note at most when its outcome went through CompleteTask."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a task attempt ended: the ACK's stage, code and note; `result` the JSON text of
    a result that goes through CompleteTask (None: the note carries it, if anything)."""

    stage: AckStage
    code: str = ""
    note: str = ""
    result: str | None = None


def forced_outcome(command: str) -> tuple[AckStage, str, str]:
    """The ACK of a task stopped by forced preemption (`terminate` or `kill`)."""
    if command == "kill":
        return AckStage.FAILED, ForcedPreemptionError.code, "killed"
    return AckStage.FULFILLED, "", TERMINATED


def result_outcome(env: Envelope, value: object) -> Outcome:
    """The FULFILLED outcome of a handler's return value (core/tasks/result.py): in the
    ACK's note when it fits, else as JSON text for CompleteTask. A value that is not JSON
    fails the task instead of being lost."""
    try:
        note = note_for(value)
    except (TypeError, ValueError) as exc:
        return Outcome(AckStage.FAILED, "internal_error", f"the task's result is not JSON: {exc}")
    if fits(env, AckStage.FULFILLED, "", note):
        return Outcome(AckStage.FULFILLED, "", note)
    return Outcome(AckStage.FULFILLED, "", "", result_text(value))


def fits(env: Envelope, stage: AckStage, code: str, note: str) -> bool:
    """Whether an ACK of `env` with this note is within the ACK payload limit (4 KB)."""
    size = len(ack_to_json(Ack(env.message_id, stage, code, note)))
    return size <= PayloadLimits().acknowledgement


async def complete(
    agent: Connection, task_id: str, outcome: Outcome, attempt: int = 0
) -> tuple[AckStage, str, str]:
    """Report an outcome too large for an ACK through CompleteTask; the ACK to send after
    it: the outcome's stage and code with an empty note, or FAILED with why the coordinator
    refused it (oversize_payload: the task failed with it already). `attempt` (the
    dispatch's) lets the coordinator refuse it when the task was handed out again since."""
    stage, code = outcome.stage, outcome.code
    failed = stage is not AckStage.FULFILLED
    request = pb.apiary_pb2.CompleteTaskRequest(
        task_id=task_id, agent_id=agent.agent_id,
        result_json="" if failed else outcome.result or "",
        error_code=code if failed else "", message=clip(outcome.note, MESSAGE_BYTES),
        attempt=attempt,
    )  # fmt: skip
    stub = pb.apiary_pb2_grpc.TaskQueryServiceStub(agent.channel)
    try:
        await errors.call(lambda: stub.CompleteTask(request))
    except AlreadyCompletedError:
        pass  # it ended meanwhile (forced preemption): the ACK settles the message
    except UnimplementedError:  # a coordinator without CompleteTask: the ACK alone
        return AckStage.FAILED, OversizePayloadError.code, clip(_too_large(), NOTE_BYTES)
    except ApiaryError as exc:  # refused (oversize_payload: the task failed with it)
        log.warning("task %s: its outcome was refused: %s", task_id, exc)
        return AckStage.FAILED, exc.code, clip(exc.message, NOTE_BYTES)
    return stage, code, ""


def _too_large() -> str:
    return (
        "the task's result does not fit in an ACK (at most "
        f"{PayloadLimits().acknowledgement} bytes) and this coordinator has no CompleteTask"
    )


_CONTROL: Final = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
"""What free text may not hold (core/limits.py, TEXT): shown as `?` in a message."""


def clip(text: str, limit: int) -> str:
    """`text` as free text (control characters but tab and line breaks shown as `?`) cut to
    at most `limit` UTF-8 bytes (on a character boundary)."""
    data = _CONTROL.sub("?", text).encode(errors="replace")
    return data[:limit].decode(errors="ignore")
