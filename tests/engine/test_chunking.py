"""Chunked transfers (RFC 5.4): negotiated per route, verified chunk by chunk, released
whole, failed with a descriptive error on corruption or when left incomplete."""

from __future__ import annotations

import hashlib
import uuid

import pytest

from apiary.core.chunks import CHUNK_CONTENT_TYPE
from apiary.errors import ValidationError
from apiary.sdk.chunking import chunk_payloads
from apiary.testing.engine import EngineHarness, open_test_engine
from apiary.wire import pb

PAYLOAD = bytes(range(256)) * 40  # 10 KiB


def _chunks(transfer_id: str, payload: bytes = PAYLOAD, size: int = 4096) -> list[bytes]:
    return list(chunk_payloads(transfer_id, payload, "application/octet-stream", size))


async def _send_chunk(h: EngineHarness, chunk: bytes, to: str = "bob") -> object:
    return await h.send("alice", to, chunk, content_type=CHUNK_CONTENT_TYPE)


async def _harness(h: EngineHarness, *, negotiated: bool = True) -> None:
    await h.register("alice")
    await h.register(
        "bob", modalities=["application/octet-stream"],
        capabilities=["chunking"] if negotiated else [],
    )  # fmt: skip


@pytest.mark.conformance(
    "transport.chunking.sequence-info", "transport.chunking.integrity-hash",
    "transport.chunking.process-after-reassembly",
)  # fmt: skip
async def test_a_complete_transfer_is_delivered_whole_and_only_then() -> None:
    async with open_test_engine() as h:
        await _harness(h)
        transfer = str(uuid.uuid4())
        chunks = _chunks(transfer)
        assert len(chunks) == 3
        for chunk in (chunks[2], chunks[0]):  # out of order is fine
            outcome = await _send_chunk(h, chunk)
            assert outcome.accepted  # type: ignore[attr-defined]
            assert await h.take("bob") == []  # nothing reaches the recipient before the end
        await _send_chunk(h, chunks[1])
        (handout,) = await h.take("bob")
        env = h.engine.router.codec.decode(handout.message.envelope)
        assert (env.message_id, env.payload, env.content_type) == (
            transfer, PAYLOAD, "application/octet-stream",
        )  # fmt: skip
        assert [e.details["chunks"] for e in await h.events("transfer.completed")] == [3]


@pytest.mark.conformance("transport.chunking.negotiated")
async def test_chunks_to_a_route_without_chunking_are_refused() -> None:
    async with open_test_engine() as h:
        await _harness(h, negotiated=False)
        with pytest.raises(ValidationError, match="chunking is not negotiated"):
            await _send_chunk(h, _chunks(str(uuid.uuid4()))[0])


@pytest.mark.conformance("transport.chunking.validate-integrity", "transport.chunking.fail-partial")
async def test_a_corrupted_chunk_fails_the_transfer_with_a_descriptive_error() -> None:
    async with open_test_engine() as h:
        await _harness(h)
        transfer = str(uuid.uuid4())
        chunks = _chunks(transfer)
        await _send_chunk(h, chunks[0])
        bad = pb.apiary_pb2.Chunk.FromString(chunks[1])
        bad.data = b"x" + bad.data[1:]
        with pytest.raises(ValidationError, match=r"chunk 2 of 3 .* sha256 .* send it again"):
            await _send_chunk(h, bad.SerializeToString())
        # The transfer is gone: the remaining chunk starts a new, incomplete one.
        await _send_chunk(h, chunks[2])
        assert await h.take("bob") == []
        assert len(await h.events("transfer.failed")) == 1


@pytest.mark.conformance("transport.chunking.fail-partial")
async def test_an_incomplete_transfer_expires_and_the_producer_is_nacked() -> None:
    async with open_test_engine() as h:
        await _harness(h)
        transfer = str(uuid.uuid4())
        await _send_chunk(h, _chunks(transfer)[0])
        h.clock.advance(61)
        await h.fire()
        nacks = [
            p for p in await h.inbox_payloads("alice") if p.get("error_code") == "PARTIAL_DELIVERY"
        ]
        assert [n["ack_for_message_id"] for n in nacks] == [transfer]
        assert "missing chunks 2, 3 of 3" in nacks[0]["note"]


async def test_a_wrong_total_digest_fails_the_transfer() -> None:
    async with open_test_engine() as h:
        await _harness(h)
        transfer = str(uuid.uuid4())
        parts = [pb.apiary_pb2.Chunk.FromString(c) for c in _chunks(transfer)]
        for part in parts:
            part.total_sha256 = hashlib.sha256(b"something else").hexdigest()
        for part in parts[:-1]:
            await _send_chunk(h, part.SerializeToString())
        with pytest.raises(ValidationError, match="assembled payload does not match"):
            await _send_chunk(h, parts[-1].SerializeToString())
        assert await h.take("bob") == []
