"""Authenticated HITL operators (RFC 15.1): bearer tokens with roles, from configuration.

Tokens are compared by their SHA-256 in constant time; configuration may hold the digest
(`token_sha256`) so that the plain token never sits in a file.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass, field

from apiary.errors import UnauthenticatedError

BEARER = "bearer "


@dataclass(frozen=True, slots=True)
class Operator:
    name: str
    roles: frozenset[str] = field(default_factory=frozenset)


@dataclass(frozen=True, slots=True)
class OperatorEntry:
    name: str
    token_sha256: str
    roles: tuple[str, ...] = ()


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Operators:
    def __init__(self, entries: Sequence[OperatorEntry] = (), *, elsewhere: bool = False) -> None:
        self._entries = tuple(entries)
        self._elsewhere = elsewhere
        """Operators also authenticate otherwise (API keys, client certificates)."""
        self._last_seen: dict[str, float] = {}

    @property
    def configured(self) -> bool:
        """Whether any operator can authenticate (a HITL component exists, RFC 15.3): one
        with a configured token, or any when operators authenticate otherwise."""
        return bool(self._entries) or self._elsewhere

    def authenticate(self, authorization: str) -> Operator:
        """The operator behind an `authorization: Bearer <token>` header value."""
        if not authorization.lower().startswith(BEARER):
            raise UnauthenticatedError(
                "HITL operations need `authorization: Bearer <operator token>`",
                {"field": "authorization"},
            )
        digest = token_digest(authorization[len(BEARER) :].strip())
        for entry in self._entries:
            if hmac.compare_digest(entry.token_sha256.lower(), digest):
                return Operator(entry.name, frozenset(entry.roles))
        raise UnauthenticatedError("unknown operator token", {"field": "authorization"})

    def seen(self, operator: Operator, now: float) -> None:
        self._last_seen[operator.name] = now

    def last_seen(self) -> float:
        """When any operator was last active (0.0 when never)."""
        return max(self._last_seen.values(), default=0.0)
