"""One live stream per agent across replicas (docs/cluster.md, "One stream per agent"): the
store's holder rows as one replica keeps them.

A stream opening here claims its agent's row (`claim`): granted, it is the agent's live
stream and this replica remembers the generation it got; refused (another replica's stream
is live and the caller did not prove it is the agent), the stream is refused as on one
coordinator, after the same wait for the other to end. A claim that supersedes a stream on
another replica tells that replica (a note); the superseded replica finds, in the note or at
its next poll (`superseded`), that the row is no longer its generation, and ends its
streams of the agent (`Inbox.supersede`). When the agent's last stream here ends, the row is
freed (`release`) unless a newer stream took it since.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Final

from apiary.engine.router.delivery import STREAM_RELEASE_WAIT_S
from apiary.engine.router.router import Router
from apiary.errors import AlreadyInProgressError
from apiary.store.cluster import Me, StreamHolders

RETRY_S: Final = 0.1
"""How often a refused claim asks again while it waits for the other stream to end."""


class StreamHolds:
    """The holder rows of the agents streaming on this replica (module docstring). Callers
    serialize calls for one agent (the follower's per-agent lock)."""

    def __init__(self, router: Router, holders: StreamHolders, me: Me) -> None:
        self._router = router
        self._holders = holders
        self._me = me
        self._held: dict[str, int] = {}
        """Agent -> the generation of its row this replica holds."""

    def held(self) -> list[str]:
        """The agents whose live stream is this replica's."""
        return list(self._held)

    async def claim(self, agent_id: str, take_over: bool) -> None:
        """Claim `agent_id`'s row for a stream opening here; AlreadyInProgressError, naming
        the replica, when another replica's live stream keeps it for STREAM_RELEASE_WAIT_S."""
        loop = asyncio.get_running_loop()
        until = loop.time() + STREAM_RELEASE_WAIT_S
        while True:
            claim = await self._holders.claim(self._me, agent_id, take_over)
            if claim.granted:
                self._held[agent_id] = claim.holder.generation
                return
            if loop.time() >= until:
                break
            await asyncio.sleep(RETRY_S)
        raise AlreadyInProgressError(
            f"{agent_id} already has a live stream on replica {claim.holder.replica_id}; a "
            "second one is refused. A reconnecting agent takes the stream over by proving it "
            "is the agent (its credential or an apiary-agent-proof), or once the old "
            "connection has closed",
            {"agent_id": agent_id, "reason": "stream_live", "replica": claim.holder.replica_id},
        )

    async def release(self, agent_id: str) -> None:
        """The agent's last stream here ended: free its row, unless a newer stream took it."""
        generation = self._held.get(agent_id)
        if generation is not None:
            await self._holders.release(self._me, agent_id, generation)
            # (Kept when the store failed: the follower's next poll releases it again.)
            if self._held.get(agent_id) == generation:
                del self._held[agent_id]

    async def superseded(self, agent_ids: Iterable[str]) -> list[str]:
        """Those of `agent_ids` held here whose row now names a newer stream (read from the
        store)."""
        held = [a for a in agent_ids if a in self._held]
        rows = await self._holders.holders(held)
        me = self._me
        return [
            agent_id
            for agent_id in held
            if (row := rows.get(agent_id)) is None
            or (row.replica_id, row.incarnation, row.generation)
            != (me.replica_id, me.incarnation, self._held[agent_id])
        ]

    def supersede(self, agent_id: str) -> None:
        """End this replica's streams of `agent_id`: a newer one is live elsewhere."""
        # Whether or not its stream counts as streaming yet: a stream that claimed the row
        # has its session (the claim and `Inbox.open_session` run without a pause between).
        if self._held.pop(agent_id, None) is not None:
            self._router.inbox(agent_id).supersede()
