"""Splitting a large payload into a chunked transfer (RFC 5.4; see apiary.core.chunks)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

from apiary.core.chunks import CHUNK_CONTENT_TYPE
from apiary.wire import pb

DEFAULT_CHUNK_BYTES = 1024 * 1024


def chunk_payloads(
    transfer_id: str, payload: bytes, content_type: str, chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> Iterator[bytes]:
    """The serialized apiary.v1.Chunk payloads of one transfer, in order."""
    if chunk_bytes < 1:
        raise ValueError("chunk_bytes must be positive")
    pieces = [payload[i : i + chunk_bytes] for i in range(0, len(payload), chunk_bytes)] or [b""]
    digest = hashlib.sha256(payload).hexdigest()
    for index, data in enumerate(pieces):
        yield pb.apiary_pb2.Chunk(
            transfer_id=transfer_id, index=index, total=len(pieces), size=len(data),
            sha256=hashlib.sha256(data).hexdigest(), data=data, content_type=content_type,
            total_length=len(payload), total_sha256=digest,
        ).SerializeToString()  # fmt: skip


__all__ = ["CHUNK_CONTENT_TYPE", "chunk_payloads"]
