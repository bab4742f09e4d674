"""What a service handler learns about the call, whichever transport carried it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from apiary.core.access.principal import (
    ANONYMOUS,
    DEFAULT_TENANT,
    TENANT_KEY,
    Principal,
    PrincipalKind,
)
from apiary.core.access.rules import Role, Rule
from apiary.core.signatures import SIGNATURE_KEY, decode_signature
from apiary.engine.operators import Operator
from apiary.errors import PermissionDeniedError, UnauthenticatedError, ValidationError

RECIPIENT_KEY = "sw4rm-recipient"
"""Request metadata naming a message's recipient (DESIGN.md section 4)."""
RESUME_AFTER_KEY = "sw4rm-resume-after"
"""StreamIncoming request metadata: resume delivery after this inbox offset (RFC 5.5)."""
AGENT_KEY = "sw4rm-agent-id"
"""Request metadata naming the calling agent: what identifies an anonymous caller in dev
mode; an authenticated agent is its credential, and metadata naming another is refused."""


def _no_certificate() -> bytes:
    return b""


def _no_deadline() -> float | None:
    return None


ObjectCheck = Callable[[str, Rule, str, "str | None", "CallContext"], bool]
"""Whether the call may act on one object its handler names: (the action recorded, the rule,
the object, its owner, the call); the access guard's decision, recorded as its others."""


@dataclass(frozen=True, slots=True)
class CallContext:
    transport: str
    """'grpc' or 'http'."""
    metadata: Mapping[str, str] = field(default_factory=dict)
    """Request metadata with lower-case keys (gRPC metadata or HTTP headers)."""
    peer: str = ""
    peer_certificate: Callable[[], bytes] = _no_certificate
    """The client certificate (PEM) the connection presented; b"" without mTLS."""
    principal: Principal = ANONYMOUS
    """Who the call acts as, set by the access guard before any handler runs."""
    time_remaining: Callable[[], float | None] = _no_deadline
    """Seconds left before the call's deadline (gRPC's, when the client set one); None
    without one."""
    allows: ObjectCheck | None = None
    """The access guard's decision on one object a stream's frame names (FollowTasks' tasks),
    set with the principal; None for a call that did not pass the guard."""

    def get(self, key: str, default: str = "") -> str:
        return self.metadata.get(key, default)

    def agent_id(self) -> str:
        """The agent the call acts as: the authenticated agent (or application, which acts as
        itself the same way); for an anonymous caller (dev mode) the agent its
        `sw4rm-agent-id` metadata names; else '' (operators act as no agent)."""
        kind = self.principal.kind
        if kind in (PrincipalKind.AGENT, PrincipalKind.APPLICATION):
            return self.principal.name
        if kind is PrincipalKind.ANONYMOUS:
            return self.metadata.get(AGENT_KEY, "")
        return ""

    def caller(self) -> str:
        """How events name the caller: the agent it acts as, else the principal's name, else
        the peer address."""
        if self.principal.kind is PrincipalKind.ANONYMOUS:
            return self.metadata.get(AGENT_KEY, "") or self.peer or "anonymous"
        return self.principal.name

    def operator(self) -> Operator:
        """The authenticated operator making the call; UnauthenticatedError otherwise."""
        principal = self.principal
        if principal.kind is PrincipalKind.OPERATOR:
            return Operator(principal.name, principal.roles)
        raise UnauthenticatedError(
            "this operation needs an operator: `authorization: Bearer <operator token or API "
            f"key>` or an operator's client certificate (the call is {principal.label})",
            {"field": "authorization"},
        )

    def tenant(self) -> str:
        """The tenant the call acts in: its principal's, or a global operator's choice by the
        `apiary-tenant` metadata; the default tenant for anonymous callers (dev mode)."""
        principal = self.principal
        if principal.kind is PrincipalKind.ANONYMOUS:
            return DEFAULT_TENANT
        chosen = self.metadata.get(TENANT_KEY, "")
        if not chosen or chosen == principal.tenant:
            return principal.tenant
        if principal.tenant != DEFAULT_TENANT or not principal.has_role(Role.TENANTS):
            raise PermissionDeniedError(
                f"{principal.label} acts in its own tenant only; naming another with "
                f"{TENANT_KEY} needs a global operator (role {Role.TENANTS.value!r} in the "
                f"{DEFAULT_TENANT} tenant)",
                {"field": TENANT_KEY, "principal": principal.label},
            )
        return chosen

    def operator_or_none(self) -> Operator | None:
        principal = self.principal
        if principal.kind is PrincipalKind.OPERATOR:
            return Operator(principal.name, principal.roles)
        return None


def request_proof(ctx: CallContext) -> bytes:
    """The call's `sw4rm-signature` metadata (RFC 6.2) as bytes; b"" when there is none.
    Malformed text is a ValidationError naming the key."""
    text = ctx.get(SIGNATURE_KEY)
    if not text:
        return b""
    signature = decode_signature(text)
    if signature is None:
        raise ValidationError.for_field(SIGNATURE_KEY, "is not standard base64")
    return signature
