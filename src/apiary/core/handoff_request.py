"""What a handoff request must satisfy before it exists (RFC 17.6), and who may receive it.

`HandoffPolicy` holds the deployment's limits; `validate_draft` checks a `HandoffDraft` field
by field (every error names the field); `check_target` checks one agent against a request
(capabilities_required, the snapshot's declared content type against the agent's
modalities); `choose_target` picks a receiving agent for capability-based routing and for
rerouting. Pure: the engine gathers the agents and the load, these functions decide.

Decisions where the RFC is silent:
- The snapshot's content type is declared beside the request (the canonical HandoffRequest
  has no field for it; see docs/handoff.md). A declared type must be a well-formed media type,
  the snapshot must be valid for it (JSON parses, text is UTF-8) and the receiving agent must
  list it among its modalities. No declaration means opaque bytes, which every agent takes.
- An agent is capable when its descriptor lists every required capability, compared exactly.
- Capability-based routing and rerouting pick, among the capable agents that are available,
  have not been offered this handoff and are not its origin, the one with the fewest open
  handoffs addressed to it (PENDING or ACCEPTED), then the smallest agent_id: spread the
  work, deterministically.
- Priorities follow the task convention of RFC 7.1: -19 (most urgent) to 20, default 0.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, Final

from apiary.core.envelope_rules import (
    MIB,
    check_modality,
    check_payload_type,
    content_type_base,
)
from apiary.core.tasks.queue import validate_priority
from apiary.errors import (
    OversizePayloadError,
    UnsupportedMessageTypeError,
    ValidationError,
)

MAX_ID_CHARS: Final = 200
MAX_REASON_CHARS: Final = 4096
MAX_CAPABILITIES: Final = 64
UNAVAILABLE_STATES: Final = frozenset({"UNAVAILABLE", "SHUTTING_DOWN", "FAILED", "FAILED_STATE"})
"""Registry states of agents that are not offered handoffs by routing (an explicit target
may still be one: it finds the request with GetPendingHandoffs when it recovers)."""


@dataclass(frozen=True, slots=True)
class HandoffPolicy:
    """Deployment policy for handoffs: TOML table [handoff]."""

    default_timeout_s: float = 300.0
    """The acceptance window when a request gives no timeout."""
    max_timeout_s: float = 86_400.0
    max_attempts: int = 3
    """Offers per handoff, the first included: a rejected or expired handoff is rerouted
    while fewer than this many agents were offered it."""
    reroute: bool = True
    """Offer a rejected or expired handoff to an alternative capable agent (RFC 17.6 MAY)."""
    max_snapshot_bytes: int = 16 * MIB
    """The largest context_snapshot accepted (the DATA payload limit by default)."""

    def __post_init__(self) -> None:
        for name in ("default_timeout_s", "max_timeout_s"):
            value = getattr(self, name)
            if not _number(value) or not 0 < value < math.inf:
                raise ValidationError.for_field(f"handoff.{name}", "must be a positive duration")
        if self.default_timeout_s > self.max_timeout_s:
            raise ValidationError.for_field(
                "handoff.default_timeout_s", "must not exceed handoff.max_timeout_s"
            )
        for name in ("max_attempts", "max_snapshot_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValidationError.for_field(f"handoff.{name}", "must be an integer >= 1")
        if not isinstance(self.reroute, bool):
            raise ValidationError.for_field("handoff.reroute", "must be true or false")

    @classmethod
    def from_settings(cls, values: Mapping[str, Any]) -> HandoffPolicy:
        """A policy from configuration values by field name."""
        known = {f.name for f in fields(cls)}
        for key in values:
            if key not in known:
                raise ValidationError.for_field(f"handoff.{key}", "is not a handoff setting")
        return cls(**values)


@dataclass(frozen=True, slots=True)
class HandoffDraft:
    """A RequestHandoff as received, before validation."""

    request_id: str
    from_agent: str
    to_agent: str = ""
    """"" routes by capability."""
    reason: str = ""
    context_snapshot: bytes = b""
    snapshot_content_type: str = ""
    capabilities_required: tuple[str, ...] = ()
    priority: int = 0
    timeout_s: float | None = None
    """None: the policy's default window."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """A registered agent as routing sees it."""

    agent_id: str
    capabilities: tuple[str, ...]
    modalities: tuple[str, ...]
    state: str = "RUNNABLE"

    @classmethod
    def from_descriptor(
        cls, agent_id: str, descriptor: Mapping[str, Any], state: str = "RUNNABLE"
    ) -> Candidate:
        return cls(
            agent_id,
            _listed(descriptor.get("capabilities")),
            _listed(descriptor.get("modalities_supported")),
            state,
        )

    @property
    def available(self) -> bool:
        return self.state not in UNAVAILABLE_STATES


def validate_draft(draft: HandoffDraft, policy: HandoffPolicy) -> HandoffDraft:
    """The draft with its timeout resolved and capabilities de-duplicated, or the error of
    its first bad field (ValidationError, OversizePayloadError naming context_snapshot)."""
    request_id = _identifier(draft.request_id, "request_id")
    from_agent = _identifier(draft.from_agent, "from_agent")
    to_agent = _identifier(draft.to_agent, "to_agent", required=False)
    if to_agent == from_agent:
        raise ValidationError.for_field("to_agent", "an agent cannot hand off to itself")
    if not isinstance(draft.reason, str) or len(draft.reason) > MAX_REASON_CHARS:
        raise ValidationError.for_field("reason", f"must be text of at most {MAX_REASON_CHARS}")
    capabilities = _capabilities(draft.capabilities_required)
    if not to_agent and not capabilities:
        raise ValidationError.for_field(
            "to_agent", "is required unless capabilities_required routes by capability"
        )
    check_snapshot(draft.context_snapshot, draft.snapshot_content_type, policy)
    return replace(
        draft,
        request_id=request_id,
        from_agent=from_agent,
        to_agent=to_agent,
        capabilities_required=capabilities,
        priority=validate_priority(draft.priority),
        timeout_s=_timeout(draft.timeout_s, policy),
    )


