"""One live stream per agent across replicas (docs/cluster.md, "One stream per agent").

On one coordinator a newer stream of an agent supersedes the older one when its caller
proved it is the agent (`take_over`), and is refused while the older one is live otherwise
(`engine.router.delivery`). In cluster mode the streams may be on two replicas, so the
store decides: each agent has one holder row (the replica whose stream is the agent's live
one, and a generation that grows by one with each stream granted). A stream that opens
asks for the row; this table says what it gets, from how the row stands for the replica
asking. Pure: the store locks the row, reads whether its holder is live, and writes back
what `claim_stream` returned.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class HolderStanding(Enum):
    """How an agent's holder row stands for the replica asking."""

    FREE = "FREE"
    """No replica holds it (never held, or its last stream ended)."""
    MINE = "MINE"
    """This replica (this start of it) holds it: the replica's own streams decided already."""
    LIVE_OTHER = "LIVE_OTHER"
    """Another replica holds it and beats: its stream is live."""
    GONE_OTHER = "GONE_OTHER"
    """Another replica, or an earlier start of this one, holds it and no longer beats: its
    stream went with it."""


class StreamVerdict(Enum):
    GRANTED = "GRANTED"
    """The stream is the agent's live one (a new generation)."""
    SUPERSEDES = "SUPERSEDES"
    """Granted, and the live stream on the holder's replica is superseded (told to end)."""
    REFUSED = "REFUSED"
    """Another replica's stream is live and the caller did not prove it is the agent."""


@dataclass(frozen=True, slots=True)
class StreamHolder:
    """An agent's holder row: `replica_id` empty when free."""

    agent_id: str
    replica_id: str
    incarnation: str
    generation: int


def standing(found: StreamHolder, replica_id: str, incarnation: str, live: bool) -> HolderStanding:
    """How `found` stands for the replica `replica_id` (start `incarnation`); `live`: its
    holder's heartbeat has not expired."""
    if not found.replica_id:
        return HolderStanding.FREE
    if found.replica_id == replica_id and found.incarnation == incarnation:
        return HolderStanding.MINE
    return HolderStanding.LIVE_OTHER if live else HolderStanding.GONE_OTHER


_TABLE: dict[tuple[HolderStanding, bool], StreamVerdict] = {
    (HolderStanding.FREE, False): StreamVerdict.GRANTED,
    (HolderStanding.FREE, True): StreamVerdict.GRANTED,
    (HolderStanding.MINE, False): StreamVerdict.GRANTED,
    (HolderStanding.MINE, True): StreamVerdict.GRANTED,
    (HolderStanding.GONE_OTHER, False): StreamVerdict.GRANTED,
    (HolderStanding.GONE_OTHER, True): StreamVerdict.GRANTED,
    (HolderStanding.LIVE_OTHER, False): StreamVerdict.REFUSED,
    (HolderStanding.LIVE_OTHER, True): StreamVerdict.SUPERSEDES,
}


@dataclass(frozen=True, slots=True)
class StreamClaim:
    """What a stream that opens gets: the verdict, and the row as it stands after it (the
    new holder and generation when granted; the live holder when refused)."""

    verdict: StreamVerdict
    holder: StreamHolder
    previous: StreamHolder

    @property
    def granted(self) -> bool:
        return self.verdict is not StreamVerdict.REFUSED


def claim_stream(
    found: StreamHolder, replica_id: str, incarnation: str, live: bool, take_over: bool
) -> StreamClaim:
    """The claim of a stream of `found.agent_id` opening on `replica_id` (its start
    `incarnation`), `take_over` when its caller proved it is the agent."""
    verdict = _TABLE[(standing(found, replica_id, incarnation, live), take_over)]
    if verdict is StreamVerdict.REFUSED:
        return StreamClaim(verdict, found, found)
    holder = StreamHolder(found.agent_id, replica_id, incarnation, found.generation + 1)
    return StreamClaim(verdict, holder, found)
