"""The storage conformance suite: one set of checks that every backend must pass.

A check is an async function of a `StoreFactory`; it opens the store (more than once when it
tests persistence), uses only the public protocols of `apiary.store.protocols`, and fails
with AssertionError. The suite does not depend on pytest: a test module runs every check in
`CHECKS` against every backend (see tests/store/test_store_conformance.py), and a new
backend is conformant when it passes them all. A check that does not apply to a backend
raises `CheckNotApplicable` (the runner reports it as skipped).

Each check expects the factory to start from empty storage, and every `open()` of one
factory to reach the same storage (for a durable backend: the same file, the same schema).
Checks of a new aggregate go in a module of their own here, added to `CHECKS`.
"""

from __future__ import annotations

from apiary.testing.store_suite import (
    agents,
    dlq,
    events,
    handoffs,
    hitl,
    idempotency,
    message_deadlines,
    message_retention,
    messages,
    negotiations,
    rooms,
    runtime,
    runtime_jobs,
    runtime_tasks,
    swarm,
    tasks,
    tools,
    whole_store,
    workflows,
    worktrees,
)
from apiary.testing.store_suite.base import Check, CheckNotApplicable, StoreFactory

CHECKS: list[Check] = [
    *whole_store.CHECKS,
    *events.CHECKS,
    *agents.CHECKS,
    *messages.CHECKS,
    *message_deadlines.CHECKS,
    *message_retention.CHECKS,
    *idempotency.CHECKS,
    *dlq.CHECKS,
    *hitl.CHECKS,
    *tasks.CHECKS,
    *workflows.CHECKS,
    *handoffs.CHECKS,
    *worktrees.CHECKS,
    *rooms.CHECKS,
    *tools.CHECKS,
    *negotiations.CHECKS,
    *swarm.CHECKS,
    *runtime.CHECKS,
    *runtime_tasks.CHECKS,
    *runtime_jobs.CHECKS,
]
"""Every check of the suite."""

__all__ = ["CHECKS", "Check", "CheckNotApplicable", "StoreFactory"]
