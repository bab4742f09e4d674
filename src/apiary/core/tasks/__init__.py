"""Tasks (RFC 7, 9): the task lifecycle machine and the per-agent priority queues."""
