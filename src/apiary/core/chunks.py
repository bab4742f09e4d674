"""Reassembly of chunked transfers (RFC 5.4), pure.

A transfer is a sequence of chunks sharing a transfer id; each carries its index, the total
count, its size and a SHA-256 of its data, and the whole transfer's content type, length and
SHA-256. Every chunk is checked on arrival; the payload is released only once all chunks
are present and the whole verifies. A chunk that contradicts its transfer fails the whole
transfer with a descriptive error, and so does a transfer left incomplete past its deadline.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from apiary.errors import PartialDeliveryError, ValidationError

CHUNK_CONTENT_TYPE = "application/vnd.apiary.chunk+protobuf"
CHUNKING_CAPABILITY = "chunking"
"""The capability a recipient declares to accept chunked transfers (the negotiation)."""


@dataclass(frozen=True, slots=True)
class ChunkPart:
    transfer_id: str
    index: int
    total: int
    size: int
    sha256: str
    data: bytes
    content_type: str
    total_length: int
    total_sha256: str


@dataclass(slots=True)
class _Transfer:
    total: int
    content_type: str
    total_length: int
    total_sha256: str
    deadline: float
    parts: dict[int, bytes] = field(default_factory=dict)


def _fail(part: ChunkPart, problem: str) -> ValidationError:
    return ValidationError(
        f"chunk {part.index + 1} of {part.total} of transfer {part.transfer_id}: {problem}; "
        "the transfer is failed, send it again",
        {"field": "payload", "transfer_id": part.transfer_id, "chunk": str(part.index)},
    )


def check_part(part: ChunkPart) -> None:
    """The checks one chunk passes on its own (size, digest, position)."""
    if part.total < 1 or not 0 <= part.index < part.total:
        raise _fail(part, f"index {part.index} is outside 0..{part.total - 1}")
    if part.size != len(part.data):
        raise _fail(part, f"declared size {part.size} but carries {len(part.data)} bytes")
    if hashlib.sha256(part.data).hexdigest() != part.sha256.lower():
        raise _fail(part, "sha256 of the data does not match (corrupted chunk)")


class Reassembly:
    """Transfers in progress; `add` returns the whole payload once a transfer completes."""

    def __init__(self, timeout_s: float = 60.0, max_transfers: int = 1000) -> None:
        self._timeout = timeout_s
        self._max = max_transfers
        self._transfers: dict[str, _Transfer] = {}

    def __len__(self) -> int:
        return len(self._transfers)

    def add(self, part: ChunkPart, now: float) -> bytes | None:
        try:
            return self._add(part, now)
        except ValidationError:
            self._transfers.pop(part.transfer_id, None)
            raise

    def _add(self, part: ChunkPart, now: float) -> bytes | None:
        check_part(part)
        transfer = self._transfers.get(part.transfer_id)
        if transfer is None:
            if len(self._transfers) >= self._max:
                raise _fail(part, f"{self._max} transfers are already in progress")
            transfer = _Transfer(
                part.total, part.content_type, part.total_length, part.total_sha256,
                now + self._timeout,
            )  # fmt: skip
            self._transfers[part.transfer_id] = transfer
        header = (part.total, part.content_type, part.total_length, part.total_sha256)
        if header != (transfer.total, transfer.content_type, transfer.total_length,
                      transfer.total_sha256):  # fmt: skip
            raise _fail(part, "its transfer header differs from the earlier chunks'")
        known = transfer.parts.get(part.index)
        if known is not None and known != part.data:
            raise _fail(part, "it was already received with different data")
        transfer.parts[part.index] = part.data
        if len(transfer.parts) < transfer.total:
            return None
        payload = b"".join(transfer.parts[i] for i in range(transfer.total))
        del self._transfers[part.transfer_id]
        if len(payload) != transfer.total_length:
            raise _fail(part, f"assembled {len(payload)} bytes, declared {transfer.total_length}")
        if hashlib.sha256(payload).hexdigest() != transfer.total_sha256.lower():
            raise _fail(part, "sha256 of the assembled payload does not match")
        return payload

    def expire(self, now: float) -> list[tuple[str, PartialDeliveryError]]:
        """Fail every transfer whose deadline passed; returns (transfer_id, error) pairs."""
        expired = [tid for tid, t in self._transfers.items() if t.deadline <= now]
        out = []
        for tid in expired:
            transfer = self._transfers.pop(tid)
            missing = sorted(set(range(transfer.total)) - set(transfer.parts))
            out.append((tid, PartialDeliveryError(
                f"transfer {tid} is incomplete after {self._timeout:.0f} s: missing chunks "
                f"{', '.join(str(i + 1) for i in missing[:20])} of {transfer.total}",
                {"transfer_id": tid, "missing": str(len(missing))},
            )))  # fmt: skip
        return out
