"""Adaptive credit windows (RFC 13.1): they follow a receiver's latency, never oscillate on a
receiver whose speed does not change, and stay within their bounds; resizing a ledger never
revokes a credit in flight."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apiary.core.credit_adaptation import AdaptivePolicy, CreditAdapter, WindowChange
from apiary.core.credits import CreditLedger
from apiary.errors import ValidationError


def _run(
    adapter: CreditAdapter, service_s: float, steps: int, noise: random.Random | None = None
) -> list[WindowChange]:
    """A receiver that works through its window in order: a delivery's latency is the
    window times the service time (times +/-10% noise when given)."""
    changes = []
    for _ in range(steps):
        latency = adapter.window * service_s
        if noise is not None:
            latency *= noise.uniform(0.9, 1.1)
        change = adapter.observe(latency)
        if change is not None:
            changes.append(change)
    return changes


def _reversals(changes: list[WindowChange]) -> int:
    ups = [c.after > c.before for c in changes]
    return sum(1 for a, b in itertools.pairwise(ups) if a != b)


@pytest.mark.conformance("backpressure.credit.no-oscillation")
def test_a_slow_receiver_s_window_settles_into_the_band_and_stays() -> None:
    adapter = CreditAdapter(64, AdaptivePolicy(target_latency_s=1.0))
    changes = _run(adapter, 0.05, 2_000)  # 64 in flight: 3.2 s per delivery
    assert [c.reason for c in changes][:2] == ["latency_high", "latency_high"]
    assert 15 <= adapter.window <= 25  # 0.75-1.25 s: the band
    assert _run(adapter, 0.05, 20_000) == []


@pytest.mark.conformance("backpressure.credit.no-oscillation")
def test_a_band_between_two_windows_does_not_make_the_window_swing() -> None:
    # One delivery takes 0.7 s: a window of 1 is too fast for the band (0.75-1.25 s), a
    # window of 2 too slow. The window settles at 1 instead of swinging between the two.
    adapter = CreditAdapter(8, AdaptivePolicy(target_latency_s=1.0))
    changes = _run(adapter, 0.7, 5_000)
    assert adapter.window == 1
    assert _reversals(changes) <= 1
    assert _run(adapter, 0.7, 5_000) == []


@pytest.mark.conformance("backpressure.credit.no-oscillation")
def test_a_faster_receiver_gets_its_window_back() -> None:
    adapter = CreditAdapter(32, AdaptivePolicy(target_latency_s=1.0))
    _run(adapter, 0.2, 2_000)
    assert adapter.window <= 6
    # The receiver becomes four times faster: the ceiling it had hit is lifted.
    _run(adapter, 0.05, 20_000)
    assert 15 <= adapter.window <= 25


@pytest.mark.conformance("backpressure.credit.no-oscillation")
def test_noise_around_the_target_does_not_keep_the_window_moving() -> None:
    adapter = CreditAdapter(64, AdaptivePolicy(target_latency_s=1.0))
    noise = random.Random(7)
    _run(adapter, 0.05, 5_000, noise)
    assert len(_run(adapter, 0.05, 50_000, noise)) <= 2


@pytest.mark.conformance(
    "backpressure.credit.no-oscillation", "backpressure.credit.preserve-safety"
)
@settings(max_examples=200, deadline=None)
@given(
    max_window=st.integers(1, 200),
    min_fraction=st.floats(0, 1),
    service_s=st.floats(0.001, 5.0),
    target_s=st.floats(0.01, 10.0),
)
def test_for_any_steady_receiver_the_window_stays_in_bounds_and_stops_moving(
    max_window: int, min_fraction: float, service_s: float, target_s: float
) -> None:
    min_window = max(1, round(max_window * min_fraction))
    adapter = CreditAdapter(max_window, AdaptivePolicy(target_s, min_window))
    seen = []
    for _ in range(3_000):
        adapter.observe(adapter.window * service_s)
        seen.append(adapter.window)
    assert all(min_window <= w <= max_window for w in seen)
    assert _run(adapter, service_s, 3_000) == []  # settled: no further change


@pytest.mark.conformance("backpressure.credit.preserve-safety")
@settings(max_examples=200, deadline=None)
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("consume"), st.sampled_from("abc")),
            st.tuples(st.just("release"), st.sampled_from("abc")),
            st.tuples(st.just("resize"), st.integers(1, 12)),
        ),
        max_size=200,
    )
)
def test_resizing_never_revokes_credits_and_never_overgrants(
    ops: list[tuple[str, object]],
) -> None:
    ledger = CreditLedger(6)
    held = {"a": 0, "b": 0, "c": 0}
    for op, arg in ops:
        if op == "resize":
            assert isinstance(arg, int)
            before = dict(held)
            ledger.resize(arg)
            assert {p: ledger.in_flight(p) for p in held} == before  # nothing revoked
        elif op == "consume":
            assert isinstance(arg, str)
            total = ledger.total_in_flight()
            if ledger.try_consume(arg).granted:
                assert total < ledger.window  # granted only below the current window
                held[arg] += 1
        elif held[str(arg)]:
            ledger.release(str(arg))
            held[str(arg)] -= 1
        assert ledger.available() == max(ledger.window - ledger.total_in_flight(), 0)


def test_policies_refuse_values_that_cannot_work() -> None:
    for bad, field in (
        ({"target_latency_s": 0}, "credit_target_latency_s"),
        ({"min_window": 0}, "credit_min_window"),
        ({"tolerance": 1.5}, "tolerance"),
        ({"smoothing": 0}, "smoothing"),
    ):
        with pytest.raises(ValidationError) as caught:
            AdaptivePolicy(**bad)  # type: ignore[arg-type]
        assert caught.value.details["field"] == field
    with pytest.raises(ValidationError) as caught:
        CreditAdapter(2, AdaptivePolicy(min_window=3))
    assert caught.value.details["field"] == "credit_window"
    with pytest.raises(ValidationError):
        CreditLedger(4).resize(0)
