"""Whether the coordinator's store can be reached, followed by a light probe: gRPC health
and /readyz say NOT_SERVING / not ready while it cannot (load balancers then send calls to
another replica, clients back off), and SERVING again once it can: honest answers under
store faults."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from apiary.engine.deadlines import Sleep
from apiary.store.errors import StoreError
from apiary.store.protocols import Store

log = logging.getLogger("apiary.store")

PROBE_EVERY_S = 2.0
PROBE_TIMEOUT_S = 5.0


class StoreHealth:
    def __init__(
        self,
        store: Store,
        on_change: Callable[[bool], Awaitable[None]],
        sleep: Sleep,
        *,
        every_s: float = PROBE_EVERY_S,
        timeout_s: float = PROBE_TIMEOUT_S,
    ) -> None:
        self._store = store
        self._on_change = on_change
        self._sleep = sleep
        self._every_s = every_s
        self._timeout_s = timeout_s
        self.reachable = True

    async def probe(self) -> bool:
        """One probe; tells `on_change` when reachability changed. Returns it."""
        try:
            async with asyncio.timeout(self._timeout_s):
                await self._store.ping()
            reachable = True
        except (StoreError, OSError, TimeoutError) as exc:
            reachable = False
            if self.reachable:
                log.error("the store cannot be reached: %s", str(exc).splitlines()[0][:300])
        if reachable != self.reachable:
            self.reachable = reachable
            if reachable:
                log.warning("the store can be reached again")
            await self._on_change(reachable)
        return reachable

    async def run(self) -> None:
        """Probe forever (a task the coordinator cancels at shutdown)."""
        while True:
            await self._sleep(self._every_s)
            await self.probe()
