"""A tenant's quota refused (RFC 6.5, DESIGN.md section 9): one wording, whoever counts
(the coordinator's memory before a call, `server.quotas`, or in cluster mode the store in
the admitting transaction, `core.admission_bounds`)."""

from __future__ import annotations

from typing import Final

from apiary.errors import QuotaExceededError

QUEUED_MESSAGES: Final = "queued_messages"
REMEDIES: Final = {
    "agents": "deregister agents",
    QUEUED_MESSAGES: "let recipients read their messages",
    "tasks": "let tasks finish or cancel some",
    "stored_bytes": "let retention purge",
}
"""How a tenant gets room again under each limit."""


def quota_exceeded(
    tenant: str, limit: str, used: int, allowed: int, *, adding: int = 1
) -> QuotaExceededError:
    """The refusal of `tenant`'s call that would go past `limit` (`used` of `allowed`), by
    `adding` more at once (a SubmitTasks call's items)."""
    if adding > 1 and used < allowed:
        said = (
            f"tenant {tenant}'s {limit} quota has room for {allowed - used} more ({used} of "
            f"{allowed} used), not the {adding} of this call: send fewer, "
        )
    else:
        said = f"tenant {tenant} has used its {limit} quota ({used} of {allowed}): "
    return QuotaExceededError(
        f"{said}{REMEDIES[limit]}, or an operator raises [auth.quotas.{tenant}] {limit}",
        {"tenant": tenant, "limit": limit, "used": str(used), "allowed": str(allowed)},
    )
