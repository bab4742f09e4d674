"""The coordinator's event recorder: one append path for every transition and decision.

Every event goes to the store's event log and, as one structured JSON line, to the
`apiary.events` logger (DESIGN.md section 7). Live readers wait on `wait_after`.

An event that records a state change commits with it: the engine makes it a `draft` and
hands it to the store's write of the change (`MessageStore.apply`, `TaskStore.put`, ...)
through `commit`, which appends it in the same transaction, so that a committed state
always has its event and a failed write has neither. The events noted before it and not yet
appended go first in that transaction: the log keeps the order things were recorded in.
The store tells this recorder of every commit (`EventLog.listen`): the log line and the
wake-up of live readers follow from there, for those events and for the rest alike.

The rest, decisions and notes that change no stored state (`note`, `record`), do not wait
for the database: they are queued and go, in order, with the next state change's commit
(`commit` takes them first) or, when none comes within FLUSH_AFTER_S, by one flusher, many
per transaction: a burst costs one commit instead of one each, and a task's steps no commit
of their own. A store error does not
drop them: the flusher keeps them and tries again with a growing pause, and readers of this
recorder flush first (the coordinator flushes on shutdown).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, TypeVar

from apiary.core.clock import Clock
from apiary.core.events import Event, EventDraft, EventFilter
from apiary.store.protocols import EventLog

log = logging.getLogger("apiary.events")
T = TypeVar("T")

RETRY_FIRST_S: Final = 0.05
RETRY_MAX_S: Final = 2.0
"""The flusher's pause after a failed append doubles from the first to the largest."""
FLUSH_AFTER_S: Final = 0.005
"""How long noted events wait for a state change's commit to take them before the flusher
appends them in a transaction of their own."""


