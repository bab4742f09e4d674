"""Swarm messages on the wire (agent-swarm-protocol 0.1.0 and INTEROP.md): parsing with errors
that name the field, the timestamp form, and the bytes a signature covers.

Unknown fields are ignored, not refused, and kept in `extra` (a newer minor version may add
some). System operations travel as ordinary signed messages of type "system"; their `action`
and its fields are read from `content` holding a JSON object (signed: what Apiary sends, with
a copy at the top level) or, when it holds none, from the top level of the body (what the
existing implementation sends).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
import json
import re
import urllib.parse
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Final

from apiary.swarm.errors import SwarmError, invalid

PROTOCOL_VERSION: Final = "0.1.0"
BROADCAST: Final = "broadcast"
MESSAGE_TYPES: Final = ("message", "system", "notification")
PRIORITIES: Final = ("low", "normal", "high")
REFERENCE_FIELDS: Final[dict[str, tuple[str, ...]]] = {
    "github_repo": ("repo",),
    "github_issue": ("repo", "number"),
    "github_pr": ("repo", "number"),
    "github_commit": ("repo", "sha"),
    "url": ("url",),
}
REFERENCE_ACTIONS: Final = frozenset(
    {"claimed", "completed", "blocked", "unblocked", "assigned", "mention", "review_requested"}
)
_KNOWN: Final = frozenset({
    "protocol_version", "message_id", "timestamp", "sender", "recipient", "swarm_id", "type",
    "content", "signature", "in_reply_to", "thread_id", "priority", "expires_at", "references",
    "attachments", "metadata",
})  # fmt: skip
_SEMVER = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")


def format_timestamp(at: float) -> str:
    """Seconds since the epoch -> '2026-02-05T14:30:00.000Z' (milliseconds, literal Z)."""
    when = dt.datetime.fromtimestamp(at, dt.UTC)
    return f"{when:%Y-%m-%dT%H:%M:%S}.{when.microsecond // 1000:03d}Z"


def parse_timestamp(text: object, name: str) -> float:
    """An ISO-8601 date-time (Z or an offset; a naive one is UTC) -> seconds since the epoch."""
    if not isinstance(text, str) or not text:
        raise invalid(name, "must be an ISO-8601 date-time string")
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise invalid(name, f"{text!r} is not an ISO-8601 date-time") from None
    return (when if when.tzinfo else when.replace(tzinfo=dt.UTC)).timestamp()


def check_version(version: object, name: str = "protocol_version") -> str:
    """Same major version accepted (a newer minor or patch too); others refused."""
    if not isinstance(version, str) or not (match := _SEMVER.match(version)):
        raise invalid(name, "must be a semantic version like 0.1.0")
    ours = _SEMVER.match(PROTOCOL_VERSION)
    assert ours is not None
    if match.group(1) != ours.group(1):
        raise SwarmError(
            400, "UNSUPPORTED_VERSION",
            f"protocol {version} is not compatible with {PROTOCOL_VERSION} (major differs)",
            field=name,
        )  # fmt: skip
    return version


@dataclass(frozen=True, slots=True)
class Sender:
    agent_id: str
    endpoint: str


@dataclass(frozen=True, slots=True)
class SwarmMessage:
    """One message as sent; `timestamp` keeps the sender's string (the signature covers it)."""

    message_id: str
    timestamp: str
    sender: Sender
    recipient: str
    swarm_id: str
    type: str
    content: str
    signature: str = ""
    protocol_version: str = PROTOCOL_VERSION
    in_reply_to: str | None = None
    thread_id: str | None = None
    priority: str = "normal"
    expires_at: str | None = None
    references: tuple[dict[str, Any], ...] = ()
    attachments: tuple[dict[str, Any], ...] = ()
    metadata: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    """Fields this version does not know (system operations' `action` and its fields)."""

    @property
    def action(self) -> str:
        """A system message's operation ('' for other types)."""
        return str(self.system_body().get("action", "")) if self.type == "system" else ""

    def system_body(self) -> dict[str, Any]:
        """The system operation's fields: `content` as a JSON object with an action (what
        the signature covers: Apiary sends operations so), else the top-level extras (what
        the existing implementation sends, unsigned)."""
        return self.signed_system_body() or (dict(self.extra) if "action" in self.extra else {})

    def signed_system_body(self) -> dict[str, Any]:
        """The system operation's fields as the signature covers them: `content` as a JSON
        object with an action ({} when the operation is only at the top level)."""
        try:
            body = json.loads(self.content)
        except ValueError:
            return {}
        return body if isinstance(body, dict) and "action" in body else {}

    def unsigned(self) -> SwarmMessage:
        return replace(self, signature="")

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "protocol_version": self.protocol_version,
            "message_id": self.message_id,
            "timestamp": self.timestamp,
            "sender": {"agent_id": self.sender.agent_id, "endpoint": self.sender.endpoint},
            "recipient": self.recipient,
            "swarm_id": self.swarm_id,
            "type": self.type,
            "content": self.content,
            "signature": self.signature,
        }
        optional = {
            "in_reply_to": self.in_reply_to, "thread_id": self.thread_id,
            "expires_at": self.expires_at,
        }  # fmt: skip
        body.update({k: v for k, v in optional.items() if v is not None})
        if self.priority != "normal":
            body["priority"] = self.priority
        if self.references:
            body["references"] = [dict(r) for r in self.references]
        if self.attachments:
            body["attachments"] = [dict(a) for a in self.attachments]
        if self.metadata:
            body["metadata"] = dict(self.metadata)
        body.update(self.extra)
        return body


