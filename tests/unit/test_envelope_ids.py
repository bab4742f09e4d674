"""The three-ID model (RFC 11.3): validation, retries, replies and acks."""

from __future__ import annotations

import dataclasses
import uuid

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from apiary.core.envelope_ids import (
    UINT32_MAX,
    UINT64_MAX,
    EnvelopeIds,
    for_ack,
    for_reply,
    for_retry,
    validate_ids,
)
from apiary.errors import ValidationError
from apiary.testing import SequentialIds

M1 = "6ae58b74-4e19-4b2f-9e7a-1a1a1fd2d001"
M2 = "7f3f41a2-2017-4b8f-9b8b-2ad3caaee001"
M3 = "d2b6a7a9-0e0c-4f44-b2d9-6e9e24f0abcd"
CORR = "5a1d9c8e-6b3f-4a87-8f5e-91a2c0ab1234"

uuid4s = st.uuids(version=4).map(str)
names = st.text(min_size=1, max_size=20)


def ids(**changes: object) -> EnvelopeIds:
    base = EnvelopeIds(
        message_id=M1,
        idempotency_token="agent1:create:abc",
        correlation_id="wf123",
        producer_id="agent1",
        sequence_number=7,
        retry_count=0,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


envelope_ids = st.builds(
    EnvelopeIds,
    message_id=uuid4s,
    idempotency_token=st.one_of(st.just(""), names),
    correlation_id=st.one_of(uuid4s, names),
    producer_id=names,
    sequence_number=st.integers(0, UINT64_MAX),
    retry_count=st.integers(0, UINT32_MAX - 1),
)


def field_of(exc: pytest.ExceptionInfo[ValidationError]) -> str:
    return exc.value.details["field"]


# --- validation -------------------------------------------------------------------------------


def test_valid_ids_pass_unchanged() -> None:
    value = ids()
    assert validate_ids(value) is value


def test_token_is_optional() -> None:
    value = ids(idempotency_token="")
    assert validate_ids(value) is value
    assert not value.has_idempotency_token
    assert ids().has_idempotency_token


@pytest.mark.conformance("ids.message-id.uuid4", "envelope.message-id.uuid4")
@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"message_id": ""}, "message_id"),
        ({"message_id": "m1"}, "message_id"),
        ({"message_id": "6ae58b74-4e19-1b2f-9e7a-1a1a1fd2d001"}, "message_id"),  # v1
        ({"producer_id": ""}, "producer_id"),
        ({"correlation_id": ""}, "correlation_id"),
        ({"sequence_number": -1}, "sequence_number"),
        ({"sequence_number": UINT64_MAX + 1}, "sequence_number"),
        ({"sequence_number": True}, "sequence_number"),
        ({"sequence_number": 1.0}, "sequence_number"),
        ({"retry_count": -1}, "retry_count"),
        ({"retry_count": UINT32_MAX + 1}, "retry_count"),
    ],
)
def test_invalid_ids_name_the_field(changes: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        validate_ids(ids(**changes))
    assert field_of(info) == field
    assert info.value.message.startswith(f"{field}:")


def test_correlation_is_free_text_unless_strict() -> None:
    # The RFC's own example correlates by "wf123"; strict mode holds it to UUIDv4.
    assert validate_ids(ids(correlation_id="wf123"))
    with pytest.raises(ValidationError) as info:
        validate_ids(ids(correlation_id="wf123"), strict_correlation=True)
    assert field_of(info) == "correlation_id"
    assert validate_ids(ids(correlation_id=CORR), strict_correlation=True)


def test_bounds_are_inclusive() -> None:
    assert validate_ids(ids(sequence_number=UINT64_MAX, retry_count=UINT32_MAX))
    assert validate_ids(ids(sequence_number=0, retry_count=0))


@given(envelope_ids)
def test_generated_ids_validate(value: EnvelopeIds) -> None:
    assert validate_ids(value) is value


# --- retries ----------------------------------------------------------------------------------


def test_retry_follows_the_rfc_example() -> None:
    attempt2 = for_retry(ids(), M2)
    assert attempt2 == ids(message_id=M2, retry_count=1)


@pytest.mark.conformance(
    "idempotency.token.constant-across-retries",
    "ids.idempotency-token.constant",
    "envelope.idempotency-token.constant",
    "idempotency.retry.new-message-id",
    "ids.message-id.new-on-retry",
    "envelope.message-id.new-on-retry",
)
@given(envelope_ids, uuid4s)
def test_retry_changes_only_message_id_and_count(value: EnvelopeIds, new_id: str) -> None:
    assume(new_id.lower() != value.message_id.lower())
    retried = for_retry(value, new_id)
    assert retried.message_id == new_id
    assert retried.retry_count == value.retry_count + 1
    assert retried.idempotency_token == value.idempotency_token
    assert retried.correlation_id == value.correlation_id
    assert retried.producer_id == value.producer_id
    # Kept so that, without a token, (producer_id, sequence_number) still dedups the retry.
    assert retried.sequence_number == value.sequence_number
    assert validate_ids(retried)


@pytest.mark.conformance("ids.message-id.new-on-retry", "envelope.message-id.new-on-retry")
def test_chain_of_retries_counts_up_with_fresh_ids() -> None:
    gen = SequentialIds()
    current = ids(message_id=gen.new_id())
    seen = {current.message_id}
    for n in range(1, 6):
        current = for_retry(current, gen.new_id())
        assert current.retry_count == n
        seen.add(current.message_id)
    assert len(seen) == 6


@pytest.mark.conformance("ids.message-id.uuid4", "envelope.message-id.uuid4")
@pytest.mark.parametrize("new_id", [M1, M1.upper(), "", "m2"])
def test_retry_needs_a_new_uuid4(new_id: str) -> None:
    with pytest.raises(ValidationError) as info:
        for_retry(ids(), new_id)
    assert field_of(info) == "message_id"


def test_retry_count_cannot_overflow() -> None:
    with pytest.raises(ValidationError) as info:
        for_retry(ids(retry_count=UINT32_MAX), M2)
    assert field_of(info) == "retry_count"


# --- replies and acks -------------------------------------------------------------------------


@given(envelope_ids, uuid4s, names, st.integers(0, UINT64_MAX))
def test_reply_echoes_correlation_only(
    request: EnvelopeIds, message_id: str, producer: str, seq: int
) -> None:
    reply = for_reply(request, message_id=message_id, producer_id=producer, sequence_number=seq)
    assert reply == EnvelopeIds(message_id, "", request.correlation_id, producer, seq, 0)


def test_reply_needs_a_request_correlation_and_valid_own_ids() -> None:
    with pytest.raises(ValidationError) as info:
        for_reply(ids(correlation_id=""), message_id=M2, producer_id="b", sequence_number=1)
    assert field_of(info) == "correlation_id"
    with pytest.raises(ValidationError) as info:
        for_reply(ids(), message_id="m2", producer_id="b", sequence_number=1)
    assert field_of(info) == "message_id"
    with pytest.raises(ValidationError) as info:
        for_reply(ids(), message_id=M2, producer_id="", sequence_number=1)
    assert field_of(info) == "producer_id"


def test_ack_targets_the_original_attempt() -> None:
    original = for_retry(ids(), M2)
    ack = for_ack(original, message_id=M3, producer_id="router", sequence_number=99)
    assert ack.ack_for_message_id == M2
    assert ack.envelope == EnvelopeIds(M3, "", "wf123", "router", 99, 0)


def test_nack_of_an_invalid_message_still_names_it() -> None:
    broken = ids(message_id="not-a-uuid", correlation_id="")
    nack = for_ack(broken, message_id=M3, producer_id="router", sequence_number=1)
    assert nack.ack_for_message_id == "not-a-uuid"
    assert nack.envelope.correlation_id == M3
    assert validate_ids(nack.envelope)


def test_ack_validates_its_own_ids() -> None:
    with pytest.raises(ValidationError) as info:
        for_ack(ids(), message_id=str(uuid.uuid1()), producer_id="router", sequence_number=1)
    assert field_of(info) == "message_id"


def test_ids_are_immutable() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        ids().message_id = M2  # type: ignore[misc]
