"""An agent's worktree (RFC 16) as the SDK hands it out: the binding and a confined file API.

    workspace = await agent.bind_worktree("shop", "coder-home")
    text = workspace.files.read_text("src/app.py")       # resolved beneath the worktree root
    workspace.files.write_text("src/app.py", fixed)      # atomic; traversal refused
    await agent.unbind_worktree()

`files` is an `apiary.confined.ConfinedRoot` over the worktree's directory (docs/
confinement.md), so `..`, absolute paths, symlinks and device nodes are refused with
permission_denied. The directory is the coordinator's git worktree, so this works for agents
on the coordinator's machine (the default deployment).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from apiary.confined import ConfinedRoot
from apiary.errors import error_for_code
from apiary.wire import pb

BOUND_STATES = frozenset({"BOUND_HOME", "BOUND_NON_HOME", "SWITCH_PENDING"})


@dataclass(slots=True)
class Workspace:
    """A bound worktree: where it is, what it is, and the confined way to its files."""

    repo_id: str
    worktree_id: str
    branch: str
    state: str
    path: Path
    files: ConfinedRoot

    def close(self) -> None:
        self.files.close()


def workspace_from(binding: pb.apiary_pb2.WorktreeBinding) -> Workspace:
    """The workspace of a binding; the binding's error (BIND_FAILED reason) otherwise."""
    if binding.state not in BOUND_STATES:
        code = binding.reason or "worktree_not_bound"
        raise error_for_code(
            code,
            f"{binding.agent_id} is {binding.state} ({binding.note or code})",
            {"agent_id": binding.agent_id, "repo_id": binding.repo_id,
             "worktree_id": binding.worktree_id},
        )  # fmt: skip
    repo_id = binding.current_repo_id or binding.repo_id
    worktree_id = binding.current_worktree_id or binding.worktree_id
    path = Path(binding.path)
    return Workspace(repo_id, worktree_id, binding.branch, binding.state, path, ConfinedRoot(path))
