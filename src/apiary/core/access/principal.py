"""A principal: who a call acts as, once authenticated (DESIGN.md section 9)."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field

DEFAULT_TENANT = "default"
TENANT_KEY = "apiary-tenant"
"""Request metadata naming the tenant a call acts in: a global operator's choice, and the
tenant whose registry checks an agent's per-call proof (default: `default`)."""
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@:-]{0,127}$")
"""Principal names and tenants: 1-128 characters, no '/', spaces or control characters."""


class PrincipalKind(enum.StrEnum):
    AGENT = "agent"
    """An agent process: acts only as itself."""
    OPERATOR = "operator"
    """A human or tool operating the coordinator: what it may do is its roles."""
    APPLICATION = "application"
    """A service account driving work (submits tasks, sends messages as itself)."""
    ANONYMOUS = "anonymous"
    """No credential: exists only in dev mode."""


class Mechanism(enum.StrEnum):
    """How the principal proved who it is (recorded with every access decision)."""

    MTLS = "mtls"
    API_KEY = "api_key"
    OPERATOR_TOKEN = "operator_token"
    AGENT_PROOF = "agent_proof"
    SWARM_SIGNATURE = "swarm_signature"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class Principal:
    kind: PrincipalKind
    name: str
    tenant: str = DEFAULT_TENANT
    roles: frozenset[str] = field(default_factory=frozenset)
    mechanism: Mechanism = Mechanism.NONE

    @property
    def label(self) -> str:
        """'agent:bob@default': how events, errors and logs name the principal."""
        return f"{self.kind.value}:{self.name}@{self.tenant}"

    def is_agent(self, agent_id: str) -> bool:
        return self.kind is PrincipalKind.AGENT and self.name == agent_id

    def has_role(self, role: str) -> bool:
        """Operators hold roles; `admin` holds every role."""
        return self.kind is PrincipalKind.OPERATOR and (role in self.roles or "admin" in self.roles)


ANONYMOUS = Principal(PrincipalKind.ANONYMOUS, "anonymous")


def check_name(value: str, what: str) -> str | None:
    """Why `value` is not a valid principal name or tenant, or None."""
    if not NAME_PATTERN.match(value):
        return (
            f"{what} {value[:64]!r} must be 1-128 letters, digits or ._@:- "
            "(starting with a letter or digit)"
        )
    return None
