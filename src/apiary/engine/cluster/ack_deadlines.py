"""ACK deadlines written to the store the replicas share (docs/cluster.md, "Timers").

On one coordinator an ACK deadline lives in memory (`engine/deadlines.py`). In a cluster
the replica that hands a message out is not always its partition's owner, which runs the
message's deadlines, and may die before the deadline passes: each deadline started or
stopped here (`Deadlines.on_ack`) is written behind to the message's row, a batch at a
time, where the owner finds it. A start is stored only while the message still awaits its
first ACK (`ClusterWork.set_ack_deadlines`), so a write that lands after the ACK's changes
nothing.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from apiary.store.cluster import ClusterWork
from apiary.store.errors import StoreError

log = logging.getLogger("apiary.cluster")

RETRY_S: Final = 0.5
"""The pause before writing again deadlines whose write failed."""


class AckDeadlineWriter:
    """The ACK deadlines started and stopped here, on their way to the store."""

    def __init__(self, work: ClusterWork) -> None:
        self._work = work
        self._pending: dict[str, float] = {}
        self._queued = asyncio.Event()

    def queue(self, message_id: str, due: float) -> None:
        """`Deadlines.on_ack`: the deadline of `message_id` is now `due` (0.0: none)."""
        self._pending.pop(message_id, None)  # (to the end: written in the order set)
        self._pending[message_id] = due
        self._queued.set()

    async def flush(self) -> None:
        """Write every deadline queued; on failure they stay queued (StoreError)."""
        if not self._pending:
            return
        batch, self._pending = self._pending, {}
        try:
            await self._work.set_ack_deadlines(list(batch.items()))
        except BaseException:
            batch.update(self._pending)  # (a newer value queued meanwhile wins)
            self._pending = batch
            raise

    async def run(self) -> None:
        """Until cancelled: write what is queued, together."""
        while True:
            await self._queued.wait()
            self._queued.clear()
            try:
                await self.flush()
            except StoreError as exc:
                log.warning("cluster: ACK deadlines not stored yet (retrying): %s", exc)
                await asyncio.sleep(RETRY_S)
                self._queued.set()
