"""The one state an agent is shown in (core/agent_state.py), over every lifecycle state and
the registry's states that matter: the Scheduler's FAILED and SHUTTING_DOWN come first,
presence's UNAVAILABLE next, then the lifecycle; an untracked agent shows its record."""

from __future__ import annotations

import pytest

from apiary.core.agent_lifecycle import AgentLifecycleState
from apiary.core.agent_state import UNAVAILABLE, shown_state

S = AgentLifecycleState
DECIDED = {S.FAILED, S.SHUTTING_DOWN}


@pytest.mark.parametrize("lifecycle", list(S))
@pytest.mark.parametrize("registered", ["RUNNABLE", "RUNNING", "FAILED_STATE", UNAVAILABLE])
def test_every_pair_follows_the_rule(registered: str, lifecycle: AgentLifecycleState) -> None:
    shown = shown_state(registered, lifecycle)
    if lifecycle in DECIDED:
        assert shown == lifecycle.value
    elif registered == UNAVAILABLE:
        assert shown == UNAVAILABLE
    else:
        assert shown == lifecycle.value


def test_an_agent_failed_after_its_recovery_timed_out_is_failed_not_unavailable() -> None:
    # What the console showed before: presence had marked it UNAVAILABLE meanwhile.
    assert shown_state(UNAVAILABLE, S.FAILED) == "FAILED"
    assert shown_state(UNAVAILABLE, S.RECOVERING) == UNAVAILABLE  # it may still come back


def test_an_agent_the_lifecycle_does_not_track_shows_its_record() -> None:
    assert shown_state("RUNNABLE", None) == "RUNNABLE"
    assert shown_state(UNAVAILABLE, None) == UNAVAILABLE
    assert shown_state("FAILED_STATE", None) == "FAILED"  # the proto's name, read as the RFC's
