"""The wire envelope and the domain envelope: every field crosses, both ways, unchanged."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apiary.core.envelope import Envelope, MessageType
from apiary.errors import ValidationError
from apiary.wire import pb
from apiary.wire.convert import envelope_from_proto, envelope_to_proto

_TEXT = st.text(max_size=40)
_KNOWN_TYPES = [t for t in MessageType if t is not MessageType.MESSAGE_TYPE_UNSPECIFIED]


@given(
    ids=st.lists(_TEXT, min_size=8, max_size=8),
    message_type=st.sampled_from(_KNOWN_TYPES),
    payload=st.binary(max_size=64),
    numbers=st.tuples(
        st.integers(0, 2**31 - 1),
        st.integers(0, 2**64 - 1),
        st.integers(0, 2**32 - 1),
        st.integers(0, 2**64 - 1),
    ),
    # Seconds and 512ths of one: exact both as a float and in a Timestamp's nanoseconds (a
    # float of today's time keeps about a quarter of a microsecond, not every nanosecond).
    when=st.tuples(st.integers(0, 4_000_000_000), st.integers(0, 511)),
)
def test_every_field_of_the_wire_envelope_reaches_the_domain_envelope_and_back(
    ids: list[str],
    message_type: MessageType,
    payload: bytes,
    numbers: tuple[int, int, int, int],
    when: tuple[int, int],
) -> None:
    message_id, producer, token, correlation, repo, worktree, hlc, content_type = ids
    content_length, sequence, retry, ttl = numbers
    msg = pb.common_pb2.Envelope(
        message_id=message_id, producer_id=producer, idempotency_token=token,
        correlation_id=correlation, sequence_number=sequence, retry_count=retry,
        message_type=int(message_type), content_type=content_type,  # type: ignore[arg-type]
        content_length=content_length, repo_id=repo, worktree_id=worktree, hlc_timestamp=hlc,
        ttl_ms=ttl, payload=payload,
    )  # fmt: skip
    seconds, fraction = when
    if seconds or fraction:
        msg.timestamp.seconds, msg.timestamp.nanos = seconds, fraction * 1_953_125

    env = envelope_from_proto(msg)

    assert env == Envelope(
        message_id=message_id, producer_id=producer, message_type=message_type,
        payload=payload, content_type=content_type, content_length=content_length,
        idempotency_token=token, correlation_id=correlation, sequence_number=sequence,
        retry_count=retry, repo_id=repo, worktree_id=worktree, hlc_timestamp=hlc, ttl_ms=ttl,
        timestamp=seconds + fraction / 512,
    )  # fmt: skip
    assert type(env.message_type) is MessageType
    assert envelope_to_proto(env) == msg


def test_an_unknown_message_type_number_is_refused_naming_the_field() -> None:
    msg = pb.common_pb2.Envelope(message_id="m", producer_id="p")
    msg.message_type = 4242  # type: ignore[assignment]

    with pytest.raises(ValidationError) as raised:
        envelope_from_proto(msg)

    assert raised.value.details["field"] == "message_type"
    assert "4242" in raised.value.message
