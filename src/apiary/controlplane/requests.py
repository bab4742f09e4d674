"""The control plane's commands' parameters, read from the JSON object a transport hands
over (the HTTP body, JSON-RPC's `params`) into typed requests.

Parameters are snake_case (`session_id`); the contract's camelCase spelling (`sessionId`) is
taken too. A parameter no command knows, or one of the wrong type, is a ValidationError
naming it, so that a typo never passes silently.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from apiary.core.json_reader import check_nesting
from apiary.core.limits import DEFAULT_LIMITS, check_id, check_text, utf8_size
from apiary.core.runtime.records import QueuePolicy
from apiary.errors import ValidationError

_CAMEL: Final = re.compile(r"(?<!^)(?=[A-Z])")
ID_BYTES: Final = DEFAULT_LIMITS.id_bytes
TEXT_BYTES: Final = DEFAULT_LIMITS.text_bytes


def snake(name: str) -> str:
    """`lastAcknowledgedSequence` -> `last_acknowledged_sequence`."""
    return _CAMEL.sub("_", name).lower()


class Params:
    """A command's parameters (see the module docstring); `done()` refuses the unread."""

    def __init__(self, doc: object) -> None:
        if doc is None:
            doc = {}
        if not isinstance(doc, Mapping):
            raise ValidationError.for_field("params", "must be a JSON object")
        self._values: dict[str, Any] = {}
        for key, value in doc.items():
            name = snake(str(key))
            if name in self._values:
                raise ValidationError.for_field(name, "is given twice (in two spellings)")
            self._values[name] = value
        self._read: set[str] = set()

    def _get(self, name: str) -> Any:
        self._read.add(name)
        return self._values.get(name)

    def has(self, name: str) -> bool:
        return name in self._values

    def raw(self, name: str) -> Any:
        """The parameter as given (None when absent), for a reader of its own type."""
        return self._get(name)

    def id(self, name: str, *, required: bool = False) -> str:
        """An id: printable text of at most ID_BYTES bytes ('' when absent)."""
        value = self._get(name)
        if value is None or value == "":
            if required:
                raise ValidationError.for_field(name, "is required")
            return ""
        if not isinstance(value, str):
            raise ValidationError.for_field(name, "must be a string")
        return check_id(value, name, ID_BYTES)

    def text(self, name: str, limit: int = TEXT_BYTES) -> str:
        value = self._get(name)
        if value is None:
            return ""
        if not isinstance(value, str):
            raise ValidationError.for_field(name, "must be a string")
        return check_text(value, name, limit)

    def integer(self, name: str, *, minimum: int = 0, maximum: int = (1 << 63) - 1) -> int | None:
        value = self._get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValidationError.for_field(name, "must be an integer")
        if not minimum <= value <= maximum:
            raise ValidationError.for_field(name, f"must be within {minimum}..{maximum}")
        return value

    def boolean(self, name: str, default: bool) -> bool:
        value = self._get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ValidationError.for_field(name, "must be true or false")
        return value

    def choice(self, name: str, allowed: tuple[str, ...], default: str) -> str:
        value = self._get(name)
        if value is None:
            return default
        if value not in allowed:
            raise ValidationError.for_field(name, f"must be one of: {', '.join(allowed)}")
        return str(value)

    def json_value(self, name: str, limit: int) -> str:
        """A required JSON value of any type, as compact JSON text of at most `limit`
        bytes."""
        return self._json(name, limit)[1]

    def json(self, name: str, limit: int) -> Any:
        """A required JSON value of any type, checked as `json_value` checks it."""
        return self._json(name, limit)[0]

    def _json(self, name: str, limit: int) -> tuple[Any, str]:
        if not self.has(name):
            raise ValidationError.for_field(name, "is required (any JSON value)")
        value = self._get(name)
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        size = utf8_size(text)
        if size > limit:
            raise ValidationError.for_field(name, f"is {size} bytes of JSON; at most {limit}")
        check_nesting(text, name, DEFAULT_LIMITS.json_depth)
        return value, text

    def done(self) -> None:
        unknown = sorted(set(self._values) - self._read)
        if unknown:
            raise ValidationError.for_field(
                unknown[0], "is not a parameter of this command", unknown=", ".join(unknown)
            )


