"""Subagents (spawn_subagent ... list_subagents): a subagent is a child thread of the same
session, bound to its own agent and linked to the thread (and turn) that spawned it; its
input is a turn on the child thread, its end that turn's end, and closing it interrupts
its work and closes the thread to new turns. Pure: the contract's events and views of
child threads; the control plane (controlplane/subagents.py) stores and runs them.

A subagent's events go to its parent's thread (`subagentId` the child thread id): the
parent's stream says what its children do (`subagent.spawned`, `subagent.input`,
`subagent.completed` or `subagent.failed` as each child turn ends, `subagent.closed`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from apiary.core.dedup import iso_utc
from apiary.core.runtime.events import RuntimeEventType
from apiary.core.runtime.log import Fact
from apiary.core.runtime.records import ThreadRecord, TurnRecord, TurnState

_T = RuntimeEventType
SETTLED: Final = frozenset({"idle", "completed", "failed", "cancelled"})
"""Thread statuses with no turn running or waiting: wait_subagents returns at them."""


def subagent_fact(
    kind: str, child: ThreadRecord, payload: Mapping[str, Any], turn_id: str = ""
) -> Fact:
    """An event of `child` on its parent's thread."""
    return Fact(
        kind, child.session_id, child.parent_thread_id, child.parent_turn_id or turn_id,
        status=child.status,
        payload={**({"capability": child.capability} if child.capability else
                    {"agentId": child.agent_id}), **payload},
        agent_id=child.agent_id, extra={"subagentId": child.thread_id},
    )  # fmt: skip


def ended_fact(turn: TurnRecord, child: ThreadRecord) -> Fact:
    """`subagent.completed` or `subagent.failed` as a child's turn ends."""
    completed = turn.state == TurnState.COMPLETED
    payload: dict[str, Any] = {"turnId": turn.turn_id, "turnStatus": turn.state}
    if not completed:
        payload["error"] = {"code": turn.error_code, "message": turn.message}
    kind = _T.SUBAGENT_COMPLETED if completed else _T.SUBAGENT_FAILED
    return subagent_fact(kind, child, payload)


def subagent_view(child: ThreadRecord, last: TurnRecord | None = None) -> dict[str, Any]:
    """A child thread as list_subagents and wait_subagents show it."""
    found: dict[str, Any] = {
        "subagentId": child.thread_id, "threadId": child.thread_id,
        **({"capability": child.capability} if child.capability else
           {"agentId": child.agent_id}),
        "parentThreadId": child.parent_thread_id, "status": child.status,
        "closed": child.closed_at > 0, "settled": child.status in SETTLED,
        "createdAt": iso_utc(child.created_at),
    }  # fmt: skip
    if child.parent_turn_id:
        found["parentTurnId"] = child.parent_turn_id
    if child.role:
        found["role"] = child.role
    if child.closed_at:
        found["closedAt"] = iso_utc(child.closed_at)
    if last is not None:
        found["lastTurn"] = {"turnId": last.turn_id, "status": last.state}
        if last.error_code:
            found["lastTurn"]["error"] = {"code": last.error_code, "message": last.message}
    return found


def graph(threads: Sequence[ThreadRecord]) -> list[dict[str, str]]:
    """The parent -> child edges among `threads`."""
    return [
        {"parentThreadId": t.parent_thread_id, "childThreadId": t.thread_id}
        for t in threads
        if t.parent_thread_id
    ]
