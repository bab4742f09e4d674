"""Whether a delivered message follows from the signed envelope it was derived from.

With signing on, a message the coordinator derived from a producer's signed envelope is
delivered with the signature over that origin and the origin itself (apiary.v1
`Delivery.origin`): a requeued dead letter (the coordinator gave it a new message_id,
retry_count and timestamp, RFC 11 and 21.1) or a message assembled from a chunked transfer
(RFC 5.4: the final chunk declares the whole payload's length, SHA-256 and content type).
A recipient verifies the signature over the origin, and, here, that the message it got is
the origin with only those changes: anything else changed on the way makes it fail.
"""

from __future__ import annotations

import hashlib

from google.protobuf.message import DecodeError

from apiary.core.chunks import CHUNK_CONTENT_TYPE
from apiary.core.envelope_rules import content_type_base
from apiary.wire import pb

Envelope = pb.common_pb2.Envelope


def derived_from(delivered: Envelope, origin: bytes) -> bool:
    """Whether `delivered` is what the coordinator derives from the envelope `origin`."""
    try:
        expected = Envelope.FromString(origin)
        if content_type_base(expected.content_type) == CHUNK_CONTENT_TYPE:
            chunk = pb.apiary_pb2.Chunk.FromString(expected.payload)
        else:
            chunk = None
    except DecodeError:
        return False
    payload = delivered.payload
    if chunk is not None:
        whole = len(payload) == chunk.total_length
        if not whole or hashlib.sha256(payload).hexdigest() != chunk.total_sha256.lower():
            return False
        expected.message_id = chunk.transfer_id
        expected.payload = payload
        expected.content_type = chunk.content_type
        expected.content_length = len(payload)
    else:
        expected.message_id = delivered.message_id
        expected.retry_count = delivered.retry_count
        expected.timestamp.CopyFrom(delivered.timestamp)
    mine = expected.SerializeToString(deterministic=True)
    return mine == delivered.SerializeToString(deterministic=True)