class EventRecorder:
    """Appends events with the injected clock's time and wakes live readers."""

    def __init__(self, events: EventLog, clock: Clock) -> None:
        self._events = events
        self._clock = clock
        self._changed = asyncio.Event()
        self._last = 0
        self._pending: list[EventDraft] = []
        self._flusher: asyncio.Task[None] | None = None
        self._hurry = asyncio.Event()
        """Set by `flush`: the flusher appends without waiting for FLUSH_AFTER_S."""
        self.counts: Counter[str] = Counter()
        """Events recorded by this process, by type (exported at /metrics)."""
        self.failed_appends = 0
        """Appends of the flusher that the store refused and that were tried again."""
        events.listen(self._committed)

    def draft(
        self,
        event_type: str,
        actor: str,
        *,
        correlation_id: str = "",
        agent_id: str = "",
        **details: Any,
    ) -> EventDraft:
        """The event of a state change, stamped now, for the store to commit with the change
        (counted here; logged once committed)."""
        self.counts[event_type] += 1
        return EventDraft(event_type, actor, self._clock.now(), correlation_id, agent_id, details)

    async def record(
        self,
        event_type: str,
        actor: str,
        *,
        correlation_id: str = "",
        agent_id: str = "",
        **details: Any,
    ) -> None:
        self.note(event_type, actor, correlation_id=correlation_id, agent_id=agent_id, **details)

    def note(
        self,
        event_type: str,
        actor: str,
        *,
        correlation_id: str = "",
        agent_id: str = "",
        **details: Any,
    ) -> None:
        """`record` for synchronous callers (recording never waits in either form)."""
        self.queue(
            self.draft(
                event_type, actor, correlation_id=correlation_id, agent_id=agent_id, **details
            )
        )

    async def commit(
        self, drafts: Sequence[EventDraft], write: Callable[[list[EventDraft]], Awaitable[T]]
    ) -> T:
        """`write` (a store write that appends the events it is given in its transaction)
        with the events noted so far and not yet appended, then `drafts`. When it fails, those
        noted events go back to the flusher; when one of them is malformed (ValueError: it
        can never be stored), `write` runs again with `drafts` alone. A write whose outcome
        is unknown (a lost connection, a cancelled caller) may still have committed them:
        they are kept rather than risk losing them, so such a write may log them twice."""
        taken, self._pending = self._pending, []
        if not taken:
            return await write(list(drafts))
        try:
            return await write([*taken, *drafts])
        except ValueError:
            self._give_back(taken)
            return await write(list(drafts))
        except BaseException:
            self._give_back(taken)
            raise

    def _give_back(self, taken: list[EventDraft]) -> None:
        self._pending[:0] = taken
        self._wake_flusher()

    def queue(self, draft: EventDraft | None) -> None:
        """Append a `draft` by the flusher (None: nothing), as `note` does."""
        if draft is None:
            return
        self._pending.append(draft)
        self._wake_flusher()

    def _wake_flusher(self) -> None:
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.ensure_future(self._flush_pending())

    async def _flush_pending(self) -> None:
        pause = RETRY_FIRST_S
        # Noted events usually ride with the next state change's commit (`commit` takes
        # them): the flusher appends only those no commit took within FLUSH_AFTER_S, unless
        # a reader wants them now (`flush`).
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(FLUSH_AFTER_S):
                await self._hurry.wait()
        self._hurry.clear()
        while self._pending:
            batch, self._pending = self._pending, []
            try:
                await self._events.append(batch)
            except ValueError:
                await self._append_one_by_one(batch)
            except Exception as exc:
                # Kept, in order, ahead of what was noted since: tried again after a pause.
                self._pending[:0] = batch
                self.failed_appends += 1
                log.warning(
                    "could not append %d events to the event log (trying again in %.2f s): %s",
                    len(batch), pause, exc,
                )  # fmt: skip
                await asyncio.sleep(pause)
                pause = min(pause * 2, RETRY_MAX_S)
            else:
                pause = RETRY_FIRST_S

    async def _append_one_by_one(self, batch: list[EventDraft]) -> None:
        """A batch the log refused as malformed: each draft alone, so that only the one that
        is not JSON is left out (it can never be stored)."""
        for draft in batch:
            try:
                await self._events.append([draft])
            except ValueError as exc:
                log.error("event %s left out of the event log: %s", draft.event_type, exc)

    def _committed(self, events: Sequence[Event]) -> None:
        """The store committed `events` (see EventLog.listen): log them, wake readers."""
        if not events:
            return
        if log.isEnabledFor(logging.INFO):
            for event in events:
                log.info(json.dumps(_as_json(event), separators=(",", ":"), default=str))
        last = events[-1].sequence
        if last > self._last:
            self._last = last
            changed, self._changed = self._changed, asyncio.Event()
            changed.set()

    async def flush(self) -> None:
        """Return once every event recorded so far is in the store."""
        self._hurry.set()
        while self._flusher is not None and not self._flusher.done():
            await asyncio.shield(self._flusher)
        if self._pending:
            self._wake_flusher()
            assert self._flusher is not None
            await self._flusher

    async def close(self, timeout_s: float = 10.0) -> None:
        """`flush` at shutdown, for at most `timeout_s` while the store refuses the appends:
        then what is left is logged as lost (it cannot be stored by a process that ends)."""
        try:
            async with asyncio.timeout(timeout_s):
                await self.flush()
        except TimeoutError:
            left = len(self._pending)
            if self._flusher is not None:
                self._flusher.cancel()
            log.error("%d events were not stored: the event log kept refusing them", left)

    async def read(
        self, after: int = 0, limit: int = 500, where: EventFilter | None = None
    ) -> list[Event]:
        await self.flush()
        return await self._events.read(after=after, limit=limit, where=where)

    async def last_sequence(self) -> int:
        await self.flush()
        return await self._events.last_sequence()

    @property
    def last_committed(self) -> int:
        """The highest sequence `wait_after` has seen committed (no store read)."""
        return self._last

    async def wait_after(self, sequence: int) -> None:
        """Return once an event with a sequence above `sequence` was committed here."""
        while self._last <= sequence:
            await self._changed.wait()


def _as_json(event: Event) -> dict[str, Any]:
    return {
        "seq": event.sequence,
        "ts": event.ts,
        "type": event.event_type,
        "actor": event.actor,
        "correlation_id": event.correlation_id,
        "agent_id": event.agent_id,
        "details": dict(event.details),
    }
