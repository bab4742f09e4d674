"""The wire encoding the engine needs, injected by the server layer (engine stays proto-free)."""

from __future__ import annotations

from typing import Protocol

from apiary.core.chunks import ChunkPart
from apiary.core.envelope import Ack, Envelope


class EnvelopeCodec(Protocol):
    def encode(self, env: Envelope) -> bytes: ...

    def decode(self, data: bytes) -> Envelope: ...

    def decode_ack(self, env: Envelope) -> Ack: ...

    def decode_chunk(self, env: Envelope) -> ChunkPart: ...
