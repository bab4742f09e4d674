"""The protocol error for a worktree operation the binding's state does not allow (RFC 16).

The machine says only that (state, input) has no row; callers need to know why, in the
shared error vocabulary: one home per agent (already_exists), nothing bound
(worktree_not_bound), nothing pending or nothing to revoke (NOT_FOUND), anything else
(validation_error on `action`).
"""

from __future__ import annotations

from apiary.core.worktrees.machine import BindingInput
from apiary.core.worktrees.records import BindingState, WorktreeBinding
from apiary.errors import (
    AlreadyExistsError,
    ApiaryError,
    NotFoundError,
    ValidationError,
    WorktreeNotBoundError,
)

_S = BindingState
_I = BindingInput


def refusal(record: WorktreeBinding, event: BindingInput) -> ApiaryError:
    """The protocol error for an input the agent's state does not allow (nothing changed)."""
    state = BindingState(record.state)
    agent = record.agent_id
    details = {"agent_id": agent, "state": state.value}
    if event is _I.BIND_OK:
        return AlreadyExistsError(
            f"agent {agent} already has a home worktree ({record.home}, {state}); "
            "UNBIND first: one home per agent", details,
        )  # fmt: skip
    if state in (_S.UNBOUND, _S.BIND_FAILED):
        return WorktreeNotBoundError(f"agent {agent} is not bound to a worktree ({state})", details)
    if event is _I.SWITCH_REQUEST:
        return AlreadyExistsError(
            f"agent {agent} has a switch already ({state}); revoke or decide it first", details
        )
    if event in (_I.SWITCH_APPROVE, _I.SWITCH_REJECT):
        return NotFoundError(f"agent {agent} has no pending switch ({state})", details)
    if event is _I.SWITCH_REVOKE:
        return NotFoundError(f"agent {agent} is not in a non-home worktree ({state})", details)
    return ValidationError(
        f"agent {agent} cannot {event.value.lower()} in {state}; decide the pending switch first",
        {**details, "field": "action"},
    )
