"""The partition lease machine (docs/cluster.md): every (standing, action) pair, epochs that
grow with each term and only then, expiry at the instant itself, and a replica's local view
of what it holds; partitions by a stable hash of agent_id."""

from __future__ import annotations

from itertools import product

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apiary.core.cluster.holdings import Holdings
from apiary.core.cluster.leases import (
    ROWS,
    Lease,
    LeaseAction,
    LeaseMachine,
    Standing,
    Verdict,
    markdown,
    standing,
)
from apiary.core.cluster.partitions import MAX_PARTITIONS, partition_of

L = 5.0
NOW = 1000.0
A, B = "replica-a", "replica-b"

FREE = Lease(7)
MINE = Lease(7, A, 3, NOW + 1)
LAPSED_MINE = Lease(7, A, 3, NOW)
OTHERS = Lease(7, B, 3, NOW + 1)
LAPSED_OTHERS = Lease(7, B, 3, NOW - 1)
FOR_A = {
    Standing.FREE: FREE,
    Standing.HELD_BY_ME: MINE,
    Standing.LAPSED_MINE: LAPSED_MINE,
    Standing.HELD_BY_OTHER: OTHERS,
    Standing.LAPSED_OTHER: LAPSED_OTHERS,
}

EXPECTED = {
    (Standing.FREE, LeaseAction.ACQUIRE): (Verdict.ACQUIRED, Lease(7, A, 1, NOW + L)),
    (Standing.FREE, LeaseAction.RENEW): (Verdict.LOST, FREE),
    (Standing.FREE, LeaseAction.RELEASE): (Verdict.NOT_OWNER, FREE),
    (Standing.HELD_BY_ME, LeaseAction.ACQUIRE): (Verdict.RENEWED, Lease(7, A, 3, NOW + L)),
    (Standing.HELD_BY_ME, LeaseAction.RENEW): (Verdict.RENEWED, Lease(7, A, 3, NOW + L)),
    (Standing.HELD_BY_ME, LeaseAction.RELEASE): (Verdict.RELEASED, Lease(7, None, 3, NOW)),
    (Standing.LAPSED_MINE, LeaseAction.ACQUIRE): (Verdict.ACQUIRED, Lease(7, A, 4, NOW + L)),
    (Standing.LAPSED_MINE, LeaseAction.RENEW): (Verdict.LOST, LAPSED_MINE),
    (Standing.LAPSED_MINE, LeaseAction.RELEASE): (Verdict.RELEASED, Lease(7, None, 3, NOW)),
    (Standing.HELD_BY_OTHER, LeaseAction.ACQUIRE): (Verdict.HELD_ELSEWHERE, OTHERS),
    (Standing.HELD_BY_OTHER, LeaseAction.RENEW): (Verdict.LOST, OTHERS),
    (Standing.HELD_BY_OTHER, LeaseAction.RELEASE): (Verdict.NOT_OWNER, OTHERS),
    (Standing.LAPSED_OTHER, LeaseAction.ACQUIRE): (Verdict.TOOK_OVER, Lease(7, A, 4, NOW + L)),
    (Standing.LAPSED_OTHER, LeaseAction.RENEW): (Verdict.LOST, LAPSED_OTHERS),
    (Standing.LAPSED_OTHER, LeaseAction.RELEASE): (Verdict.NOT_OWNER, LAPSED_OTHERS),
}


def test_the_fixtures_stand_as_named() -> None:
    for expected, lease in FOR_A.items():
        assert standing(lease, A, NOW) is expected


@pytest.mark.parametrize(("how", "action"), list(product(Standing, LeaseAction)))
def test_every_pair_has_its_row(how: Standing, action: LeaseAction) -> None:
    verdict, after = EXPECTED[(how, action)]
    step = LeaseMachine.step(FOR_A[how], A, action, NOW, L)
    assert (step.verdict, step.lease) == (verdict, after)
    assert ROWS[how][action] is verdict
    if not verdict.granted:
        assert step.lease is FOR_A[how]  # a refusal changes nothing


