"""The fair assignment of partitions over live replicas, and what one replica plans from a
view: fair shares, sticky partitions, few moves when a replica joins or leaves, takeovers of
a dead replica's partitions once its leases lapse. Simulated in virtual time, no database."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apiary.core.cluster.assignment import (
    ClusterView,
    LeasePlan,
    Replica,
    fair_assignment,
    plan,
    shares,
)
from apiary.core.cluster.leases import Lease, LeaseAction, LeaseMachine, Verdict

L = 5.0


def _replica(name: str, expires_at: float) -> Replica:
    return Replica(name, f"{name}:50051", 0.0, expires_at - L, expires_at)


@given(
    st.integers(min_value=1, max_value=200),
    st.sets(st.sampled_from("abcdefg"), min_size=1),
    st.dictionaries(st.integers(0, 250), st.sampled_from("abcdefgxyz")),
)
def test_every_partition_goes_to_a_live_replica_in_fair_shares(
    partitions: int, live: set[str], holders: dict[int, str]
) -> None:
    target = fair_assignment(partitions, live, holders)
    assert sorted(target) == list(range(partitions))
    assert set(target.values()) <= live
    counts = Counter(target.values())
    sizes = [counts.get(r, 0) for r in live]
    assert max(sizes) - min(sizes) <= 1
    # Sticky: a live holder keeps as many of its partitions as its share allows.
    for r in live:
        kept = sum(1 for p, h in holders.items() if h == r and target.get(p) == r)
        had = sum(1 for p, h in holders.items() if h == r and p < partitions)
        assert kept == min(had, counts.get(r, 0))


def test_no_live_replica_assigns_nothing() -> None:
    assert fair_assignment(8, [], {0: "a"}) == {}
    assert shares(8, [], {}) == {}


def test_the_larger_shares_go_to_those_holding_most() -> None:
    assert shares(10, ["a", "b", "c"], {"c": 9}) == {"c": 4, "a": 3, "b": 3}
    assert shares(10, ["a", "b", "c"], {}) == {"a": 4, "b": 3, "c": 3}


@pytest.mark.parametrize(("before", "after"), [(2, 3), (3, 4), (3, 2), (4, 3)])
def test_a_join_or_a_leave_moves_only_what_it_must(before: int, after: int) -> None:
    partitions = 64
    names = [f"r{i}" for i in range(max(before, after))]
    first = fair_assignment(partitions, names[:before], {})
    second = fair_assignment(partitions, names[:after], first)
    moved = sum(1 for p in range(partitions) if first[p] != second[p])
    if after > before:  # the newcomer's share, no more
        assert moved == Counter(second.values())[names[after - 1]]
    else:  # the leaver's partitions, no more
        assert moved == Counter(first.values())[names[before - 1]]


class Cluster:
    """Replicas planning from a shared view and applying their plans through the machine,
    as the keeper does through the store (which adds only row locks and a clock)."""

    def __init__(self, partitions: int) -> None:
        self.now = 0.0
        self.leases = {p: Lease(p) for p in range(partitions)}
        self.beats: dict[str, float] = {}

    def view(self) -> ClusterView:
        replicas = tuple(_replica(r, at + L) for r, at in sorted(self.beats.items()))
        return ClusterView(self.now, replicas, tuple(self.leases.values()))

    def tick(self, replica: str) -> LeasePlan:
        self.beats[replica] = self.now
        for lease in list(self.leases.values()):
            if lease.owner == replica:
                self._do(lease.partition, replica, LeaseAction.RENEW)
        todo = plan(self.view(), replica)
        for p in todo.release:
            assert self._do(p, replica, LeaseAction.RELEASE) is Verdict.RELEASED
        for p in todo.acquire:
            assert self._do(p, replica, LeaseAction.ACQUIRE).granted
        return todo

    def _do(self, partition: int, replica: str, action: LeaseAction) -> Verdict:
        step = LeaseMachine.step(self.leases[partition], replica, action, self.now, L)
        self.leases[partition] = step.lease
        return step.verdict

    def owners(self) -> Counter[str | None]:
        return Counter(lease.owner for lease in self.leases.values() if lease.live(self.now))


def test_a_lone_replica_takes_every_partition() -> None:
    cluster = Cluster(8)
    assert cluster.tick("a") == LeasePlan(acquire=tuple(range(8)))
    assert cluster.owners() == {"a": 8}
    assert cluster.tick("a") == LeasePlan()  # renewed; nothing more to do


def test_a_joining_replica_gets_its_share_handed_over() -> None:
    cluster = Cluster(8)
    cluster.tick("a")
    cluster.now = 1.0
    assert cluster.tick("b") == LeasePlan()  # all held live by a: wait for a to let go
    assert cluster.tick("a") == LeasePlan(release=(4, 5, 6, 7))
    assert cluster.tick("b") == LeasePlan(acquire=(4, 5, 6, 7))
    assert cluster.owners() == {"a": 4, "b": 4}
    epochs = {p: lease.epoch for p, lease in cluster.leases.items()}
    assert epochs == {0: 1, 1: 1, 2: 1, 3: 1, 4: 2, 5: 2, 6: 2, 7: 2}


def test_a_dead_replicas_partitions_are_taken_over_when_its_leases_lapse() -> None:
    cluster = Cluster(9)
    for r in "abc":
        cluster.tick(r)
    for _ in range(3):
        for r in "abc":
            cluster.tick(r)
        cluster.now += L / 3
    assert cluster.owners() == {"a": 3, "b": 3, "c": 3}
    dead = {p for p, lease in cluster.leases.items() if lease.owner == "c"}
    epochs = {p: cluster.leases[p].epoch for p in dead}
    died_at = cluster.beats["c"]  # c stops; a and b go on beating every L / 3
    taken: dict[float, set[int]] = {}
    while cluster.now < died_at + L:
        cluster.now = min(cluster.now + L / 3, died_at + L)
        taken[cluster.now] = set(cluster.tick("a").acquire) | set(cluster.tick("b").acquire)
    assert taken.pop(died_at + L) == dead  # at the instant c's leases lapse, not before
    assert not any(taken.values())
    assert cluster.owners() == {"a": 5, "b": 4} or cluster.owners() == {"a": 4, "b": 5}
    assert {p: cluster.leases[p].epoch - 1 for p in dead} == epochs  # the old owner fenced


def test_a_lapsed_owner_that_is_still_live_takes_its_lease_back() -> None:
    cluster = Cluster(2)
    cluster.tick("a")
    cluster.now = L  # a's leases lapsed, but it beats now: they stay its own, new terms
    assert cluster.tick("a") == LeasePlan(acquire=(0, 1))
    assert [lease.epoch for lease in cluster.leases.values()] == [2, 2]


def test_next_change_is_the_earliest_foreign_expiry() -> None:
    leases = (Lease(0, "a", 1, 12.0), Lease(1, "b", 1, 9.0), Lease(2, None, 1, 3.0))
    view = ClusterView(5.0, (_replica("a", 11.0), _replica("b", 10.0)), leases)
    assert view.next_change("a") == 9.0
    assert view.next_change("b") == 11.0
    assert ClusterView(20.0, view.replicas, leases).next_change("a") is None
    assert view.live_replicas() == ("a", "b") and view.owners() == {0: "a", 1: "b"}
