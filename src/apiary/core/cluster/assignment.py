"""Which replica should own which partition: a fair assignment over the live replicas, and
what one replica does about it (`plan`).

Every replica computes the same assignment from the same view (the replicas' rows and the
leases, read from the database), so no replica tells another what to do: each takes what is
assigned to it and lets go of what is assigned elsewhere, and the lease machine settles any
race. The assignment is fair (each live replica gets `partitions // n` or one more) and
sticky (a partition stays with a live holder while that holder is within its share), so a
replica joining or leaving moves only the partitions it must: about `partitions / n`.

Rules, in order:
1. Live replicas (heartbeat not expired) are ordered by how many partitions they hold now,
   most first, then by id; the first `partitions % n` of them get the larger share, so the
   extra partitions stay where they are.
2. Partitions are visited in order; each one held (live or lapsed) by a live replica stays
   with it while that replica is below its share.
3. The rest go, in order, to the replicas below their share, in the order of rule 1.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from apiary.core.cluster.leases import Lease, Standing, standing


@dataclass(frozen=True, slots=True)
class Replica:
    """A coordinator replica as the cluster's table records it."""

    replica_id: str
    address: str = ""
    started_at: float = 0.0
    heartbeat_at: float = 0.0
    expires_at: float = 0.0
    """When it counts as gone unless it beats again (its last heartbeat + lease_s)."""

    def live(self, now: float) -> bool:
        return now < self.expires_at


@dataclass(frozen=True, slots=True)
class ClusterView:
    """The replicas and leases as read at one instant, `now` on the database's clock."""

    now: float
    replicas: tuple[Replica, ...]
    leases: tuple[Lease, ...]

    def live_replicas(self) -> tuple[str, ...]:
        """The ids of the replicas whose heartbeat has not expired, sorted."""
        return tuple(sorted(r.replica_id for r in self.replicas if r.live(self.now)))

    def owners(self) -> dict[int, str]:
        """Each partition whose lease is live, and its owner."""
        return {
            lease.partition: lease.owner
            for lease in self.leases
            if lease.owner is not None and lease.live(self.now)
        }

    def next_change(self, replica: str) -> float | None:
        """The earliest instant after `now` at which another replica's heartbeat or lease
        expires (when the assignment may change without anyone acting): when a replica
        should look again at the latest, besides its own renewals."""
        times = [r.expires_at for r in self.replicas if r.replica_id != replica]
        times += [lease.expires_at for lease in self.leases if lease.owner not in (None, replica)]
        later = [t for t in times if t > self.now]
        return min(later) if later else None


@dataclass(frozen=True, slots=True)
class LeasePlan:
    """What one replica does after looking at a view."""

    acquire: tuple[int, ...] = ()
    """Partitions assigned to it that it can take now (free or lapsed)."""
    release: tuple[int, ...] = ()
    """Partitions it holds live that are assigned to another replica."""


def shares(partitions: int, replicas: Sequence[str], held: Mapping[str, int]) -> dict[str, int]:
    """How many partitions each replica should own (rule 1)."""
    if not replicas:
        return {}
    base, extra = divmod(partitions, len(replicas))
    ordered = sorted(replicas, key=lambda r: (-held.get(r, 0), r))
    return {r: base + (1 if i < extra else 0) for i, r in enumerate(ordered)}


def fair_assignment(
    partitions: int, replicas: Iterable[str], holders: Mapping[int, str]
) -> dict[int, str]:
    """The owner each partition should have (module docstring); `holders` are the current
    holders, live or lapsed (those that are not among `replicas` are ignored). Empty when
    no replica is live."""
    live = sorted(set(replicas))
    if not live:
        return {}
    current = {p: r for p, r in holders.items() if r in live and 0 <= p < partitions}
    held: dict[str, int] = {}
    for holder in current.values():
        held[holder] = held.get(holder, 0) + 1
    room = shares(partitions, live, held)
    order = sorted(live, key=lambda r: (-held.get(r, 0), r))
    target: dict[int, str] = {}
    for p in range(partitions):
        keeper = current.get(p)
        if keeper is not None and room[keeper] > 0:
            target[p] = keeper
            room[keeper] -= 1
    spare = (r for r in order for _ in range(room[r]))
    for p in range(partitions):
        if p not in target:
            target[p] = next(spare)
    return target


def plan(view: ClusterView, replica: str) -> LeasePlan:
    """What `replica` should acquire and release, given `view` (module docstring)."""
    holders = {lease.partition: owner for lease in view.leases if (owner := lease.owner)}
    target = fair_assignment(len(view.leases), view.live_replicas(), holders)
    acquire: list[int] = []
    release: list[int] = []
    for lease in sorted(view.leases, key=lambda lease: lease.partition):
        how = standing(lease, replica, view.now)
        mine = target.get(lease.partition) == replica
        if mine and how in (Standing.FREE, Standing.LAPSED_MINE, Standing.LAPSED_OTHER):
            acquire.append(lease.partition)
        elif not mine and how is Standing.HELD_BY_ME and lease.partition in target:
            release.append(lease.partition)
    return LeasePlan(tuple(acquire), tuple(release))
