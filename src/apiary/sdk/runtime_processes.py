"""The process commands of `RuntimeClient` (sdk/runtime.py): write to a running process of a
thread (a tool call of its agent whose command keeps standard input open) and terminate it
(docs/control-plane.md, "Processes").

    started = ...  # a process.started event of the session's stream: payload.processId
    await runtime.write_process_stdin(process_id, text="status\\n")
    await runtime.write_process_stdin(process_id, eof=True)     # close its input
    await runtime.terminate_process(process_id, reason="done")

Answers are the commands' JSON objects: `process` (its `status`: running, completed,
failed, terminated, or terminating while its grace period runs; `stdinOpen`, the bytes in
and out, its session, thread and turn or task). A process the runtime does not know, or one
that has ended, raises UnavailableError.
"""

from __future__ import annotations

import base64
from typing import Any


class RuntimeProcessCommands:
    """write_process_stdin and terminate_process, over `call` (RuntimeClient's)."""

    async def call(self, command: str, **params: Any) -> dict[str, Any]:
        raise NotImplementedError

    async def write_process_stdin(
        self, process_id: str, data: bytes | None = None, *, text: str | None = None,
        eof: bool = False, thread_id: str = "", session_id: str = "", idempotency_key: str = "",
    ) -> dict[str, Any]:  # fmt: skip
        """Write `data` (bytes) or `text` to the process's standard input, then close it
        when `eof`. `thread_id` or `session_id` name where a warning goes when the runtime
        does not know `process_id`. A retry under `idempotency_key` (the same input)
        answers the first answer and writes nothing again."""
        if data is not None and text is not None:
            raise ValueError("give data or text, not both")
        return await self.call(
            "write_process_stdin", process_id=process_id,
            data=base64.b64encode(data).decode() if data is not None else None, text=text,
            eof=eof or None, thread_id=thread_id or None, session_id=session_id or None,
            idempotency_key=idempotency_key or None,
        )  # fmt: skip

    async def terminate_process(
        self, process_id: str, *, reason: str = "", thread_id: str = "", session_id: str = "",
        idempotency_key: str = "",
    ) -> dict[str, Any]:  # fmt: skip
        """Stop the process (SIGTERM, SIGKILL after the tool service's grace period); the
        answer comes once it ended, or with `status: terminating` when the grace period
        passed first. A retry under `idempotency_key` answers the first answer."""
        return await self.call(
            "terminate_process", process_id=process_id, reason=reason or None,
            thread_id=thread_id or None, session_id=session_id or None,
            idempotency_key=idempotency_key or None,
        )  # fmt: skip
