"""Registration rules for an AgentDescriptor (RFC 14, registry.proto).

RFC 14: agents register with a name, a description of at most 200 words, capabilities, a
communication class, supported modalities, at least one Inference Engine connector, and a
public key when message signing is enabled. `validate_descriptor` enforces those and the
shape of each field; errors are ValidationError naming `agent.<field>` (the field's path in
RegisterAgentRequest), with `details["index"]` for an element of a list.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from apiary.core.envelope_rules import is_media_range
from apiary.errors import ValidationError

MAX_DESCRIPTION_WORDS: Final = 200
MAX_AGENT_ID_LENGTH: Final = 128
MAX_NAME_LENGTH: Final = 256
MAX_CAPABILITY_LENGTH: Final = 256
ED25519_PUBLIC_KEY_BYTES: Final = 32

COMMUNICATION_CLASSES: Final = ("PRIVILEGED", "STANDARD", "BULK")
UNSPECIFIED_CLASS: Final = "COMM_CLASS_UNSPECIFIED"
DEFAULT_CLASS: Final = "STANDARD"
"""What COMM_CLASS_UNSPECIFIED means: proto3 sends 0 for an unset enum, so an agent that said
nothing gets the ordinary lane rather than a refusal or the urgent lane."""

BUILTIN_CONNECTOR: Final = "builtin://rules"
"""The connector naming Apiary's built-in rule-based Inference Engine (engine/inference.py),
what an agent with no engine of its own declares."""
MISSING_CONNECTOR: Final = (
    "at least one Inference Engine connector is required (RFC 14); add a reasoning connector "
    f"such as {BUILTIN_CONNECTOR!r} (the built-in rule engine) or the URI of your own engine "
    "(https://..., grpc://host:port) to reasoning_connectors"
)

# RFC 3986 section 3.1: scheme = ALPHA *( ALPHA / DIGIT / "+" / "-" / "." ), then ':' and
# something. The rest is only required to be non-empty and free of whitespace and controls.
_URI: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:\S+")


@dataclass(frozen=True, slots=True)
class AgentDescriptorFields:
    """The fields of registry.proto's AgentDescriptor, as domain values.

    `communication_class` is the CommunicationClass enum name. Construction does not
    validate, so that a refused registration can still be described in the error.
    """

    agent_id: str
    name: str
    description: str = ""
    capabilities: tuple[str, ...] = ()
    communication_class: str = UNSPECIFIED_CLASS
    modalities_supported: tuple[str, ...] = ()
    reasoning_connectors: tuple[str, ...] = ()
    public_key: bytes = b""


def word_count(text: str) -> int:
    """The number of whitespace-separated words in `text` (RFC 14's description measure)."""
    return len(text.split())


def effective_communication_class(value: str) -> str:
    """The lane a declared communication class maps to: UNSPECIFIED becomes STANDARD.

    Anything but the three classes and COMM_CLASS_UNSPECIFIED raises ValidationError naming
    `agent.communication_class`. Names are the proto enum names, matched exactly.
    """
    if value == UNSPECIFIED_CLASS:
        return DEFAULT_CLASS
    if value not in COMMUNICATION_CLASSES:
        raise ValidationError.for_field(
            "agent.communication_class",
            f"must be one of {', '.join(COMMUNICATION_CLASSES)} or {UNSPECIFIED_CLASS},"
            f" got {value[:40]!r}",
        )
    return value


def validate_descriptor(d: AgentDescriptorFields, *, signing_required: bool = False) -> None:
    """Check a descriptor against RFC 14; raises ValidationError naming `agent.<field>`.

    - agent_id: non-empty, at most 128 characters, no whitespace or control characters;
    - name: required (not blank), at most 256 characters, no control characters;
    - description: optional, at most 200 words;
    - capabilities: each a non-empty string of printable non-space characters, no duplicates
      (an agent may declare none);
    - communication_class: PRIVILEGED, STANDARD, BULK, or COMM_CLASS_UNSPECIFIED (= STANDARD);
    - modalities_supported: each a MIME media range (`type/subtype`, `type/*`, `*/*`);
      none declared means application/json and application/protobuf (see check_modality);
    - reasoning_connectors: at least one, each a URI with a scheme (`builtin://rules`,
      `https://...`, `grpc://host:port`);
    - public_key: a raw 32-byte Ed25519 key; may be empty unless `signing_required`.
    """
    _check_agent_id(d.agent_id)
    _check_name(d.name)
    words = word_count(d.description)
    if words > MAX_DESCRIPTION_WORDS:
        raise ValidationError.for_field(
            "agent.description",
            f"has {words} words; at most {MAX_DESCRIPTION_WORDS} are allowed",
            words=str(words),
        )
    _check_capabilities(d.capabilities)
    effective_communication_class(d.communication_class)
    for index, modality in enumerate(d.modalities_supported):
        if not is_media_range(modality):
            raise _element_error(
                "agent.modalities_supported",
                index,
                f"must be a MIME type 'type/subtype' (wildcards allowed), got {modality[:80]!r}",
            )
    _check_connectors(d.reasoning_connectors)
    _check_public_key(d.public_key, signing_required=signing_required)


def _check_agent_id(agent_id: str) -> None:
    field = "agent.agent_id"
    if not agent_id:
        raise ValidationError.for_field(field, "is required")
    if len(agent_id) > MAX_AGENT_ID_LENGTH:
        raise ValidationError.for_field(
            field, f"is longer than {MAX_AGENT_ID_LENGTH} characters ({len(agent_id)})"
        )
    if any(ch.isspace() or not ch.isprintable() for ch in agent_id):
        raise ValidationError.for_field(
            field, f"must not contain whitespace or control characters, got {agent_id[:40]!r}"
        )


def _check_name(name: str) -> None:
    field = "agent.name"
    if not name.strip():
        raise ValidationError.for_field(field, "is required")
    if len(name) > MAX_NAME_LENGTH:
        raise ValidationError.for_field(
            field, f"is longer than {MAX_NAME_LENGTH} characters ({len(name)})"
        )
    if any(not ch.isprintable() for ch in name):
        raise ValidationError.for_field(
            field, f"must not contain control characters, got {name[:40]!r}"
        )


def _check_capabilities(capabilities: tuple[str, ...]) -> None:
    field = "agent.capabilities"
    seen: set[str] = set()
    for index, capability in enumerate(capabilities):
        if not capability:
            raise _element_error(field, index, "must not be empty")
        if len(capability) > MAX_CAPABILITY_LENGTH:
            raise _element_error(field, index, f"is longer than {MAX_CAPABILITY_LENGTH} characters")
        if any(ch.isspace() or not ch.isprintable() for ch in capability):
            raise _element_error(
                field, index, f"must not contain whitespace or controls, got {capability[:40]!r}"
            )
        if capability in seen:
            raise _element_error(field, index, f"duplicates {capability[:40]!r}")
        seen.add(capability)


def _check_connectors(connectors: tuple[str, ...]) -> None:
    field = "agent.reasoning_connectors"
    if not connectors:
        raise ValidationError.for_field(field, MISSING_CONNECTOR)
    for index, connector in enumerate(connectors):
        if _URI.fullmatch(connector) is None or not connector.isprintable():
            raise _element_error(
                field,
                index,
                f"must be a URI with a scheme such as {BUILTIN_CONNECTOR}, got {connector[:80]!r}",
            )


def _check_public_key(key: bytes, *, signing_required: bool) -> None:
    field = "agent.public_key"
    if not key:
        if signing_required:
            raise ValidationError.for_field(field, "is required when message signing is enabled")
        return
    if len(key) != ED25519_PUBLIC_KEY_BYTES:
        raise ValidationError.for_field(
            field,
            f"must be a raw {ED25519_PUBLIC_KEY_BYTES}-byte Ed25519 key, got {len(key)} bytes",
        )


def _element_error(field: str, index: int, problem: str) -> ValidationError:
    return ValidationError.for_field(field, f"[{index}] {problem}", index=str(index))
