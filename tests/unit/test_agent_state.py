"""The one state an agent is shown in (core/agent_state.py), over every lifecycle state and
the registry's states that matter: the Scheduler's FAILED and SHUTTING_DOWN come first,
presence's UNAVAILABLE next, then the lifecycle; an untracked agent shows its record."""

from __future__ import annotations

import pytest

from apiary.core.agent_lifecycle import AgentLifecycleState
from apiary.core.agent_state import UNAVAILABLE, shown_state

S = AgentLifecycleState
REGISTERED = ("RUNNABLE", "RUNNING", "FAILED_STATE", "UNAVAILABLE")
SHOWN: dict[AgentLifecycleState | None, tuple[str, str, str, str]] = {
    # lifecycle:         registry RUNNABLE, RUNNING, FAILED_STATE, UNAVAILABLE
    S.INITIALIZING: ("INITIALIZING", "INITIALIZING", "INITIALIZING", "UNAVAILABLE"),
    S.RUNNABLE: ("RUNNABLE", "RUNNABLE", "RUNNABLE", "UNAVAILABLE"),
    S.SCHEDULED: ("SCHEDULED", "SCHEDULED", "SCHEDULED", "UNAVAILABLE"),
    S.RUNNING: ("RUNNING", "RUNNING", "RUNNING", "UNAVAILABLE"),
    S.WAITING: ("WAITING", "WAITING", "WAITING", "UNAVAILABLE"),
    S.WAITING_RESOURCES: (
        "WAITING_RESOURCES", "WAITING_RESOURCES", "WAITING_RESOURCES", "UNAVAILABLE",
    ),
    S.SUSPENDED: ("SUSPENDED", "SUSPENDED", "SUSPENDED", "UNAVAILABLE"),
    S.RESUMED: ("RESUMED", "RESUMED", "RESUMED", "UNAVAILABLE"),
    S.COMPLETED: ("COMPLETED", "COMPLETED", "COMPLETED", "UNAVAILABLE"),
    S.FAILED: ("FAILED", "FAILED", "FAILED", "FAILED"),
    S.SHUTTING_DOWN: ("SHUTTING_DOWN", "SHUTTING_DOWN", "SHUTTING_DOWN", "SHUTTING_DOWN"),
    S.RECOVERING: ("RECOVERING", "RECOVERING", "RECOVERING", "UNAVAILABLE"),
    None: ("RUNNABLE", "RUNNING", "FAILED", "UNAVAILABLE"),  # untracked: the record
}  # fmt: skip


def test_the_table_covers_every_lifecycle_state() -> None:
    assert set(SHOWN) == {*S, None}


@pytest.mark.parametrize(
    ("lifecycle", "registered", "shown"),
    [(life, reg, row[i]) for life, row in SHOWN.items() for i, reg in enumerate(REGISTERED)],
)
def test_every_pair_shows_the_state_the_table_says(
    lifecycle: AgentLifecycleState | None, registered: str, shown: str
) -> None:
    assert shown_state(registered, lifecycle) == shown


def test_an_agent_failed_after_its_recovery_timed_out_is_failed_not_unavailable() -> None:
    # What the console showed before: presence had marked it UNAVAILABLE meanwhile.
    assert shown_state(UNAVAILABLE, S.FAILED) == "FAILED"
    assert shown_state(UNAVAILABLE, S.RECOVERING) == UNAVAILABLE  # it may still come back


def test_an_agent_the_lifecycle_does_not_track_shows_its_record() -> None:
    assert shown_state("RUNNABLE", None) == "RUNNABLE"
    assert shown_state(UNAVAILABLE, None) == UNAVAILABLE
    assert shown_state("FAILED_STATE", None) == "FAILED"  # the proto's name, read as the RFC's
