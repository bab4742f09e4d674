"""Credit-based flow control (RFC 13.1): window, per-producer caps, fair share, release."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apiary.core.credits import CreditDecision, CreditLedger, CreditReason
from apiary.errors import ValidationError

GRANTED = CreditDecision(True, CreditReason.GRANTED)


def consume(ledger: CreditLedger, producer: str, n: int) -> list[CreditDecision]:
    return [ledger.try_consume(producer) for _ in range(n)]


# --- construction -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"window": 0}, "credits.window"),
        ({"window": -3}, "credits.window"),
        ({"window": True}, "credits.window"),
        ({"window": 2.0}, "credits.window"),
        ({"window": 4, "per_producer_cap": 0}, "credits.per_producer_cap"),
        ({"window": 4, "per_producer_cap": False}, "credits.per_producer_cap"),
        ({"window": 4, "per_producer_cap": 1.5}, "credits.per_producer_cap"),
    ],
)
def test_bad_configuration(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        CreditLedger(**kwargs)
    assert info.value.details["field"] == field


def test_a_fresh_ledger_has_the_whole_window() -> None:
    ledger = CreditLedger(5, per_producer_cap=3)
    assert (ledger.window, ledger.per_producer_cap) == (5, 3)
    assert ledger.available() == 5
    assert ledger.total_in_flight() == 0
    assert ledger.in_flight("a") == 0
    assert ledger.waiting == frozenset()


def test_empty_producer_is_refused() -> None:
    ledger = CreditLedger(1)
    with pytest.raises(ValueError, match="producer"):
        ledger.try_consume("")
    with pytest.raises(ValueError, match="producer"):
        ledger.note_waiting("")


# --- window and cap ---------------------------------------------------------------------------


def test_window_exhaustion_denies_and_marks_waiting() -> None:
    ledger = CreditLedger(2)
    assert consume(ledger, "a", 2) == [GRANTED, GRANTED]
    assert ledger.available() == 0
    assert ledger.try_consume("b") == CreditDecision(False, CreditReason.WINDOW_EXHAUSTED)
    assert ledger.waiting == {"b"}
    assert ledger.in_flight("b") == 0


def test_release_restores_a_credit() -> None:
    ledger = CreditLedger(1)
    assert ledger.try_consume("a") == GRANTED
    assert not ledger.try_consume("a").granted
    ledger.release("a")
    assert ledger.available() == 1
    assert ledger.in_flight("a") == 0
    assert ledger.try_consume("a") == GRANTED
    assert ledger.waiting == frozenset()  # granted producers stop waiting


def test_releasing_more_than_consumed_raises() -> None:
    ledger = CreditLedger(3)
    with pytest.raises(ValueError, match="holds no credit"):
        ledger.release("a")
    ledger.try_consume("a")
    ledger.release("a")
    with pytest.raises(ValueError, match="holds no credit"):
        ledger.release("a")
    assert ledger.available() == 3


def test_per_producer_cap() -> None:
    ledger = CreditLedger(10, per_producer_cap=2)
    assert consume(ledger, "a", 2) == [GRANTED, GRANTED]
    assert ledger.try_consume("a") == CreditDecision(False, CreditReason.PRODUCER_CAP)
    assert ledger.waiting == frozenset()  # waiting on its own releases, not on credit
    assert ledger.try_consume("b") == GRANTED


# --- fair share -------------------------------------------------------------------------------


def test_fair_share_holds_back_a_producer_over_its_share() -> None:
    ledger = CreditLedger(4)
    assert consume(ledger, "a", 4) == [GRANTED] * 4
    assert ledger.try_consume("b").reason is CreditReason.WINDOW_EXHAUSTED
    ledger.release("a")
    # b waits with nothing; a holds 3 > ceil(4 / 2): the freed credit is kept for b.
    assert ledger.fair_share("a") == 2
    assert ledger.try_consume("a") == CreditDecision(False, CreditReason.FAIR_SHARE)
    assert ledger.try_consume("b") == GRANTED
    assert ledger.waiting == {"a"}


def test_fair_share_allows_a_producer_below_its_share() -> None:
    ledger = CreditLedger(6)
    consume(ledger, "a", 1)
    ledger.note_waiting("b")
    ledger.note_waiting("c")
    assert ledger.fair_share("a") == 2
    assert ledger.try_consume("a") == GRANTED  # 1 < 2
    assert ledger.try_consume("a").reason is CreditReason.FAIR_SHARE  # 2 >= 2, b and c wait


def test_nobody_waiting_means_no_fair_share_limit() -> None:
    ledger = CreditLedger(4)
    consume(ledger, "b", 1)
    assert consume(ledger, "a", 3) == [GRANTED] * 3


def test_cancel_waiting_lifts_the_fair_share_limit() -> None:
    ledger = CreditLedger(4)
    consume(ledger, "a", 2)
    ledger.note_waiting("b")
    assert ledger.try_consume("a").reason is CreditReason.FAIR_SHARE
    ledger.cancel_waiting("b")
    ledger.cancel_waiting("nobody")  # harmless
    assert ledger.try_consume("a") == GRANTED


def test_a_waiter_at_its_share_does_not_hold_credit_back() -> None:
    ledger = CreditLedger(5)
    consume(ledger, "a", 3)
    consume(ledger, "b", 2)
    ledger.release("a")  # a 2, b 2, 1 free; share ceil(5 / 2) = 3
    ledger.note_waiting("b")
    assert ledger.try_consume("a") == GRANTED  # 2 < 3
    ledger.release("a")
    ledger.release("a")  # a 1, b 2
    consume(ledger, "b", 1)  # b 3 = share, still waiting for more
    ledger.note_waiting("b")
    ledger.note_waiting("a")
    assert ledger.try_consume("b").reason is CreditReason.FAIR_SHARE  # a (1) is short
    assert ledger.try_consume("a") == GRANTED


# --- properties -------------------------------------------------------------------------------

producers = st.sampled_from(["a", "b", "c", "d"])
operations = st.lists(
    st.tuples(st.sampled_from(["consume", "release", "wait", "cancel"]), producers),
    max_size=200,
)


@given(
    window=st.integers(1, 12),
    cap=st.one_of(st.none(), st.integers(1, 12)),
    ops=operations,
)
def test_invariants_under_any_sequence(
    window: int, cap: int | None, ops: list[tuple[str, str]]
) -> None:
    ledger = CreditLedger(window, per_producer_cap=cap)
    model: dict[str, int] = {}
    for op, producer in ops:
        held = model.get(producer, 0)
        if op == "consume":
            before = ledger.available()
            decision = ledger.try_consume(producer)
            if decision.granted:
                model[producer] = held + 1
                assert ledger.available() == before - 1
                assert producer not in ledger.waiting
            else:
                assert ledger.available() == before
                assert decision.reason is not CreditReason.GRANTED
                if decision.reason is CreditReason.WINDOW_EXHAUSTED:
                    assert before == 0
        elif op == "release":
            if held == 0:
                with pytest.raises(ValueError):
                    ledger.release(producer)
            else:
                before = ledger.available()
                ledger.release(producer)
                model[producer] = held - 1
                assert ledger.available() == before + 1
        elif op == "wait":
            ledger.note_waiting(producer)
        else:
            ledger.cancel_waiting(producer)
        assert ledger.total_in_flight() == sum(model.values()) <= window
        assert ledger.available() == window - sum(model.values())
        for name, count in model.items():
            assert ledger.in_flight(name) == count
            assert cap is None or count <= cap


@given(window=st.integers(1, 12), cap=st.one_of(st.none(), st.integers(1, 12)), p=producers)
def test_a_lone_producer_gets_up_to_window_or_cap(window: int, cap: int | None, p: str) -> None:
    ledger = CreditLedger(window, per_producer_cap=cap)
    granted = sum(d.granted for d in consume(ledger, p, window + 5))
    assert granted == min(window, cap or window)
    for _ in range(granted):
        ledger.release(p)
    assert ledger.available() == window


@given(window=st.integers(2, 12), rounds=st.integers(1, 30))
def test_fair_share_converges_when_the_hog_asks_first(window: int, rounds: int) -> None:
    # a hogs the window; b then always has deliveries queued (the engine notes it waiting
    # again after each grant). Even though a asks first after every release, b climbs to
    # its fair share and a never holds more than ceil(window / 2) + what it had left.
    ledger = CreditLedger(window)
    consume(ledger, "a", window)
    ledger.try_consume("b")
    for _ in range(rounds):
        if ledger.in_flight("a"):
            ledger.release("a")
        ledger.try_consume("a")
        if ledger.try_consume("b").granted:
            ledger.note_waiting("b")
    assert ledger.in_flight("b") >= min(rounds, window // 2)
    assert ledger.in_flight("a") + ledger.in_flight("b") <= window
