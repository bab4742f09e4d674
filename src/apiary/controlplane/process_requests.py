"""The parameters of write_process_stdin and terminate_process (controlplane/processes.py).
Both take an `idempotency_key`, kept in memory with the process (controlplane/
process_keys.py)."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from apiary.controlplane.requests import Params
from apiary.controlplane.task_requests import Keyed
from apiary.errors import ValidationError


@dataclass(frozen=True, slots=True)
class WriteProcessStdin(Keyed):
    process_id: str
    data: bytes
    """What to write: `data` (base64) or `text` (UTF-8), at most [runtime] max_stdin_bytes."""
    eof: bool = False
    """Close the process's standard input after `data`."""
    session_id: str = ""
    """The session to warn (runtime.warning) when process_id is unknown to the runtime."""
    thread_id: str = ""

    @classmethod
    def read(cls, p: Params, max_stdin_bytes: int) -> WriteProcessStdin:
        process_id = p.id("process_id", required=True)
        eof = p.boolean("eof", False)
        if p.has("data") and p.has("text"):
            raise ValidationError.for_field("text", "give data (base64) or text, not both")
        if p.has("data"):
            name, data = "data", _base64(p)
        elif p.has("text"):
            name, data = "text", _text(p)
        elif eof:
            name, data = "data", b""
        else:
            raise ValidationError.for_field(
                "data", "is required: the input as base64 (data) or UTF-8 (text), or eof: true"
            )
        if len(data) > max_stdin_bytes:
            raise ValidationError.for_field(
                name, f"is {len(data)} bytes; at most {max_stdin_bytes} are written at once "
                "([runtime] max_stdin_bytes)",
            )  # fmt: skip
        return cls(
            idempotency_key=p.id("idempotency_key"), process_id=process_id, data=data, eof=eof,
            session_id=p.id("session_id"), thread_id=p.id("thread_id"),
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class TerminateProcess(Keyed):
    process_id: str
    reason: str = ""
    session_id: str = ""
    thread_id: str = ""

    @classmethod
    def read(cls, p: Params) -> TerminateProcess:
        return cls(
            idempotency_key=p.id("idempotency_key"), process_id=p.id("process_id", required=True),
            reason=p.text("reason"), session_id=p.id("session_id"), thread_id=p.id("thread_id"),
        )  # fmt: skip


def _base64(p: Params) -> bytes:
    value = p.raw("data")
    if not isinstance(value, str):
        raise ValidationError.for_field("data", "must be a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ValidationError.for_field("data", "is not valid base64") from None


def _text(p: Params) -> bytes:
    value = p.raw("text")
    if not isinstance(value, str):
        raise ValidationError.for_field("text", "must be a string")
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValidationError.for_field("text", "is not valid UTF-8 (a lone surrogate)") from None