@dataclass(frozen=True, slots=True)
class SubmitTurn:
    input_json: str
    session_id: str = ""
    thread_id: str = ""
    turn_id: str = ""
    agent_id: str = ""
    queue_policy: str = QueuePolicy.QUEUE.value
    scope: str = ""
    priority: int = 0
    workspace_id: str = ""
    title: str = ""
    capability: str = ""
    """A new thread's capability queue (instead of `agent_id`)."""

    @classmethod
    def read(cls, p: Params, max_input_bytes: int) -> SubmitTurn:
        return cls(
            input_json=p.json_value("input", max_input_bytes),
            session_id=p.id("session_id"),
            thread_id=p.id("thread_id"),
            turn_id=p.id("turn_id"),
            agent_id=p.id("agent_id"),
            queue_policy=p.choice("queue_policy", tuple(QueuePolicy), QueuePolicy.QUEUE.value),
            scope=p.text("scope", DEFAULT_LIMITS.document_bytes),
            priority=p.integer("priority", minimum=-19, maximum=20) or 0,
            workspace_id=p.id("workspace_id"),
            title=p.text("title"),
            capability=p.id("capability"),
        )


@dataclass(frozen=True, slots=True)
class GetSession:
    session_id: str
    turns: int | None = None

    @classmethod
    def read(cls, p: Params) -> GetSession:
        return cls(p.id("session_id", required=True), p.integer("turns", maximum=1000))


@dataclass(frozen=True, slots=True)
class GetThreadRead:
    thread_id: str
    session_id: str = ""
    turns: int | None = None

    @classmethod
    def read(cls, p: Params) -> GetThreadRead:
        return cls(
            p.id("thread_id", required=True), p.id("session_id"), p.integer("turns", maximum=1000)
        )


@dataclass(frozen=True, slots=True)
class ListTasks:
    session_id: str = ""
    thread_id: str = ""

    @classmethod
    def read(cls, p: Params) -> ListTasks:
        found = cls(p.id("session_id"), p.id("thread_id"))
        if not (found.session_id or found.thread_id):
            raise ValidationError.for_field("session_id", "is required (or thread_id)")
        return found


@dataclass(frozen=True, slots=True)
class GetTask:
    task_id: str

    @classmethod
    def read(cls, p: Params) -> GetTask:
        return cls(p.id("task_id", required=True))


@dataclass(frozen=True, slots=True)
class ReconnectChannel:
    session_id: str
    channel_id: str = ""
    resume_token: str = ""
    last_acknowledged_sequence: int | None = None
    limit: int | None = None

    @classmethod
    def read(cls, p: Params) -> ReconnectChannel:
        found = cls(
            session_id=p.id("session_id", required=True),
            channel_id=p.id("channel_id"),
            resume_token=p.id("resume_token"),
            last_acknowledged_sequence=p.integer("last_acknowledged_sequence"),
            limit=p.integer("limit", minimum=0, maximum=10_000),
        )
        if found.channel_id and not found.resume_token:
            raise ValidationError.for_field(
                "resume_token", "is required to resume a channel (reconnect_channel gave it)"
            )
        return found


@dataclass(frozen=True, slots=True)
class AckEvents:
    channel_id: str
    resume_token: str
    sequence: int

    @classmethod
    def read(cls, p: Params) -> AckEvents:
        sequence = p.integer("sequence")
        if sequence is None:
            raise ValidationError.for_field("sequence", "is required")
        return cls(p.id("channel_id", required=True), p.id("resume_token", required=True), sequence)
