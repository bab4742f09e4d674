"""Converters between worktree bindings (core/worktrees/records.py) and their messages: the
canonical `sw4rm.worktree` responses and `apiary.v1.WorktreeBinding`."""

from __future__ import annotations

from pathlib import Path

from apiary.core.worktrees.records import BindingState, WorktreeBinding, working_location
from apiary.wire import pb
from apiary.wire.convert import float_to_timestamp

w = pb.worktree_pb2
a = pb.apiary_pb2


def status_response(binding: WorktreeBinding) -> w.StatusResponse:
    """The canonical StatusResponse: where the agent works now (in BIND_FAILED: the
    worktree its BIND asked for, so that the failure has a subject; unbound: empty)."""
    where = working_location(binding)
    if binding.state == BindingState.BIND_FAILED:
        where = binding.home
    return w.StatusResponse(
        repo_id=where.repo_id if where else "",
        worktree_id=where.worktree_id if where else "",
        state=binding.state,
    )


def bind_response(binding: WorktreeBinding) -> w.BindResponse:
    """ok for BOUND_HOME; otherwise `reason` is "<error code>: <what happened>"."""
    if binding.state == BindingState.BOUND_HOME:
        return w.BindResponse(ok=True)
    return w.BindResponse(ok=False, reason=f"{binding.reason}: {binding.note}")


def binding_to_proto(binding: WorktreeBinding, path: Path | None = None) -> a.WorktreeBinding:
    msg = a.WorktreeBinding(
        agent_id=binding.agent_id, state=binding.state, repo_id=binding.repo_id,
        worktree_id=binding.worktree_id, branch=binding.branch, commit_sha=binding.commit_sha,
        current_repo_id=binding.current_repo_id,
        current_worktree_id=binding.current_worktree_id,
        target_repo_id=binding.target_repo_id, target_worktree_id=binding.target_worktree_id,
        reason=binding.reason, note=binding.note, attempts=binding.attempts,
        invocation_id=binding.invocation_id, version=binding.version,
        path="" if path is None else str(path),
    )  # fmt: skip
    for name in ("retry_at", "recovery_at", "expires_at", "updated_at"):
        value = getattr(binding, name)
        if value:
            getattr(msg, name).CopyFrom(float_to_timestamp(value))
    return msg
