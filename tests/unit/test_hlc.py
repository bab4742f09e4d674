"""Hybrid Logical Clock: update rules, ordering, skew bound and both string forms."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from apiary.core.hlc import (
    DEFAULT_MAX_SKEW_US,
    MAX_LOGICAL,
    MAX_WALL_US,
    ClockSkewError,
    HlcTimestamp,
    HybridLogicalClock,
    format_hlc,
    format_rfc,
    parse_hlc,
    physical_us,
    receive,
    send,
    zero,
)
from apiary.errors import ValidationError

SKEW = 1_000_000
BASE = 1_725_552_000_000_000  # the RFC example's second, in microseconds

nodes = st.text(st.characters(categories=["L", "M", "N", "P", "S"]), min_size=1, max_size=24)
walls = st.integers(0, MAX_WALL_US)
logicals = st.integers(0, MAX_LOGICAL)
timestamps = st.builds(HlcTimestamp, walls, logicals, nodes)


@dataclass(frozen=True)
class Send:
    physical_delta: int


@dataclass(frozen=True)
class Receive:
    physical_delta: int
    remote_offset: int
    remote_logical: int


# Physical time wanders both ways (NTP steps) around BASE; remotes sit within the skew bound
# of local physical time, ahead or behind.
deltas = st.integers(-2_000, 2_000)
operations = st.lists(
    st.one_of(
        st.builds(Send, deltas),
        st.builds(Receive, deltas, st.integers(-3 * SKEW, SKEW), st.integers(0, 50)),
    ),
    min_size=1,
    max_size=60,
)


# --- update rules -----------------------------------------------------------------------------


@given(operations)
def test_any_interleaving_is_strictly_monotonic_and_causal(ops: list[Send | Receive]) -> None:
    last = zero("local")
    physical = BASE
    max_seen_wall = 0
    for op in ops:
        physical = max(0, physical + op.physical_delta)
        if isinstance(op, Send):
            nxt = send(last, physical)
            assert nxt.logical <= last.logical + 1
        else:
            remote = HlcTimestamp(physical + op.remote_offset, op.remote_logical, "remote")
            nxt = receive(last, remote, physical, SKEW)
            assert nxt > remote
            assert (nxt.wall_us, nxt.logical) > (remote.wall_us, remote.logical)
            assert nxt.logical <= max(last.logical, remote.logical) + 1
            max_seen_wall = max(max_seen_wall, remote.wall_us)
        assert nxt > last
        assert nxt.node == "local"
        max_seen_wall = max(max_seen_wall, physical)
        # wall is the largest physical time seen: never invented, never behind.
        assert nxt.wall_us == max(last.wall_us, max_seen_wall)
        if nxt.wall_us > last.wall_us and (isinstance(op, Send) or nxt.wall_us > remote.wall_us):
            assert nxt.logical == 0  # a fresh wall time resets the counter
        last = nxt


@given(operations)
def test_logical_counter_stays_bounded_by_event_count(ops: list[Send | Receive]) -> None:
    clock = HybridLogicalClock("n", max_skew_us=SKEW)
    physical = max_physical = BASE
    for count, op in enumerate(ops, start=1):
        physical = max(0, physical + op.physical_delta)
        max_physical = max(max_physical, physical)
        if isinstance(op, Send):
            clock.send(physical)
        else:
            clock.receive(
                HlcTimestamp(physical + op.remote_offset, op.remote_logical, "r"), physical
            )
        assert clock.last.logical <= count + 50
        # Kulkarni's bound: HLC runs ahead of physical time by at most the skew (measured
        # from the largest physical reading, since this clock is allowed to step back).
        assert clock.last.wall_us - max_physical <= SKEW


def test_send_rules() -> None:
    t1 = send(zero("a"), 100)
    assert t1 == HlcTimestamp(100, 0, "a")
    assert send(t1, 100) == HlcTimestamp(100, 1, "a")  # same microsecond
    assert send(t1, 50) == HlcTimestamp(100, 1, "a")  # physical clock went back
    assert send(HlcTimestamp(100, 7, "a"), 101) == HlcTimestamp(101, 0, "a")


def test_receive_rules() -> None:
    last = HlcTimestamp(100, 3, "a")
    assert receive(last, HlcTimestamp(100, 9, "b"), 90) == HlcTimestamp(100, 10, "a")
    assert receive(last, HlcTimestamp(99, 9, "b"), 90) == HlcTimestamp(100, 4, "a")
    assert receive(last, HlcTimestamp(150, 2, "b"), 120) == HlcTimestamp(150, 3, "a")
    assert receive(last, HlcTimestamp(150, 2, "b"), 200) == HlcTimestamp(200, 0, "a")


def test_rfc_causal_chain() -> None:
    # RFC section 4: A completes, B receives, B starts a dependent task, all in one second.
    a = HybridLogicalClock("node-a")
    b = HybridLogicalClock("node-b")
    done = a.send(BASE + 1)
    got = b.receive(done, BASE)  # B's wall clock runs 1 us behind A's
    started = b.send(BASE)
    assert done < got < started
    assert [str(t) for t in (done, got, started)] == [
        "HLC:1725552000000001:0:node-a",
        "HLC:1725552000000001:1:node-b",
        "HLC:1725552000000001:2:node-b",
    ]


def test_counter_overflow_spills_into_the_next_microsecond() -> None:
    last = HlcTimestamp(100, MAX_LOGICAL, "a")
    assert send(last, 100) == HlcTimestamp(101, 0, "a")
    remote = HlcTimestamp(100, MAX_LOGICAL, "b")
    assert receive(HlcTimestamp(100, 0, "a"), remote, 100) == HlcTimestamp(101, 0, "a")


def test_wall_overflow_is_an_error() -> None:
    with pytest.raises(ValidationError):
        send(HlcTimestamp(MAX_WALL_US, MAX_LOGICAL, "a"), MAX_WALL_US)


@pytest.mark.parametrize("physical", [-1, MAX_WALL_US + 1])
def test_physical_time_must_be_in_range(physical: int) -> None:
    with pytest.raises(ValidationError, match="physical_now_us"):
        send(zero("a"), physical)
    with pytest.raises(ValidationError, match="physical_now_us"):
        receive(zero("a"), zero("b"), physical)


# --- the skew bound ---------------------------------------------------------------------------


@given(st.integers(0, 10 * SKEW), st.integers(0, 10 * SKEW))
def test_skew_bound_is_enforced_exactly(ahead: int, bound: int) -> None:
    clock = HybridLogicalClock("a", max_skew_us=bound)
    before = clock.send(BASE)
    remote = HlcTimestamp(BASE + ahead, 0, "b")
    if ahead > bound:
        with pytest.raises(ClockSkewError) as info:
            clock.receive(remote, BASE)
        assert isinstance(info.value, ValidationError)
        assert info.value.code == "validation_error"
        assert info.value.details["ahead_us"] == str(ahead)
        assert clock.last == before  # state unchanged
    else:
        assert clock.receive(remote, BASE) > remote


def test_remote_far_behind_is_fine() -> None:
    assert receive(zero("a"), HlcTimestamp(0, 5, "b"), BASE) == HlcTimestamp(BASE, 0, "a")


def test_default_skew_bound() -> None:
    assert DEFAULT_MAX_SKEW_US == 5_000_000
    with pytest.raises(ClockSkewError):
        receive(zero("a"), HlcTimestamp(BASE + 5_000_001, 0, "b"), BASE)
    assert receive(zero("a"), HlcTimestamp(BASE + 5_000_000, 0, "b"), BASE).wall_us == (
        BASE + 5_000_000
    )


def test_clock_rejects_foreign_last_and_bad_skew() -> None:
    with pytest.raises(ValueError):
        HybridLogicalClock("a", last=zero("b"))
    with pytest.raises(ValidationError):
        HybridLogicalClock("a", max_skew_us=-1)
    resumed = HybridLogicalClock("a", last=HlcTimestamp(500, 2, "a"))
    assert resumed.send(10) == HlcTimestamp(500, 3, "a")


# --- ordering and values ----------------------------------------------------------------------


@given(timestamps, timestamps)
def test_order_is_wall_then_logical_then_node(a: HlcTimestamp, b: HlcTimestamp) -> None:
    assert (a < b) == ((a.wall_us, a.logical, a.node) < (b.wall_us, b.logical, b.node))
    assert (a == b) == ((a.wall_us, a.logical, a.node) == (b.wall_us, b.logical, b.node))


@pytest.mark.parametrize(
    ("wall", "logical", "node"),
    [
        (-1, 0, "a"),
        (MAX_WALL_US + 1, 0, "a"),
        (0, -1, "a"),
        (0, MAX_LOGICAL + 1, "a"),
        (0, 0, ""),
        (0, 0, "has space"),
        (0, 0, "tab\there"),
        (0, 0, "nl\n"),
        (0, 0, "x" * 256),
    ],
)
def test_invalid_timestamps_raise(wall: int, logical: int, node: str) -> None:
    with pytest.raises(ValidationError) as info:
        HlcTimestamp(wall, logical, node)
    assert info.value.details["field"] == "hlc_timestamp"


def test_physical_us() -> None:
    assert physical_us(1725552000.000001) in {BASE, BASE + 1}  # float resolution
    assert physical_us(1.5) == 1_500_000
    assert physical_us(0.0) == 0
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            physical_us(bad)


# --- string forms -----------------------------------------------------------------------------


@given(timestamps)
def test_hlc_form_round_trips(ts: HlcTimestamp) -> None:
    text = format_hlc(ts)
    assert text == str(ts)
    assert parse_hlc(text) == ts
    assert format_hlc(parse_hlc(text)) == text


@given(st.integers(0, MAX_WALL_US), nodes)
def test_rfc_form_round_trips(wall: int, node: str) -> None:
    ts = HlcTimestamp(wall, 0, node)
    text = format_rfc(ts)
    assert parse_hlc(text) == ts
    assert format_rfc(parse_hlc(text)) == text


@given(timestamps)
def test_rfc_form_refuses_a_logical_counter(ts: HlcTimestamp) -> None:
    assume(ts.logical > 0)
    with pytest.raises(ValidationError, match="logical"):
        format_rfc(ts)


def test_rfc_examples_parse_in_order() -> None:
    texts = ["1725552000.000001.node-a", "1725552000.000002.node-b", "1725552000.000003.node-b"]
    parsed = [parse_hlc(t) for t in texts]
    assert parsed[0] == HlcTimestamp(BASE + 1, 0, "node-a")
    assert parsed == sorted(parsed)
    assert [format_rfc(p) for p in parsed] == texts


def test_nodes_may_hold_the_separators() -> None:
    assert parse_hlc("HLC:5:1:host:50051") == HlcTimestamp(5, 1, "host:50051")
    assert parse_hlc("1.000005.agent.v2") == HlcTimestamp(1_000_005, 0, "agent.v2")
    assert format_rfc(HlcTimestamp(1_000_005, 0, "agent.v2")) == "1.000005.agent.v2"


def test_leading_zeros_are_read() -> None:
    assert parse_hlc("HLC:007:002:n") == HlcTimestamp(7, 2, "n")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "expected"),
        ("garbage", "expected"),
        ("HLC:1:2", "HLC:<wall_us>"),
        ("HLC:1:2:", "node is empty"),
        ("HLC::2:n", "wall_us must be decimal digits"),
        ("HLC:-1:2:n", "wall_us must be decimal digits"),
        ("HLC:1:x:n", "logical must be decimal digits"),
        ("HLC:1:+2:n", "logical must be decimal digits"),
        ("HLC:\u0661:2:n", "wall_us must be decimal digits"),  # Arabic-Indic one
        ("HLC:1:4294967296:n", "logical must be in"),
        ("HLC:9223372036854775808:0:n", "wall_us must be in"),
        ("HLC:1:2:a b", "whitespace"),
        ("hlc:1:2:n", "expected"),
        ("1725552000.1.node", "micro must be exactly 6 digits"),
        ("1725552000.0000001.node", "micro must be exactly 6 digits"),
        ("1725552000.00000a.node", "micro must be decimal digits"),
        ("-1.000000.node", "unix_seconds must be decimal digits"),
        (".000000.node", "unix_seconds must be decimal digits"),
        ("1725552000.000001.", "node is empty"),
        ("1725552000.000001", "expected"),
        ("HLC:1:2:" + "n" * 300, "longer than"),
    ],
)
def test_malformed_strings_name_the_problem(text: str, problem: str) -> None:
    with pytest.raises(ValidationError) as info:
        parse_hlc(text)
    assert problem in info.value.message
    assert info.value.details["field"] == "hlc_timestamp"


@given(st.text(max_size=60))
def test_parse_never_fails_otherwise(text: str) -> None:
    try:
        ts = parse_hlc(text)
    except ValidationError:
        return
    assert parse_hlc(format_hlc(ts)) == ts
