"""The cluster's lease table as the engine sees it (DESIGN.md section 8, docs/cluster.md):
replicas beating, partitions leased with an expiry and a fencing epoch.

Cluster mode is PostgreSQL only (several coordinators share a database server; SQLite is
one process's file), so `store.postgres.cluster.PostgresClusterLeases` is the one
implementation; the protocol is what the lease keeper (`engine.cluster.keeper`) needs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from apiary.core.cluster.assignment import ClusterView
from apiary.core.cluster.leases import Lease, LeaseAction, Verdict
from apiary.core.cluster.streams import StreamClaim, StreamHolder
from apiary.core.records import StoredMessage
from apiary.store.errors import StoreError


class FencedError(StoreError):
    """A fenced write was refused: the partition's lease is no longer the writer's term
    (another replica took it over, or it was released). Nothing was written."""

    def __init__(self, partition: int, epoch: int, found: Lease) -> None:
        holder = found.owner or "nobody"
        super().__init__(
            f"partition {partition} is fenced: the write was decided under epoch {epoch}, "
            f"the lease is at epoch {found.epoch} held by {holder}"
        )
        self.partition = partition
        self.epoch = epoch
        self.found = found


class ClusterConfigError(StoreError):
    """The cluster's tables disagree with this replica's settings; `field` names the
    setting ([cluster] partitions, [cluster] replica_id)."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


class ReplicaInUseError(ClusterConfigError):
    """Another live replica beats under this replica_id."""

    def __init__(self, message: str, remaining_s: float, heartbeat_at: float) -> None:
        super().__init__(message, "cluster.replica_id")
        self.remaining_s = remaining_s
        """How long until its heartbeat expires, unless it beats again."""
        self.heartbeat_at = heartbeat_at


class ReplicaEvictedError(StoreError):
    """This replica's row is gone or belongs to a newer incarnation of the same id: it must
    stop acting as a replica (its leases are someone else's to take)."""


@dataclass(frozen=True, slots=True)
class Me:
    """This replica as its requests name it: its id, the incarnation (one per start, so a
    restarted replica is told from its predecessor), and the address it serves."""

    replica_id: str
    incarnation: str
    address: str = ""


@dataclass(frozen=True, slots=True)
class LeaseOutcome:
    """One lease after a request: as stored now, and what became of the request."""

    lease: Lease
    verdict: Verdict


@dataclass(frozen=True, slots=True)
class Beat:
    """What a heartbeat returns: its renewals and the view read in the same transaction."""

    renewed: tuple[LeaseOutcome, ...]
    view: ClusterView


class ClusterLeases(Protocol):
    """The lease table's operations; each is one transaction."""

    async def join(self, me: Me, partitions: int, lease_s: float) -> ClusterView:
        """Record `me` as a live replica and seed the partitions on first use.

        ClusterConfigError (field `cluster.partitions`) when the table holds another
        number of partitions; ReplicaInUseError when a live replica beats under the same id.
        Leases a lapsed predecessor with the same id held are released.
        """
        ...

    async def beat(self, me: Me, lease_s: float) -> Beat:
        """Extend `me`'s heartbeat and renew its live leases; ReplicaEvictedError when a
        newer incarnation took its id or its row is gone."""
        ...

    async def acquire(
        self, me: Me, partitions: Sequence[int], lease_s: float
    ) -> list[LeaseOutcome]:
        """Acquire (or take over, bumping the epoch) each of `partitions` it can."""
        ...

    async def release(self, me: Me, partitions: Sequence[int]) -> list[LeaseOutcome]:
        """Release each of `partitions` `me` holds."""
        ...

    async def leave(self, me: Me) -> None:
        """Release every lease of `me` and remove its row (a clean stop)."""
        ...

    async def view(self) -> ClusterView:
        """The replicas and leases now."""
        ...

    def releases(self) -> AsyncIterator[None]:
        """Yield each time another replica releases leases (a hint: some may be missed)."""
        ...


@dataclass(frozen=True, slots=True)
class WorkNote:
    """A wake-up one replica sends the others (a hint: a note may be lost, polling finds
    the work anyway). `kind` is one of NOTE_KINDS; `agent_id` the agent it concerns."""

    kind: str
    agent_id: str


INBOX: Final = "inbox"
"""A message for the agent was admitted: its stream's replica reads it from the store."""
CHANGED: Final = "changed"
"""One of the agent's messages changed state on another replica (a deadline fired)."""
AGENTS: Final = "agents"
"""The agent was registered or deregistered: the others read the registry again."""
STREAM: Final = "stream"
"""A newer stream of the agent opened on another replica: the holder of its older one
ends it (`StreamHolders`)."""
NOTE_KINDS: Final = frozenset({INBOX, CHANGED, AGENTS, STREAM})