def test_a_lease_expires_at_its_expiry_itself() -> None:
    lease = Lease(1, B, 2, NOW)
    assert not lease.live(NOW) and lease.live(NOW - 0.001)
    assert LeaseMachine.step(lease, A, LeaseAction.ACQUIRE, NOW, L).verdict is Verdict.TOOK_OVER
    earlier = LeaseMachine.step(lease, A, LeaseAction.ACQUIRE, NOW - 0.001, L)
    assert earlier.verdict is Verdict.HELD_ELSEWHERE


def test_a_release_then_an_acquisition_is_a_new_term() -> None:
    held = LeaseMachine.step(FREE, A, LeaseAction.ACQUIRE, NOW, L).lease
    freed = LeaseMachine.step(held, A, LeaseAction.RELEASE, NOW + 1, L).lease
    again = LeaseMachine.step(freed, B, LeaseAction.ACQUIRE, NOW + 1, L)
    assert (held.epoch, freed.epoch, again.lease.epoch) == (1, 1, 2)
    assert again.verdict is Verdict.ACQUIRED
    # The old owner's renewal of the term it released is refused.
    stale = LeaseMachine.step(again.lease, A, LeaseAction.RENEW, NOW + 2, L)
    assert stale.verdict is Verdict.LOST


@pytest.mark.parametrize(("replica", "lease_s"), [("", L), (A, 0.0), (A, -1.0)])
def test_a_malformed_request_is_a_caller_bug(replica: str, lease_s: float) -> None:
    with pytest.raises(ValueError):
        LeaseMachine.step(FREE, replica, LeaseAction.ACQUIRE, NOW, lease_s)


_requests = st.lists(
    st.tuples(
        st.sampled_from([A, B, "replica-c"]),
        st.sampled_from(list(LeaseAction)),
        st.floats(min_value=0.0, max_value=4.0),
    ),
    max_size=40,
)


@given(_requests)
def test_epochs_grow_by_one_per_term_and_one_owner_at_a_time(
    requests: list[tuple[str, LeaseAction, float]],
) -> None:
    lease, now, terms = Lease(0), NOW, 0
    for replica, action, gap in requests:
        now += gap
        before = lease
        step = LeaseMachine.step(lease, replica, action, now, L)
        lease = step.lease
        terms += step.verdict.new_term
        assert lease.epoch == terms
        if before.live(now) and before.owner != replica:
            assert lease == before  # nobody gets a live lease of another replica
        if step.verdict.new_term:
            assert lease.owner == replica and lease.expires_at == now + L


def test_the_generated_table_names_every_row() -> None:
    text = markdown()
    assert text.count("\n") == 2 + len(Standing)
    assert "| LAPSED_OTHER | TOOK_OVER (epoch + 1) | refused: LOST | refused: NOT_OWNER |" in text


def test_holdings_end_at_their_local_deadline() -> None:
    held = Holdings()
    held.granted(3, 7, sent_at=10.0, lease_s=L)
    held.granted(4, 1, sent_at=12.0, lease_s=L)
    assert held.owned(14.9) == {3: 7, 4: 1}
    assert held.owned(15.0) == {4: 1}  # sent at 10 + 5: the database's expiry is no earlier
    assert held.epoch(3, 15.0) is None and held.epoch(4, 16.9) == 1
    held.dropped([4])
    assert held.owned(11.0) == {3: 7}
    held.clear()
    assert held.owned(0.0) == {}


def test_partitions_are_a_stable_hash_of_agent_id() -> None:
    # Pinned: the same on every replica and every version; changing the hash would move
    # every agent of a running cluster.
    assert {a: partition_of(a, 64) for a in ("alice", "bob", "日本")} == {
        "alice": 9, "bob": 18, "日本": 58,
    }  # fmt: skip
    assert partition_of("alice", 1) == 0
    counts = [0] * 8
    for i in range(8000):
        counts[partition_of(f"agent-{i}", 8)] += 1
    assert min(counts) > 800  # spread: each of 8 gets about 1000


@pytest.mark.parametrize("count", [0, -1, MAX_PARTITIONS + 1, True])
def test_a_partition_count_out_of_range_is_refused(count: int) -> None:
    with pytest.raises(ValueError, match="partitions must be between 1 and"):
        partition_of("alice", count)
