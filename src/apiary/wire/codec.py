"""The protobuf encoding of envelopes, as the engine's injected EnvelopeCodec."""

from __future__ import annotations

from apiary.core.envelope import Ack, Envelope
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
