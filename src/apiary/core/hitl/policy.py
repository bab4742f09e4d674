"""A deployment's HITL policy (RFC 15.1, 15.3, 15.4): the decision window, what the deadline
applies, what happens when no operator can decide, the extension budget; and who may decide
an invocation (`authorize`)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Final

from apiary.core.hitl.validation import number
from apiary.core.hitl.vocabulary import (
    TimeoutAction,
    UnavailablePolicy,
    parse_timeout_action,
    parse_unavailable_policy,
)
from apiary.errors import PermissionDeniedError, ValidationError

ADMIN_ROLE: Final = "admin"
"""An operator holding this role may decide every invocation."""


@dataclass(frozen=True, slots=True)
class HitlPolicy:
    """Deployment policy for HITL invocations (RFC 15.1, 15.3, 15.4)."""

    default_timeout_s: float = 300.0
    timeout_action: TimeoutAction = TimeoutAction.DENY
    unavailable_policy: UnavailablePolicy = UnavailablePolicy.DENY_BY_DEFAULT
    auto_decide_threshold: float = 0.8
    """AUTO_DECIDE_THRESHOLD approves when the score (argument or context["score"]) >= this."""
    extend_s: float | None = None
    """EXTEND_TIMEOUT's extension; None: the invocation's original window (RFC: 1x)."""
    max_extensions: int = 3
    """Deferrals plus EXTEND_TIMEOUT extensions allowed per invocation."""
    defer_s: float | None = None
    """A deferral's extension; None: the invocation's original window."""
    enabled: bool = True
    """False: no HITL component (RFC 15.3); the engine applies `absent` right after `open`."""

    def __post_init__(self) -> None:
        for name in ("default_timeout_s", "extend_s", "defer_s"):
            value = getattr(self, name)
            if value is not None and not (number(value) and 0 < value < math.inf):
                raise ValidationError.for_field(f"hitl.{name}", "must be a positive duration")
        if not (number(self.auto_decide_threshold) and math.isfinite(self.auto_decide_threshold)):
            raise ValidationError.for_field("hitl.auto_decide_threshold", "must be a number")
        if isinstance(self.max_extensions, bool) or not isinstance(self.max_extensions, int):
            raise ValidationError.for_field("hitl.max_extensions", "must be an integer")
        if self.max_extensions < 0:
            raise ValidationError.for_field("hitl.max_extensions", "must be >= 0")
        object.__setattr__(self, "timeout_action", parse_timeout_action(self.timeout_action))
        object.__setattr__(
            self, "unavailable_policy", parse_unavailable_policy(self.unavailable_policy)
        )

    @classmethod
    def from_settings(cls, values: Mapping[str, Any]) -> HitlPolicy:
        """A policy from configuration values by field name; enum values may be strings."""
        known = {f.name for f in fields(cls)}
        for key in values:
            if key not in known:
                raise ValidationError.for_field(f"hitl.{key}", "is not a HITL policy setting")
        return cls(**values)


def authorize(operator_roles: Iterable[str], approver_roles: Iterable[str]) -> None:
    """Allow an operator to decide: no approver roles, an admin, or a shared role.

    Otherwise PermissionDeniedError naming the required roles (`details["missing_roles"]`).
    """
    held = _role_set(operator_roles)
    needed = _role_set(approver_roles)
    if not needed or ADMIN_ROLE in held or held & needed:
        return
    missing = ", ".join(sorted(needed))
    raise PermissionDeniedError(
        f"deciding this invocation needs one of the roles: {missing}",
        {"missing_roles": ",".join(sorted(needed))},
    )


def _role_set(roles: Iterable[str]) -> frozenset[str]:
    # A bare string is one role, not a set of one-letter roles.
    return frozenset((roles,) if isinstance(roles, str) else roles)
