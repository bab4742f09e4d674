"""The protobuf encoding of envelopes, as the engine's injected EnvelopeCodec."""

from __future__ import annotations

from google.protobuf.message import DecodeError

from apiary.core.chunks import ChunkPart
from apiary.core.envelope import Ack, Envelope
from apiary.errors import ValidationError
from apiary.wire import pb
from apiary.wire.convert import ack_from_payload, envelope_from_proto, envelope_to_proto


class ProtobufEnvelopeCodec:
    """Stores and delivers envelopes as canonical sw4rm.common.Envelope bytes."""

    def encode(self, env: Envelope) -> bytes:
        return envelope_to_proto(env).SerializeToString(deterministic=True)

    def decode(self, data: bytes) -> Envelope:
        msg = pb.common_pb2.Envelope()
        msg.ParseFromString(data)
        return envelope_from_proto(msg)

    def decode_ack(self, env: Envelope) -> Ack:
        return ack_from_payload(env.content_type, env.payload)

    def decode_chunk(self, env: Envelope) -> ChunkPart:
        msg = pb.apiary_pb2.Chunk()
        try:
            msg.ParseFromString(env.payload)
        except DecodeError:
            raise ValidationError.for_field("payload", "is not an apiary.v1.Chunk") from None
        if not msg.transfer_id:
            raise ValidationError.for_field("transfer_id", "is required in every chunk")
        return ChunkPart(
            msg.transfer_id, msg.index, msg.total, msg.size, msg.sha256, msg.data,
            msg.content_type, msg.total_length, msg.total_sha256,
        )  # fmt: skip
