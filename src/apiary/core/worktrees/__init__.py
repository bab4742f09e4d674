"""Worktrees (RFC 16): the binding record, the binding machine and the WORKTREE_CONTROL
payloads agents send and receive."""