class ClusterWork(Protocol):
    """How replicas hand message work to each other through the store they share
    (docs/cluster.md, "The message path"): wake-ups, ACK deadlines, and the owner's claim
    on a deadline that has passed."""

    async def notify(self, notes: Sequence[WorkNote]) -> None:
        """Send `notes` to every replica listening (this one included)."""
        ...

    def notes(self) -> AsyncIterator[WorkNote]:
        """The notes sent by any replica, as they come (StoreError when listening fails)."""
        ...

    async def set_ack_deadlines(self, deadlines: Sequence[tuple[str, float]]) -> None:
        """Store each (message_id, due) ACK deadline: a start is kept only while the message
        awaits its first ACK (RECEIVED or RETRYING, nothing acknowledged); 0.0 clears it."""
        ...

    async def aged(self, born_before: float, limit: int) -> list[StoredMessage]:
        """Up to `limit` messages past the maximum age, oldest first: admitted at
        `born_before` or earlier, awaiting their first ACK with no stream holding them (no
        ACK deadline stored), notices aside, whose recipients stream on no replica."""
        ...

    async def claim_aged(
        self, me: Me, partition: int, epoch: int, message_id: str, born_before: float
    ) -> StoredMessage | None:
        """In a transaction fenced by `me`'s term `epoch` of `partition`: the message, when
        it is still past the maximum age as `aged` tells (its row locked while it is read);
        None when it is not (acknowledged, handed out, its recipient streaming, finished).
        FencedError when the term is over."""
        ...

    async def claim_due(
        self, me: Me, partition: int, epoch: int, message_id: str, now: float, retry_at: float
    ) -> StoredMessage | None:
        """In a transaction fenced by `me`'s term `epoch` of `partition`: the message as it
        was, when one of its deadlines is due at `now`, that deadline then moved to
        `retry_at` (fired once, or again at `retry_at` by whoever owns the partition then if
        the firing never finished); None when it is not due (fired or finished already).
        FencedError when the term is over."""
        ...


class StreamHolders(Protocol):
    """Which replica's stream of an agent is its live one (docs/cluster.md, "One stream per
    agent"): one holder row per agent, decided by the store under a row lock with the rules
    of `core.cluster.streams`."""

    async def claim(self, me: Me, agent_id: str, take_over: bool) -> StreamClaim:
        """Ask for `agent_id`'s holder row for a stream opening on `me` (`take_over`: its
        caller proved it is the agent). When the claim supersedes another replica's stream,
        that replica is sent a note (kind STREAM) as the claim commits."""
        ...

    async def release(self, me: Me, agent_id: str, generation: int) -> bool:
        """Free the row when `me` still holds it under `generation` (its last stream of the
        agent ended); False when a newer stream took it since."""
        ...

    async def holders(self, agent_ids: Sequence[str]) -> dict[str, StreamHolder]:
        """The holder rows of `agent_ids` there are."""
        ...


LEADER: Final = "coordinator"
"""The name of the leader's lease row (`cluster_leader`): one leader per cluster."""
LEADER_PARTITION: Final = -1
"""The partition number the leader's lease goes by in the lease machine and its errors."""


@dataclass(frozen=True, slots=True)
class Leadership:
    """The leader's lease as stored, with the address its holder serves and the key the
    replicas sign forwarded calls with (docs/cluster.md, "The leader")."""

    lease: Lease
    address: str
    forward_key: str
    now: float
    """The database's clock when it was read."""

    def leader(self) -> str | None:
        """The replica leading now (its lease live), else None."""
        return self.lease.owner if self.lease.live(self.now) else None


@dataclass(frozen=True, slots=True)
class Relayed:
    """One thing another replica handed the leader's components (`ClusterLeader.relay`):
    `kind` is one of RELAY_KINDS; `envelope` the encoded envelope of an ENVELOPE."""

    kind: str
    agent_id: str = ""
    detail: str = ""
    envelope: bytes = b""
    seq: int = 0
    """Its place in the relay table, in the order it was stored (0 before it is stored)."""


ENVELOPE: Final = "envelope"
"""An envelope for a leader's endpoint (`detail` names it): an ACK of a dispatch, a NACK."""
READY: Final = "ready"
"""The agent's stream opened on a replica (again at each new term of the leader)."""
REGISTERED: Final = "registered"
"""The agent registered (`detail`: its type)."""
REPORTED: Final = "reported"
"""The agent's own state in a heartbeat (`detail`)."""
LOST: Final = "lost"
"""The agent missed its heartbeats (`detail`: why), judged by its partition's owner."""
DEREGISTERED: Final = "deregistered"
HITL_CANCEL: Final = "hitl_cancel"
"""A HITL invocation withdrawn by a component of another replica (a tool call cancelled
while its approval was pending): `agent_id` holds the invocation's id, `detail` the JSON
`[by, reason]`."""
RELAY_KINDS: Final = frozenset(
    {ENVELOPE, READY, REGISTERED, REPORTED, LOST, DEREGISTERED, HITL_CANCEL}
)


class ClusterLeader(Protocol):
    """The leader's lease and the relay to the leader; each operation one transaction."""

    async def seed(self, forward_key: str) -> Leadership:
        """The leader's row, created with `forward_key` when there is none yet (the first
        replica's key is everyone's)."""
        ...

    async def step(
        self, me: Me, action: LeaseAction, lease_s: float, address: str = ""
    ) -> LeaseOutcome:
        """The lease machine's `action` on the leader's row for `me`; an acquisition
        records `address` as the leader's."""
        ...

    async def read(self) -> Leadership:
        """The leader's row now."""
        ...

    async def relay(self, me: Me, items: Sequence[Relayed]) -> None:
        """Store `items` for the leader (and wake it)."""
        ...

    async def relayed(self, me: Me, epoch: int, limit: int) -> list[Relayed]:
        """Up to `limit` stored items in the order they were stored, read under `me`'s term
        `epoch` of the leader's lease (FencedError when that term is over)."""
        ...

    async def applied(self, me: Me, epoch: int, through: Sequence[int]) -> None:
        """Delete the items `through` names, once applied, under `me`'s term `epoch`."""
        ...

    def wakes(self) -> AsyncIterator[str]:
        """Yield "relay" each time a replica relays something, "leader" each time the
        leader's lease changes hands (a hint: some may be missed)."""
        ...