def signing_input(message: SwarmMessage) -> bytes:
    """sha256(message_id + timestamp + swarm_id + recipient + type + content), raw 32 bytes."""
    text = (
        message.message_id + message.timestamp + message.swarm_id + message.recipient
        + message.type + message.content
    )  # fmt: skip
    return hashlib.sha256(text.encode("utf-8")).digest()


def _string(body: dict[str, Any], name: str, *, empty: bool = False) -> str:
    if name not in body:
        raise invalid(name, "is required")
    value = body[name]
    if not isinstance(value, str) or (not empty and not value):
        raise invalid(name, "must be a non-empty string" if not empty else "must be a string")
    return value


def _uuid(value: object, name: str) -> str:
    try:
        uuid.UUID(str(value))
    except ValueError:
        raise invalid(name, f"{value!r} is not a UUID") from None
    return str(value)


def _optional_uuid(body: dict[str, Any], name: str) -> str | None:
    value = body.get(name)
    return None if value is None else _uuid(value, name)


def is_loopback_http(value: object) -> bool:
    """Whether `value` is a plain http:// URL to a loopback address (127.0.0.0/8, ::1 or
    localhost): the one kind of plain-HTTP endpoint a node set up with --insecure takes, for
    local development. Nothing off the machine is reachable through one."""
    if not isinstance(value, str) or not value.startswith("http://"):
        return False
    try:
        host = urllib.parse.urlsplit(value).hostname
    except ValueError:
        return False
    if host is None:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_endpoint(value: object, name: str, *, insecure: bool = False) -> str:
    """An endpoint URL: https:// (the protocol's rule); with `insecure` (a node set up for
    local development) also plain http:// to a loopback address."""
    if isinstance(value, str) and value.startswith("https://") and len(value) > 8:
        return value
    if insecure and isinstance(value, str) and is_loopback_http(value):
        return value
    if is_loopback_http(value):
        raise invalid(
            name, "must be an https:// URL; plain http:// to a loopback address is taken "
            "only by a node set up with --insecure (local development)",
        )  # fmt: skip
    allowed = " (or http:// to a loopback address)" if insecure else ""
    raise invalid(name, f"must be an https:// URL{allowed}")


