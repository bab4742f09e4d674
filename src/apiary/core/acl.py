"""Message access control lists (RFC 6.3 "message type authorization"; DESIGN.md section 9):
which agents may send which message types to whom. Pure: the router asks, and logs what is
refused. (Which agents may call which tools is `[tools.acl]`, engine/tools/settings.py.)

Off until it has a grant. With any, an agent's envelope is admitted only when a grant that
matches its producer allows its message type and its recipient; an agent that no grant matches
may send nothing (deny unless allowed). ACKNOWLEDGEMENTs are never refused (the protocol needs
every recipient to answer), nor are the coordinator's own messages; envelopes to the
coordinator's own endpoints (the router decides which) are requests to its services, which
authorize them themselves.

Agents and recipients are shell-style patterns (`coder-*`, `*`), matched case-sensitively over
the whole name; message types are names (`DATA`, `TOOL_CALL`) or `*`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fnmatch import translate
from functools import lru_cache
from typing import Any

from apiary.core.envelope import MessageType
from apiary.errors import PermissionDeniedError, ValidationError

_TYPE_NAMES = frozenset(
    t.name for t in MessageType if t is not MessageType.MESSAGE_TYPE_UNSPECIFIED
)


@lru_cache(maxsize=1024)
def _pattern(text: str) -> re.Pattern[str]:
    return re.compile(translate(text))


def _matches(patterns: Sequence[str], value: str) -> bool:
    return any(_pattern(p).fullmatch(value) is not None for p in patterns)


@dataclass(frozen=True, slots=True)
class MessageGrant:
    """Agents matching `agents` may send messages of `types` to recipients matching `to`."""

    agents: tuple[str, ...]
    types: tuple[str, ...]
    to: tuple[str, ...] = ("*",)

    def allows(self, producer: str, message_type: str, recipient: str) -> bool:
        return (
            _matches(self.agents, producer)
            and ("*" in self.types or message_type in self.types)
            and _matches(self.to, recipient)
        )


@dataclass(frozen=True, slots=True)
class AclPolicy:
    """The grants; none leaves messaging open (development mode)."""

    messages: tuple[MessageGrant, ...] = ()

    def check_message(self, producer: str, message_type: MessageType, recipient: str) -> None:
        """Raise PermissionDeniedError unless `producer` may send `message_type` to
        `recipient`; details name the field a grant would have to allow."""
        if not self.messages or message_type is MessageType.ACKNOWLEDGEMENT:
            return
        mine = [g for g in self.messages if _matches(g.agents, producer)]
        name = message_type.name
        if any(g.allows(producer, name, recipient) for g in mine):
            return
        typed = [g for g in mine if "*" in g.types or name in g.types]
        field = "recipient" if typed else "message_type"
        why = (
            f"{producer} may not send {name} to {recipient}"
            if typed
            else f"{producer} may not send {name} messages"
        )
        raise PermissionDeniedError(
            f"{why} (access control list)",
            {"field": field, "producer": producer, "message_type": name, "recipient": recipient},
        )


def acl_policy(values: Mapping[str, Any]) -> AclPolicy:
    """An AclPolicy from the `[router.acl]` table, `[[router.acl.messages]]` grants (agents,
    types, to); ValidationError naming the field."""
    _known(values, ("messages",), "acl.")
    messages = tuple(
        MessageGrant(
            agents=_patterns(rule, "agents", f"acl.messages[{i}]."),
            types=_types(rule, f"acl.messages[{i}]."),
            to=_patterns(rule, "to", f"acl.messages[{i}].", default=("*",)),
        )
        for i, rule in enumerate(_rules(values, "messages", ("agents", "types", "to")))
    )
    return AclPolicy(messages)


def _known(values: Mapping[str, Any], known: Sequence[str], prefix: str) -> None:
    for key in values:
        if key not in known:
            raise ValidationError.for_field(
                f"{prefix}{key}", f"is not a setting; known: {', '.join(known)}"
            )


def _rules(values: Mapping[str, Any], name: str, known: Sequence[str]) -> list[Mapping[str, Any]]:
    rules = values.get(name, [])
    if not isinstance(rules, list) or not all(isinstance(r, dict) for r in rules):
        raise ValidationError.for_field(f"acl.{name}", "must be an array of tables")
    for i, rule in enumerate(rules):
        _known(rule, known, f"acl.{name}[{i}].")
    return rules


def _patterns(
    rule: Mapping[str, Any], key: str, prefix: str, default: tuple[str, ...] | None = None
) -> tuple[str, ...]:
    value = rule.get(key)
    if value is None and default is not None:
        return default
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(v, str) and v.strip() for v in value)
    ):
        raise ValidationError.for_field(f"{prefix}{key}", "must be a non-empty list of patterns")
    return tuple(v.strip() for v in value)


def _types(rule: Mapping[str, Any], prefix: str) -> tuple[str, ...]:
    names = _patterns(rule, "types", prefix)
    for name in names:
        if name != "*" and name not in _TYPE_NAMES:
            raise ValidationError.for_field(
                f"{prefix}types",
                f"{name!r} is not a message type; one of {', '.join(sorted(_TYPE_NAMES))} or *",
            )
    return names