def check_snapshot(snapshot: bytes, content_type: str, policy: HandoffPolicy) -> None:
    """The snapshot's size and, when a content type is declared, its validity for it."""
    if not isinstance(snapshot, bytes):
        raise ValidationError.for_field("context_snapshot", "must be bytes")
    if len(snapshot) > policy.max_snapshot_bytes:
        raise OversizePayloadError(
            f"context_snapshot: {len(snapshot)} bytes exceed the "
            f"{policy.max_snapshot_bytes}-byte limit",
            {
                "field": "context_snapshot",
                "size": str(len(snapshot)),
                "limit": str(policy.max_snapshot_bytes),
            },
        )
    if not content_type:
        return
    try:
        if not content_type_base(content_type):
            raise ValidationError.for_field("content_type", "names no media type")
        check_modality(content_type, ("*/*",))  # a well-formed 'type/subtype' (no wildcard)
    except ValidationError as exc:
        raise ValidationError.for_field("snapshot_content_type", _problem(exc)) from None
    try:
        check_payload_type(content_type, snapshot)
    except ValidationError as exc:
        raise ValidationError.for_field("context_snapshot", _problem(exc)) from None


def missing_capabilities(required: Iterable[str], offered: Iterable[str]) -> tuple[str, ...]:
    """The required capabilities `offered` lacks, in the order required."""
    have = set(offered)
    return tuple(c for c in required if c not in have)


def check_target(draft: HandoffDraft, target: Candidate) -> None:
    """Refuse a target that lacks a required capability (validation_error naming to_agent)
    or does not take the snapshot's content type (unsupported_message_type naming
    snapshot_content_type)."""
    missing = missing_capabilities(draft.capabilities_required, target.capabilities)
    if missing:
        raise ValidationError.for_field(
            "to_agent",
            f"{target.agent_id} lacks the required capabilities: {', '.join(missing)}",
            agent_id=target.agent_id,
            missing_capabilities=",".join(missing),
        )
    try:
        check_modality(draft.snapshot_content_type, target.modalities)
    except UnsupportedMessageTypeError as exc:
        base = content_type_base(draft.snapshot_content_type)
        raise UnsupportedMessageTypeError(
            f"snapshot_content_type: {target.agent_id} does not take {base}",
            {**exc.details, "field": "snapshot_content_type", "agent_id": target.agent_id},
        ) from None


def fits(draft: HandoffDraft, target: Candidate) -> bool:
    """Whether `target` passes `check_target`."""
    try:
        check_target(draft, target)
    except (ValidationError, UnsupportedMessageTypeError):
        return False
    return True


def choose_target(
    draft: HandoffDraft,
    candidates: Sequence[Candidate],
    open_load: Mapping[str, int],
    exclude: Iterable[str] = (),
) -> str | None:
    """The agent capability-based routing offers `draft` to, or None when none fits (see the
    module docstring for the rule). `open_load` counts open handoffs per agent."""
    barred = {draft.from_agent, *exclude}
    eligible = [
        c for c in candidates if c.agent_id not in barred and c.available and fits(draft, c)
    ]
    if not eligible:
        return None
    best = min(eligible, key=lambda c: (open_load.get(c.agent_id, 0), c.agent_id))
    return best.agent_id


# --- helpers ----------------------------------------------------------------------------------


def _identifier(value: object, name: str, *, required: bool = True) -> str:
    if not isinstance(value, str):
        raise ValidationError.for_field(name, "must be a string")
    if value != value.strip() or any(ord(ch) < 32 for ch in value):
        raise ValidationError.for_field(name, "must not have surrounding blanks or controls")
    if required and not value:
        raise ValidationError.for_field(name, "is required")
    if len(value) > MAX_ID_CHARS:
        raise ValidationError.for_field(name, f"must be at most {MAX_ID_CHARS} characters")
    return value


def _capabilities(values: Iterable[str]) -> tuple[str, ...]:
    if isinstance(values, str):
        raise ValidationError.for_field("capabilities_required", "must be a list of strings")
    items = tuple(values)
    if len(items) > MAX_CAPABILITIES:
        raise ValidationError.for_field(
            "capabilities_required", f"must list at most {MAX_CAPABILITIES} capabilities"
        )
    for item in items:
        if not isinstance(item, str) or not item.strip() or item != item.strip():
            raise ValidationError.for_field(
                "capabilities_required", f"each must be a non-blank name, got {item!r}"
            )
    return tuple(dict.fromkeys(items))


def _timeout(value: float | None, policy: HandoffPolicy) -> float:
    if value is None:
        return policy.default_timeout_s
    if not _number(value) or not 0 < value <= policy.max_timeout_s:
        raise ValidationError.for_field(
            "timeout", f"must be a positive duration of at most {policy.max_timeout_s:g} s"
        )
    return float(value)


def _problem(exc: ValidationError) -> str:
    """An error's message without the field name it started with."""
    return exc.message.partition(": ")[2] or exc.message


def _listed(value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        return ()
    return tuple(str(v) for v in value)


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
