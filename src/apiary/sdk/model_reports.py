"""Model and reasoning progress from inside a task (`TaskContext.model`): what the agent asks
of a model, the answer as it streams, its end, and a summary of its reasoning, reported to
the coordinator as the task's holder (the Scheduler's command channel, as `progress`). For a
runtime turn's task (or an agent task's run) each report is an event of the thread:
`model.requested`, `model.delta`, `model.completed`, `model.failed`, `reasoning.summary`
(docs/control-plane.md).

    request = await task.model.requested("gpt-x", provider="acme", input_tokens=812)
    async for piece in stream:
        await task.model.delta(request, piece)       # long pieces are sent in several
    await task.model.completed(request, finish_reason="stop", output_tokens=240)
    await task.model.reasoning_summary("Checked the three call sites first.")

A report the coordinator refuses raises the ApiaryError naming the field (a summary past
16 KiB, a task that is not a turn's or an agent task's run, one that has ended).
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from apiary.core.runtime.events import RuntimeEventType
from apiary.core.runtime.model_reports import chunks

_T = RuntimeEventType
Command = Callable[..., Awaitable[None]]


class ModelReporter:
    """The model and reasoning reports of one task attempt (module docstring)."""

    def __init__(self, command: Command) -> None:
        self._command = command
        self._next_index: dict[str, int] = {}
        """Each model request's next delta index."""

    async def _report(self, event: str, request_id: str, **fields: Any) -> None:
        given = {key: value for key, value in fields.items() if value is not None}
        if request_id:
            given["modelRequestId"] = request_id
        await self._command("report", event=event, **given)

    async def requested(
        self, model: str, *, request_id: str = "", provider: str = "", purpose: str = "",
        input_tokens: int | None = None,
    ) -> str:  # fmt: skip
        """A request to `model` starts; its id (`request_id`, or a new one) names it in the
        reports that follow."""
        chosen = request_id or str(uuid.uuid4())
        self._next_index[chosen] = 0
        await self._report(
            _T.MODEL_REQUESTED, chosen, model=model, provider=provider or None,
            purpose=purpose or None, inputTokens=input_tokens,
        )  # fmt: skip
        return chosen

    async def delta(self, request_id: str, text: str) -> None:
        """A piece of the request's answer, in order (sent as several deltas when it is
        longer than one carries)."""
        for piece in chunks(text):
            index = self._next_index.get(request_id, 0)
            await self._report(_T.MODEL_DELTA, request_id, index=index, text=piece)
            self._next_index[request_id] = index + 1

    async def completed(
        self, request_id: str, *, model: str = "", finish_reason: str = "",
        input_tokens: int | None = None, output_tokens: int | None = None,
        output_bytes: int | None = None,
    ) -> None:  # fmt: skip
        """The request's answer is complete (its usage when known)."""
        usage = {"inputTokens": input_tokens, "outputTokens": output_tokens}
        shown = {key: value for key, value in usage.items() if value is not None}
        await self._report(
            _T.MODEL_COMPLETED, request_id, model=model or None,
            finishReason=finish_reason or None, usage=shown or None, outputBytes=output_bytes,
        )  # fmt: skip
        self._next_index.pop(request_id, None)

    async def failed(self, request_id: str, error_code: str, message: str = "") -> None:
        """The request failed (`error_code`: the provider's or the agent's own)."""
        await self._report(
            _T.MODEL_FAILED, request_id, errorCode=error_code, message=message or None
        )
        self._next_index.pop(request_id, None)

    async def reasoning_summary(self, summary: str, *, request_id: str = "") -> None:
        """A summary of the agent's reasoning (of one model request when named)."""
        await self._report(_T.REASONING_SUMMARY, request_id, summary=summary)