def _references(value: object) -> tuple[dict[str, Any], ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise invalid("references", "must be an array")
    out = []
    for n, item in enumerate(value):
        where = f"references[{n}]"
        if not isinstance(item, dict):
            raise invalid(where, "must be an object")
        kind = item.get("type")
        if kind not in REFERENCE_FIELDS:
            raise invalid(f"{where}.type", f"must be one of {', '.join(REFERENCE_FIELDS)}")
        for required in REFERENCE_FIELDS[kind]:
            if item.get(required) in (None, ""):
                raise invalid(f"{where}.{required}", f"is required for a {kind} reference")
        if "number" in item and (
            isinstance(item["number"], bool) or not isinstance(item["number"], int)
        ):
            raise invalid(f"{where}.number", "must be an integer")
        action = item.get("action")
        if action is not None and action not in REFERENCE_ACTIONS:
            raise invalid(
                f"{where}.action", f"must be one of {', '.join(sorted(REFERENCE_ACTIONS))}"
            )
        out.append(dict(item))
    return tuple(out)


def _attachments(value: object) -> tuple[dict[str, Any], ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise invalid("attachments", "must be an array")
    out = []
    for n, item in enumerate(value):
        where = f"attachments[{n}]"
        if not isinstance(item, dict):
            raise invalid(where, "must be an object")
        if item.get("type") not in ("url", "inline"):
            raise invalid(f"{where}.type", "must be url or inline")
        for required in ("mime_type", "content"):
            if not isinstance(item.get(required), str):
                raise invalid(f"{where}.{required}", "is required (a string)")
        out.append(dict(item))
    return tuple(out)


def parse_message(body: object, *, insecure: bool = False) -> SwarmMessage:
    """A request body -> SwarmMessage; SwarmError 400 naming the first bad field. With
    `insecure` a sender endpoint may be plain http:// to a loopback address."""
    if not isinstance(body, dict):
        raise invalid("body", "must be a JSON object")
    version = check_version(body.get("protocol_version"))
    sender = body.get("sender")
    if not isinstance(sender, dict):
        raise invalid("sender", "must be an object with agent_id and endpoint")
    agent_id = sender.get("agent_id")
    if not isinstance(agent_id, str) or not agent_id:
        raise invalid("sender.agent_id", "must be a non-empty string")
    endpoint = check_endpoint(sender.get("endpoint"), "sender.endpoint", insecure=insecure)
    timestamp = _string(body, "timestamp")
    parse_timestamp(timestamp, "timestamp")
    kind = _string(body, "type")
    if kind not in MESSAGE_TYPES:
        raise invalid("type", f"must be one of {', '.join(MESSAGE_TYPES)}")
    priority = body.get("priority", "normal")
    if priority not in PRIORITIES:
        raise invalid("priority", f"must be one of {', '.join(PRIORITIES)}")
    expires_at = body.get("expires_at")
    if expires_at is not None:
        parse_timestamp(expires_at, "expires_at")
    metadata = body.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise invalid("metadata", "must be an object")
    return SwarmMessage(
        message_id=_uuid(_string(body, "message_id"), "message_id"),
        timestamp=timestamp,
        sender=Sender(agent_id, endpoint),
        recipient=_string(body, "recipient"),
        swarm_id=_uuid(_string(body, "swarm_id"), "swarm_id"),
        type=kind,
        content=_string(body, "content", empty=True),
        signature=_string(body, "signature"),
        protocol_version=version,
        in_reply_to=_optional_uuid(body, "in_reply_to"),
        thread_id=_optional_uuid(body, "thread_id"),
        priority=str(priority),
        expires_at=expires_at,
        references=_references(body.get("references")),
        attachments=_attachments(body.get("attachments")),
        metadata=dict(metadata),
        extra={k: v for k, v in body.items() if k not in _KNOWN},
    )
