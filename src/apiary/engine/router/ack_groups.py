"""Frames of agents' ACKs from several streams applied together (`MessageLifecycle.
acknowledge_frame`).

Each agent's send stream hands the router its ACK frames one at a time, in order. With
several agents at work (task runners, say), their frames arrive together, and each applied
alone is a commit and, for the Scheduler's DATA, a turn of the Scheduler's lock, one frame
after the other. Here the frames that arrive while one is being applied wait for it and are
then applied as one frame: one commit and one turn of the lock for all of them, each frame
still answered with its own ACKs' outcomes. A frame that arrives while none is being applied
is applied at once, as before. One stream's frames never meet in a group (its next frame is
read once this one is answered), so each stream's ACKs keep their order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from apiary.core.envelope import Envelope
from apiary.errors import ApiaryError

Acks = Sequence[tuple[int, Envelope]]
"""A frame's ACKs, each by its caller's key."""
Applied = dict[int, str | ApiaryError]
"""By key: where the ACK is forwarded, or the error that refuses it (absent: left out)."""
Apply = Callable[[Acks, float], Awaitable[Applied]]


@dataclass(slots=True)
class _Waiting:
    acks: Acks
    now: float
    answer: asyncio.Future[Applied] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class AckGroups:
    """Applies frames through `apply`, one at a time, those that waited together."""

    def __init__(self, apply: Apply) -> None:
        self._apply = apply
        self._waiting: list[_Waiting] = []
        self._busy = False
        self._runner: asyncio.Task[None] | None = None

    async def acknowledge(self, acks: Acks, now: float) -> Applied:
        """The frame's outcomes, by key, once applied (alone, or with the frames that waited
        with it)."""
        if self._busy:
            waiting = _Waiting(acks, now)
            self._waiting.append(waiting)
            return await waiting.answer
        self._busy = True
        try:
            return await self._apply(acks, now)
        finally:
            self._next()

    def _next(self) -> None:
        """The frames that waited meanwhile are applied next, together; else none is busy."""
        if self._waiting:
            self._runner = asyncio.ensure_future(self._run_waiting())
        else:
            self._busy = False

    async def _run_waiting(self) -> None:
        group, self._waiting = self._waiting, []
        try:
            merged: list[tuple[int, Envelope]] = []
            owners: list[tuple[_Waiting, int]] = []
            for waiting in group:
                for key, env in waiting.acks:
                    merged.append((len(owners), env))
                    owners.append((waiting, key))
            try:
                applied = await self._apply(merged, max(w.now for w in group))
            except BaseException as exc:
                for waiting in group:
                    _fail(waiting.answer, exc)
                if not isinstance(exc, Exception):
                    raise
                return
            answers: dict[int, Applied] = {id(w): {} for w in group}
            for index, outcome in applied.items():
                waiting, key = owners[index]
                answers[id(waiting)][key] = outcome
            for waiting in group:
                if not waiting.answer.done():
                    waiting.answer.set_result(answers[id(waiting)])
        finally:
            self._next()


def _fail(answer: asyncio.Future[Applied], exc: BaseException) -> None:
    if answer.done():
        return
    if isinstance(exc, asyncio.CancelledError):
        answer.cancel()
    else:
        answer.set_exception(exc)
