"""Communication-class lanes (RFC 7.3): urgent PRIVILEGED, rate limit, overflow, no starvation."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apiary.core.lanes import (
    BULK,
    LANES,
    MAX_WEIGHT,
    PRIVILEGED,
    STANDARD,
    LaneChoice,
    LanePolicy,
    LaneScheduler,
    smooth_wheel,
)
from apiary.errors import ValidationError

ALL_BUSY = {PRIVILEGED: 5, STANDARD: 5, BULK: 5}
URGENT = LaneChoice(PRIVILEGED, urgent=True)
OVERFLOW = LaneChoice(PRIVILEGED, overflowed=True)


def policy(p: int = 4, s: int = 2, b: int = 1, rate: float = 10.0, burst: int = 3) -> LanePolicy:
    return LanePolicy({PRIVILEGED: p, STANDARD: s, BULK: b}, rate, burst)


def picks(scheduler: LaneScheduler, n: int, ready: dict[str, int], now: float = 0.0) -> list[Any]:
    return [scheduler.pick(ready, now) for _ in range(n)]


# --- policy -----------------------------------------------------------------------------------


def test_default_policy() -> None:
    p = LanePolicy()
    assert dict(p.weights) == {PRIVILEGED: 4, STANDARD: 2, BULK: 1}
    assert p.privileged_rate == 100.0
    assert p.privileged_burst == 10
    assert p.cycle == 7


def test_policy_weights_are_frozen_copies() -> None:
    weights = {PRIVILEGED: 1, STANDARD: 1, BULK: 1}
    p = LanePolicy(weights)
    weights[BULK] = 9
    assert p.weights[BULK] == 1
    with pytest.raises(TypeError):
        p.weights[BULK] = 2  # type: ignore[index]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"weights": {PRIVILEGED: 1, STANDARD: 1}}, "lanes.weights"),
        ({"weights": {PRIVILEGED: 1, STANDARD: 1, BULK: 1, "X": 1}}, "lanes.weights"),
        ({"weights": {PRIVILEGED: 0, STANDARD: 1, BULK: 1}}, "lanes.weights"),
        ({"weights": {PRIVILEGED: 1, STANDARD: True, BULK: 1}}, "lanes.weights"),
        ({"weights": {PRIVILEGED: 1, STANDARD: 1.0, BULK: 1}}, "lanes.weights"),
        ({"weights": {PRIVILEGED: MAX_WEIGHT + 1, STANDARD: 1, BULK: 1}}, "lanes.weights"),
        ({"privileged_rate": 0.0}, "lanes.privileged_rate"),
        ({"privileged_rate": -1.0}, "lanes.privileged_rate"),
        ({"privileged_rate": math.inf}, "lanes.privileged_rate"),
        ({"privileged_rate": math.nan}, "lanes.privileged_rate"),
        ({"privileged_rate": True}, "lanes.privileged_rate"),
        ({"privileged_burst": 0}, "lanes.privileged_burst"),
        ({"privileged_burst": 2.0}, "lanes.privileged_burst"),
        ({"privileged_burst": True}, "lanes.privileged_burst"),
    ],
)
def test_bad_policies(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        LanePolicy(**kwargs)
    assert info.value.details["field"] == field


# --- the wheel --------------------------------------------------------------------------------


def test_default_wheel_interleaves() -> None:
    assert smooth_wheel(LanePolicy().weights) == (
        PRIVILEGED, STANDARD, PRIVILEGED, BULK, PRIVILEGED, STANDARD, PRIVILEGED,
    )  # fmt: skip


@given(weights=st.tuples(st.integers(1, 20), st.integers(1, 20), st.integers(1, 20)))
def test_wheel_gives_each_lane_its_weight(weights: tuple[int, int, int]) -> None:
    mapping = dict(zip(LANES, weights, strict=True))
    assert Counter(smooth_wheel(mapping)) == mapping


# --- picking ----------------------------------------------------------------------------------


def test_nothing_ready_gives_none() -> None:
    scheduler = LaneScheduler()
    assert scheduler.pick({}, 0.0) is None
    assert scheduler.pick({PRIVILEGED: 0, STANDARD: 0, BULK: 0}, 0.0) is None


@pytest.mark.parametrize(
    ("ready", "message"),
    [
        ({"URGENT": 1}, "unknown lane"),
        ({STANDARD: -1}, "integer >= 0"),
        ({STANDARD: True}, "integer >= 0"),
        ({STANDARD: 1.0}, "integer >= 0"),
    ],
)
def test_bad_ready_maps(ready: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LaneScheduler().pick(ready, 0.0)


@pytest.mark.parametrize("now", [math.nan, math.inf, -math.inf])
def test_now_must_be_finite(now: float) -> None:
    with pytest.raises(ValueError, match="finite"):
        LaneScheduler().pick({STANDARD: 1}, now)


def test_a_single_ready_lane_is_always_served() -> None:
    for lane in (STANDARD, BULK):
        assert picks(LaneScheduler(), 20, {lane: 1}) == [LaneChoice(lane)] * 20


def test_privileged_jumps_the_queue() -> None:
    scheduler = LaneScheduler(policy(burst=3))
    assert scheduler.pick({STANDARD: 3, BULK: 3}, 0.0) == LaneChoice(STANDARD)
    assert scheduler.pick(ALL_BUSY, 0.0) == URGENT


def test_burst_then_overflow_with_standard_weight() -> None:
    # Time stands still: 3 tokens, then PRIVILEGED is overflow with STANDARD's weight (2 per
    # cycle of P S P B P S P), in its own slots, never in STANDARD's or BULK's.
    scheduler = LaneScheduler(policy(burst=3))
    first = picks(scheduler, 3, ALL_BUSY)
    assert first == [URGENT] * 3
    assert scheduler.tokens == 0
    cycle = picks(scheduler, 5, ALL_BUSY)
    assert cycle == [
        OVERFLOW, LaneChoice(STANDARD), OVERFLOW, LaneChoice(BULK), LaneChoice(STANDARD),
    ]  # fmt: skip
    assert picks(scheduler, 5, ALL_BUSY) == cycle


def test_overflow_alone_is_still_served() -> None:
    scheduler = LaneScheduler(policy(burst=1))
    assert picks(scheduler, 6, {PRIVILEGED: 9}) == [URGENT] + [OVERFLOW] * 5


def test_tokens_refill_at_the_configured_rate() -> None:
    scheduler = LaneScheduler(policy(rate=10.0, burst=2))
    assert picks(scheduler, 3, {PRIVILEGED: 9}, now=5.0) == [URGENT, URGENT, OVERFLOW]
    assert scheduler.pick({PRIVILEGED: 9}, 5.05) == OVERFLOW  # half a token
    assert scheduler.pick({PRIVILEGED: 9}, 5.1) == URGENT
    assert scheduler.pick({PRIVILEGED: 9}, 100.0) == URGENT
    assert scheduler.tokens == 1.0  # capped at the burst, minus the one just used


def test_a_clock_stepping_back_mints_no_tokens() -> None:
    scheduler = LaneScheduler(policy(rate=10.0, burst=1))
    assert scheduler.pick({PRIVILEGED: 9}, 10.0) == URGENT
    assert scheduler.pick({PRIVILEGED: 9}, 5.0) == OVERFLOW
    assert scheduler.pick({PRIVILEGED: 9}, 10.05) == OVERFLOW  # still counted from 10.0
    assert scheduler.pick({PRIVILEGED: 9}, 10.1) == URGENT


def test_urgent_credit_caps_privileged_when_tokens_never_run_out() -> None:
    # A slow consumer: every pick is a second apart, so the bucket is always full. PRIVILEGED
    # still gets only its weight's share after the initial burst.
    scheduler = LaneScheduler(policy(burst=2))
    choices = [scheduler.pick(ALL_BUSY, float(t)) for t in range(2 + 7 * 10)]
    assert choices[:2] == [URGENT, URGENT]
    counts = Counter(c.lane for c in choices[2:] if c is not None)
    assert counts == {PRIVILEGED: 40, STANDARD: 20, BULK: 10}
    assert all(c is not None and not c.overflowed for c in choices)


def test_privileged_without_credit_waits_for_its_slot() -> None:
    # After the one-pick burst, a PRIVILEGED message with a token but no credit is served
    # urgently in its own wheel slots and the other lanes in theirs: P S P B P S P.
    scheduler = LaneScheduler(policy(burst=1))
    assert scheduler.pick(ALL_BUSY, 0.0) == URGENT
    assert scheduler.urgent_credit == 0
    cycle = [scheduler.pick(ALL_BUSY, float(t)) for t in range(1, 8)]
    expected = [URGENT if lane == PRIVILEGED else LaneChoice(lane) for lane in scheduler.wheel]
    assert cycle == expected


def test_unused_privileged_slots_earn_credit_up_to_the_burst() -> None:
    scheduler = LaneScheduler(policy(burst=2))
    assert picks(scheduler, 2, {PRIVILEGED: 1}) == [URGENT, URGENT]
    assert scheduler.urgent_credit == 0
    picks(scheduler, 14, {STANDARD: 1, BULK: 1})  # two cycles pass 8 unused P slots
    assert scheduler.urgent_credit == 2
    assert picks(scheduler, 2, ALL_BUSY, now=10.0) == [URGENT, URGENT]
    third = scheduler.pick(ALL_BUSY, 10.0)
    assert third is not None
    assert not third.urgent  # out of tokens and credit


def test_schedulers_are_deterministic() -> None:
    times = [0.0, 0.0, 0.01, 0.5, 0.5, 3.0, 3.0, 3.0, 3.2] * 5
    runs = []
    for _ in range(2):
        scheduler = LaneScheduler(policy())
        runs.append([scheduler.pick(ALL_BUSY, t) for t in times])
    assert runs[0] == runs[1]


# --- properties -------------------------------------------------------------------------------

policies = st.builds(
    policy,
    p=st.integers(1, 6),
    s=st.integers(1, 6),
    b=st.integers(1, 6),
    rate=st.floats(0.1, 1000.0),
    burst=st.integers(1, 8),
)
steps = st.lists(st.sampled_from([0.0, 0.0001, 0.001, 0.01, 0.1, 1.0, 100.0]), max_size=300)


def run(p: LanePolicy, ready: dict[str, int], deltas: list[float]) -> list[LaneChoice]:
    scheduler = LaneScheduler(p)
    now, out = 1000.0, []
    for delta in deltas:
        now += delta
        choice = scheduler.pick(ready, now)
        assert choice is not None
        out.append(choice)
    return out


def max_gap(choices: list[LaneChoice], lane: str) -> int:
    """The longest run of consecutive picks without `lane`."""
    gap = longest = 0
    for choice in choices:
        gap = 0 if choice.lane == lane else gap + 1
        longest = max(longest, gap)
    return longest


@given(p=policies, deltas=steps)
def test_no_lane_starves_under_sustained_load(p: LanePolicy, deltas: list[float]) -> None:
    choices = run(p, ALL_BUSY, deltas)
    window = p.cycle + p.privileged_burst
    for lane in LANES:
        assert max_gap(choices, lane) < window, lane
    assert all(not (c.urgent and c.overflowed) for c in choices)
    assert all(c.lane == PRIVILEGED for c in choices if c.urgent or c.overflowed)


@given(p=policies, deltas=st.lists(st.sampled_from([0.0, 1.0, 1e4]), max_size=300))
def test_bulk_is_never_starved_by_a_privileged_flood(p: LanePolicy, deltas: list[float]) -> None:
    choices = run(p, {PRIVILEGED: 10**6, BULK: 1}, deltas)
    assert max_gap(choices, BULK) < p.cycle + p.privileged_burst


@given(
    p=policies,
    script=st.lists(
        st.tuples(st.fixed_dictionaries({lane: st.integers(0, 2) for lane in LANES}), steps),
        max_size=40,
    ),
)
def test_work_conserving(p: LanePolicy, script: list[tuple[dict[str, int], list[float]]]) -> None:
    scheduler = LaneScheduler(p)
    now = 0.0
    for ready, deltas in script:
        for delta in deltas[:5]:
            now += delta
            choice = scheduler.pick(ready, now)
            if any(ready.values()):
                assert choice is not None
                assert ready[choice.lane] > 0
            else:
                assert choice is None
        assert 0 <= scheduler.tokens <= p.privileged_burst
        assert 0 <= scheduler.urgent_credit <= p.privileged_burst


@given(p=policies, n=st.integers(1, 200))
def test_overflow_never_exceeds_standard_weight_per_cycle(p: LanePolicy, n: int) -> None:
    # Time stands still: after the burst every PRIVILEGED pick is overflow.
    choices = run(p, ALL_BUSY, [0.0] * (p.privileged_burst + n))[p.privileged_burst :]
    overflow = sum(c.overflowed for c in choices)
    standard = sum(c.lane == STANDARD for c in choices)
    assert overflow <= standard + p.weights[STANDARD]


def _state(scheduler: LaneScheduler) -> tuple[Any, ...]:
    return (
        scheduler._position, scheduler.urgent_credit, scheduler._overflow_used, scheduler.tokens,
    )  # fmt: skip


@given(
    p=policies,
    lane=st.sampled_from([STANDARD, BULK]),
    runs=st.lists(st.tuples(st.integers(0, 40), st.sampled_from([0.0, 0.01, 1.0])), max_size=8),
    before=st.lists(st.sampled_from([0.0, 0.01, 1.0]), max_size=20),
)
def test_a_batch_of_plain_picks_leaves_the_state_that_many_picks_do(
    p: LanePolicy, lane: str, runs: list[tuple[int, float]], before: list[float]
) -> None:
    one_by_one, batched = LaneScheduler(p), LaneScheduler(p)
    now = 0.0
    for delta in before:  # some history with every lane busy (tokens, credit, position)
        now += delta
        assert one_by_one.pick(ALL_BUSY, now) == batched.pick(ALL_BUSY, now)
    for count, delta in runs:
        now += delta
        for _ in range(count):
            assert one_by_one.pick({lane: 1}, now) == LaneChoice(lane)
        if count:
            batched.pick_plain(lane, count, now)
        assert _state(batched) == _state(one_by_one)
    # And they go on choosing alike.
    assert picks(one_by_one, 30, ALL_BUSY, now + 0.5) == picks(batched, 30, ALL_BUSY, now + 0.5)


def test_plain_picks_are_only_for_the_plain_lanes() -> None:
    with pytest.raises(ValueError, match="PRIVILEGED"):
        LaneScheduler(policy()).pick_plain(PRIVILEGED, 1, 0.0)
