"""A thread's queue order (docs/control-plane.md): its queued turns by `queue_key`
(queue_rank, ordinal). A turn is submitted with rank 0, so it queues behind every turn
before it; `promoted` moves one turn ahead by ranking the whole queue anew (-n .. -1), which
keeps turns submitted later (rank 0) behind it; `head_rank` places a turn before all of them
(resume_thread's turn). Pure: the control plane stores what these return."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from apiary.core.runtime.records import TurnRecord, TurnState, queue_key


def queue_of(turns: Sequence[TurnRecord]) -> list[TurnRecord]:
    """The queued turns of `turns` (one thread's), in queue order."""
    return sorted((t for t in turns if t.state == TurnState.QUEUED), key=queue_key)


def promoted(queue: Sequence[TurnRecord], turn_id: str, before: str = "") -> list[TurnRecord]:
    """The queue (in queue order) with `turn_id` moved just ahead of `before` (the head when
    ''), every turn ranked anew; ValueError when either is not in it or they are the same.
    A turn that is already there keeps its place (the order is the same)."""
    ids = [t.turn_id for t in queue]
    if turn_id not in ids:
        raise ValueError(f"turn {turn_id!r} is not queued")
    if before and before not in ids:
        raise ValueError(f"turn {before!r} is not queued")
    if before == turn_id:
        raise ValueError("a turn cannot move ahead of itself")
    moving = queue[ids.index(turn_id)]
    rest = [t for t in queue if t.turn_id != turn_id]
    at = 0 if not before else next(i for i, t in enumerate(rest) if t.turn_id == before)
    if at >= ids.index(turn_id):  # ahead of `before` already: it stays where it is
        return list(queue)
    order = [*rest[:at], moving, *rest[at:]]
    count = len(order)
    return [replace(t, queue_rank=i - count) for i, t in enumerate(order)]


def head_rank(queue: Sequence[TurnRecord]) -> int:
    """A rank that queues a turn ahead of every turn of `queue`."""
    return min((t.queue_rank for t in queue), default=0) - 1
