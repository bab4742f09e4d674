"""sdk.provenance.derived_from: a message the coordinator derived from a signed envelope
(a requeued dead letter, a message assembled from chunks) is accepted only when it differs
from that envelope by what the derivation changes, and nothing else."""

from __future__ import annotations

import pytest

from apiary.sdk.chunking import CHUNK_CONTENT_TYPE, chunk_payloads
from apiary.sdk.provenance import derived_from
from apiary.wire import pb

Envelope = pb.common_pb2.Envelope


def _envelope(**fields: object) -> Envelope:
    base: dict[str, object] = {
        "message_id": "7c7a3a4e-0000-4000-8000-000000000001", "producer_id": "alice",
        "correlation_id": "c-1", "sequence_number": 7, "message_type": pb.common_pb2.DATA,
        "content_type": "application/json", "payload": b'{"n":1}', "content_length": 7,
    }  # fmt: skip
    return Envelope(**{**base, **fields})


def _requeued(origin: Envelope) -> Envelope:
    copy = Envelope()
    copy.CopyFrom(origin)
    copy.message_id = "7c7a3a4e-0000-4000-8000-000000000002"
    copy.retry_count = origin.retry_count + 1
    copy.timestamp.seconds = 1_800_000_000
    return copy


def test_a_requeued_copy_follows_from_its_origin() -> None:
    origin = _envelope()
    assert derived_from(_requeued(origin), origin.SerializeToString(deterministic=True))


@pytest.mark.parametrize(
    ("field", "value"),
    [("payload", b'{"n":2}'), ("producer_id", "mallory"), ("correlation_id", "c-2"),
     ("content_type", "text/plain"), ("sequence_number", 8), ("ttl_ms", 1)],
)  # fmt: skip
def test_a_copy_changed_in_anything_else_does_not(field: str, value: object) -> None:
    origin = _envelope()
    copy = _requeued(origin)
    setattr(copy, field, value)
    assert not derived_from(copy, origin.SerializeToString(deterministic=True))


def _transfer(payload: bytes) -> tuple[Envelope, Envelope]:
    """The final chunk's envelope and the message assembled from the transfer."""
    *_, last = chunk_payloads("7c7a3a4e-0000-4000-8000-00000000000f", payload, "text/plain", 4)
    chunk = _envelope(content_type=CHUNK_CONTENT_TYPE, payload=last, content_length=len(last))
    whole = Envelope()
    whole.CopyFrom(chunk)
    whole.message_id = "7c7a3a4e-0000-4000-8000-00000000000f"
    whole.payload, whole.content_type, whole.content_length = payload, "text/plain", len(payload)
    return chunk, whole


def test_an_assembled_message_follows_from_its_final_chunk() -> None:
    chunk, whole = _transfer(b"a payload in several chunks")
    assert derived_from(whole, chunk.SerializeToString(deterministic=True))


def test_an_assembled_payload_must_be_the_one_the_chunk_declares() -> None:
    chunk, whole = _transfer(b"a payload in several chunks")
    origin = chunk.SerializeToString(deterministic=True)
    for payload in (b"a payload in several chunkz", b"a payload in several chunks!"):
        changed = Envelope()
        changed.CopyFrom(whole)
        changed.payload, changed.content_length = payload, len(payload)
        assert not derived_from(changed, origin)
    other = Envelope()
    other.CopyFrom(whole)
    other.message_id = "7c7a3a4e-0000-4000-8000-0000000000ff"  # not the transfer's id
    assert not derived_from(other, origin)


def test_an_origin_that_is_no_envelope_vouches_for_nothing() -> None:
    assert not derived_from(_envelope(), b"\xff\xff not protobuf")
    garbled_chunk = _envelope(content_type=CHUNK_CONTENT_TYPE, payload=b"\xff\xff")
    assert not derived_from(_envelope(), garbled_chunk.SerializeToString(deterministic=True))
