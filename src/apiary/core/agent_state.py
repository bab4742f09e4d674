"""The one state an agent is shown in: DiscoveryService's `state`, which the operator console
and `apiary status` both show.

Two parts of the coordinator know where an agent stands. The Scheduler's lifecycle (RFC 8,
`engine/lifecycle.py`) decides what the agent is doing and whether it failed; presence (RFC 14,
`engine/presence.py`) marks a registered agent UNAVAILABLE in the registry when it stops
answering heartbeats (the registry's record otherwise keeps the state the agent last
reported). Shown separately they contradict each other: an agent whose recovery timed out is
FAILED to the Scheduler and UNAVAILABLE to presence, since a failed agent usually stopped
answering too. One rule decides:

- FAILED and SHUTTING_DOWN come from the lifecycle first: they are decisions about the agent
  (it failed for good and waits for an operator; it is leaving), which missing heartbeats only
  confirm.
- Otherwise UNAVAILABLE when presence lost the agent: whatever the lifecycle expects of it,
  it does not answer.
- Otherwise the lifecycle's state.
- An agent the lifecycle does not track (registered directly with the registry, or another
  replica's) shows the registry's state, the proto name FAILED_STATE read as FAILED.
"""

from __future__ import annotations

from typing import Final

from apiary.core.agent_lifecycle import PROTO_NAMES, AgentLifecycleState

UNAVAILABLE: Final = "UNAVAILABLE"
"""The registry's state for an agent that stopped answering heartbeats (presence)."""
_S = AgentLifecycleState
_DECIDED: Final = frozenset({_S.FAILED, _S.SHUTTING_DOWN})
_BY_PROTO_NAME: Final = {name: state.value for state, name in PROTO_NAMES.items()}


def shown_state(registered: str, lifecycle: AgentLifecycleState | None) -> str:
    """The state to show for an agent whose registry record says `registered` and whose
    lifecycle (None: not tracked) is `lifecycle`."""
    if lifecycle is None:
        return _BY_PROTO_NAME.get(registered, registered)
    if lifecycle in _DECIDED:
        return lifecycle.value
    if registered == UNAVAILABLE:
        return UNAVAILABLE
    return lifecycle.value
