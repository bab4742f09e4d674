"""Worktrees (RFC 16): bindings of agents to git worktrees, approvals, control and the git side."""
