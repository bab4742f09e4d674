"""The [auth] settings (docs/security.md)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from apiary.core.access.proof import DEFAULT_AUDIENCE
from apiary.server.auth.certificates import CertificateRule


@dataclass(frozen=True, slots=True)
class Quota:
    """A tenant's limits (None: unlimited). Checked when a call would add to them: a new
    agent id, a message (a SendStream when it opens), a task; stored bytes are measured on
    SQLite and PostgreSQL (the memory store is not measured)."""

    agents: int | None = None
    queued_messages: int | None = None
    tasks: int | None = None
    stored_bytes: int | None = None


EVERY_TENANT = "*"
"""The [auth.quotas] key of the quota of every tenant without one of its own."""


@dataclass(frozen=True, slots=True)
class AuthSettings:
    secure: bool = False
    """Secure mode: default-deny authorization, every call needs a principal (with TLS and
    message signing, which `apiary serve --secure` turns on together)."""
    certificates: tuple[CertificateRule, ...] = ()
    """Client certificates mapped to principals, checked before the apiary:// URI convention."""
    keys_file: str = ""
    """The API key ring; empty: <data_dir>/credentials.json (`apiary auth` manages it)."""
    audience: str = DEFAULT_AUDIENCE
    """What agents' per-call proofs must name as their audience."""
    proof_window_s: float = 60.0
    """How far from the coordinator's clock a per-call proof's time may be."""
    tenants: tuple[str, ...] = ()
    """Tenants besides `default` whose engines open when the coordinator starts (so are the
    tenants of the API keys); a certificate's tenant opens at its first call."""
    quotas: Mapping[str, Quota] = field(default_factory=dict)
    """Per-tenant quotas by tenant name ([auth.quotas.NAME]; `*` for every other tenant)."""
    log_allowed: bool | None = None
    """Record allowed decisions as `access.decided` events too (default: in secure mode;
    denials are always recorded)."""

    def quota(self, tenant: str) -> Quota:
        return self.quotas.get(tenant) or self.quotas.get(EVERY_TENANT) or Quota()
