"""Idempotency tokens (sw4rm-idempotency-bytes-v1) against the shared cross-SDK vectors."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apiary.core.idempotency import (
    DEFAULT_DEDUP_WINDOW_S,
    PROFILE,
    ParsedToken,
    idempotency_token,
    is_within_window,
    parse_token,
    verify_token,
    window_expiry,
)
from apiary.errors import ValidationError

# A copy of spec/vectors/idempotency_vectors.json, kept byte-identical.
VECTORS_FILE = Path(__file__).resolve().parents[1] / "vectors" / "idempotency_vectors.json"
VECTORS: dict[str, Any] = json.loads(VECTORS_FILE.read_text(encoding="utf-8"))
CASES = VECTORS["vectors"]
ACCEPTED = [c for c in CASES if not c.get("rejected")]
REJECTED = [c for c in CASES if c.get("rejected")]

field_text = st.text(min_size=1, max_size=30).filter(lambda s: "\n" not in s)
# Producers without ':' are the ones parse_token can split without being told the producer.
plain_producer = field_text.filter(lambda s: ":" not in s)


def test_vectors_file_is_the_expected_profile() -> None:
    assert VECTORS["profile"] == PROFILE
    assert len(ACCEPTED) == 8
    assert len(REJECTED) == 2


@pytest.mark.conformance("idempotency.token.format")
@pytest.mark.parametrize("case", ACCEPTED, ids=[c["id"] for c in ACCEPTED])
def test_vector_tokens(case: dict[str, Any]) -> None:
    canonical = bytes.fromhex(case["canonical_hex"])
    token = idempotency_token(case["producer_id"], case["operation"], canonical)
    assert token == case["token"]
    assert verify_token(token, case["producer_id"], case["operation"], canonical)
    parsed = parse_token(token, producer=case["producer_id"])
    assert parsed == ParsedToken(case["producer_id"], case["operation"], token[-16:])


@pytest.mark.parametrize("case", REJECTED, ids=[c["id"] for c in REJECTED])
def test_vector_rejections_name_the_field(case: dict[str, Any]) -> None:
    field = "producer" if "\n" in case["producer_id"] else "operation"
    canonical = bytes.fromhex(case["canonical_hex"])
    with pytest.raises(ValidationError) as info:
        idempotency_token(case["producer_id"], case["operation"], canonical)
    assert info.value.details["field"] == field
    assert info.value.message.startswith(f"{field}:")
    # The token a careless implementation would produce must not verify either.
    assert not verify_token(case["token"], case["producer_id"], case["operation"], canonical)
    with pytest.raises(ValidationError):
        parse_token(case["token"])


def test_parse_token_splits_at_the_first_colon_without_a_producer() -> None:
    # The "newline" vector's operation holds a colon; the split keeps it in the operation.
    assert parse_token("agent:tool:call:884315fb818090f5") == ParsedToken(
        "agent", "tool:call", "884315fb818090f5"
    )


def test_parse_token_with_the_producer_handles_colons_in_it() -> None:
    token = idempotency_token("ns:agent", "work", b"x")
    assert parse_token(token, producer="ns:agent").operation == "work"
    assert parse_token(token).producer == "ns"  # the documented ambiguity


@pytest.mark.parametrize(
    ("token", "producer"),
    [
        ("agent1:create:abc", None),  # the RFC's example: not this profile
        ("agent:work:E09D48D3D73FAD94", None),  # upper-case hex
        ("agent:work:e09d48d3d73fad9", None),  # 15 digits
        ("agent:work:e09d48d3d73fad944", None),  # 17 digits
        ("work:e09d48d3d73fad94", None),  # no operation
        (":work:e09d48d3d73fad94", None),  # empty producer
        ("agent::e09d48d3d73fad94", None),  # empty operation
        ("e09d48d3d73fad94", None),
        ("", None),
        ("agent:work:e09d48d3d73fad94", "other"),  # someone else's token
        ("agent:work:e09d48d3d73fad94", ""),
        ("agent:work:e09d48d3d73fad94", "agent:work"),  # leaves no operation
    ],
)
def test_parse_token_rejects(token: str, producer: str | None) -> None:
    with pytest.raises(ValidationError) as info:
        parse_token(token, producer=producer)
    assert info.value.details["field"] == "idempotency_token"


@pytest.mark.parametrize(
    ("producer", "operation", "field"),
    [("", "work", "producer"), ("agent", "", "operation"), ("a\ud800", "work", "producer")],
)
def test_token_rejects_empty_and_unencodable_fields(
    producer: str, operation: str, field: str
) -> None:
    with pytest.raises(ValidationError) as info:
        idempotency_token(producer, operation, b"")
    assert info.value.details["field"] == field


def test_carriage_return_is_not_a_separator() -> None:
    token = idempotency_token("a\rb", "work", b"")
    assert token.startswith("a\rb:work:")


@pytest.mark.conformance("idempotency.token.format")
@given(field_text, field_text, st.binary(max_size=200))
def test_token_is_the_documented_formula(producer: str, operation: str, data: bytes) -> None:
    material = producer.encode() + b"\n" + operation.encode() + b"\n" + data
    expected = f"{producer}:{operation}:{hashlib.sha256(material).hexdigest()[:16]}"
    assert idempotency_token(producer, operation, data) == expected


@given(plain_producer, field_text, st.binary(max_size=64))
def test_parse_round_trips(producer: str, operation: str, data: bytes) -> None:
    token = idempotency_token(producer, operation, data)
    parsed = parse_token(token)
    assert (parsed.producer, parsed.operation) == (producer, operation)
    assert parse_token(token, producer=producer) == parsed
    assert verify_token(token, producer, operation, data)


@given(field_text, field_text, st.binary(max_size=64), st.binary(max_size=64))
def test_different_bytes_give_different_tokens(
    producer: str, operation: str, a: bytes, b: bytes
) -> None:
    same = idempotency_token(producer, operation, a) == idempotency_token(producer, operation, b)
    assert same == (a == b)
    assert verify_token(idempotency_token(producer, operation, a), producer, operation, b) == (
        a == b
    )


@given(field_text, field_text, st.binary(max_size=64))
def test_bytearray_hashes_like_bytes(producer: str, operation: str, data: bytes) -> None:
    token = idempotency_token(producer, operation, data)
    assert idempotency_token(producer, operation, bytearray(data)) == token


# --- the deduplication window -----------------------------------------------------------------


def test_default_window_is_an_hour() -> None:
    assert DEFAULT_DEDUP_WINDOW_S == 3600.0


def test_window_boundary_is_inclusive() -> None:
    assert is_within_window(1000.0, 1000.0)
    assert is_within_window(1000.0, 4600.0)
    assert not is_within_window(1000.0, 4600.001)
    assert is_within_window(0.0, 10.0, window=10.0)
    assert not is_within_window(0.0, 10.5, window=10.0)
    assert window_expiry(1000.0) == 4600.0


def test_future_cached_at_counts_as_within() -> None:
    assert is_within_window(5000.0, 1000.0)


@pytest.mark.parametrize(
    ("cached_at", "now", "window"),
    [
        (math.nan, 0.0, 10.0),
        (0.0, math.inf, 10.0),
        (0.0, 0.0, 0.0),
        (0.0, 0.0, -1.0),
        (0.0, 0.0, math.nan),
    ],
)
def test_window_rejects_nonsense(cached_at: float, now: float, window: float) -> None:
    with pytest.raises(ValueError):
        is_within_window(cached_at, now, window)


@given(
    st.floats(0, 2e9, allow_nan=False),
    st.floats(0, 1e5, allow_nan=False),
    st.floats(0.001, 1e5, allow_nan=False),
)
def test_window_matches_expiry(cached_at: float, age: float, window: float) -> None:
    now = cached_at + age
    assert is_within_window(cached_at, now, window) == (now <= window_expiry(cached_at, window))
    assert is_within_window(cached_at, cached_at, window)
