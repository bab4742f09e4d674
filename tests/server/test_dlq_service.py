"""The operator's DLQ tools (RFC 21.1) over real sockets: apiary.v1.DlqService and the
`apiary dlq` command run as a separate process against an in-process coordinator."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from apiary.testing.clock import DEFAULT_START
from apiary.wire import pb
from tests.server.wire_client import Running, envelope, error_detail, open_running, register

apiary_pb2 = pb.apiary_pb2
APIARY = [sys.executable, "-m", "apiary.cli.main"]


@dataclass
class Letters:
    running: Running
    invalid: str
    """alice -> bob, REJECTED validation_error by bob, failed at t0."""
    failed: str
    """alice -> bob, internal_error reported by bob, failed at t0 + 100."""
    unsupported: str
    """bob -> alice, REJECTED unsupported_message_type by alice, failed at t0 + 200."""


async def _send(running: Running, env: pb.common_pb2.Envelope, to: str) -> None:
    router = pb.router_pb2_grpc.RouterServiceStub(running.channel)
    request = pb.router_pb2.SendMessageRequest(msg=env)
    await router.SendMessage(request, metadata=(("sw4rm-recipient", to),))


async def _refused_by(
    running: Running, agent: str, env: pb.common_pb2.Envelope, code: str, note: str
) -> None:
    """`agent` acknowledges `env` REJECTED with `code`: an admitted message that failed."""
    ack = {"ack_for_message_id": env.message_id, "ack_stage": "REJECTED", "error_code": code,
           "note": note}  # fmt: skip
    await _send(running, envelope(agent, ack, message_type=pb.common_pb2.ACKNOWLEDGEMENT), "")


@pytest.fixture
async def letters(tmp_path: Path) -> AsyncIterator[Letters]:
    async with open_running(tmp_path) as r:
        await register(r.channel, "alice", "bob")
        # Only admitted messages that failed are dead letters (a refusal at admission is
        # answered to its sender): each is refused by its recipient.
        invalid = envelope("alice", {"n": 1})
        await _send(r, invalid, "bob")
        await _refused_by(r, "bob", invalid, "validation_error", "n: must be a word")
        r.clock.advance(100)
        failed = envelope("alice", {"task": "resize", "size": 1024})
        await _send(r, failed, "bob")
        ack = {"ack_for_message_id": failed.message_id, "ack_stage": "FAILED",
               "error_code": "internal_error", "note": "out of memory"}  # fmt: skip
        await _send(r, envelope("bob", ack, message_type=pb.common_pb2.ACKNOWLEDGEMENT), "")
        r.clock.advance(100)
        unsupported = envelope("bob", {"image": "iVBORw0KGgo="})
        await _send(r, unsupported, "alice")
        await _refused_by(r, "alice", unsupported, "unsupported_message_type", "no images here")
        yield Letters(r, invalid.message_id, failed.message_id, unsupported.message_id)


def _stub(letters: Letters) -> pb.apiary_pb2_grpc.DlqServiceStub:
    return pb.apiary_pb2_grpc.DlqServiceStub(letters.running.channel)


def _at(offset: float) -> Timestamp:
    ts = Timestamp()
    ts.FromSeconds(int(DEFAULT_START + offset))
    return ts


@pytest.mark.conformance("dlq.facility", "dlq.tools.inspection", "dlq.ops.filter")
async def test_entries_are_listed_and_filtered_over_grpc(letters: Letters) -> None:
    stub = _stub(letters)

    async def listed(**where: object) -> list[str]:
        request = apiary_pb2.ListDlqRequest(filter=apiary_pb2.DlqFilter(**where))  # type: ignore[arg-type]
        return [e.message_id for e in (await stub.List(request)).entries]

    everything = [letters.invalid, letters.failed, letters.unsupported]
    assert await listed() == everything
    assert await listed(since=_at(50)) == everything[1:]
    assert await listed(since=_at(50), until=_at(150)) == [letters.failed]
    assert await listed(error_code="internal_error") == [letters.failed]
    assert await listed(recipient="alice") == [letters.unsupported]
    assert await listed(producer_id="alice") == [letters.invalid, letters.failed]
    assert await listed(producer_id="bob", error_code="validation_error") == []
    page = await stub.List(apiary_pb2.ListDlqRequest(limit=1))
    rest = await stub.List(apiary_pb2.ListDlqRequest(after_id=page.entries[0].entry_id))
    assert [e.message_id for e in [*page.entries, *rest.entries]] == everything


@pytest.mark.conformance("dlq.entry.diagnostics", "dlq.tools.inspection")
async def test_an_entry_carries_its_diagnostics_over_grpc(letters: Letters) -> None:
    stub = _stub(letters)
    listed = await stub.List(apiary_pb2.ListDlqRequest(filter=apiary_pb2.DlqFilter(
        error_code="internal_error")))  # fmt: skip
    entry = await stub.Get(apiary_pb2.GetDlqRequest(entry_id=listed.entries[0].entry_id))
    assert (entry.message_id, entry.error_code, entry.reason) == (
        letters.failed,
        "internal_error",
        "out of memory",
    )
    assert (entry.producer_id, entry.recipient, entry.route) == (
        "alice", "bob", "alice -> coordinator -> bob",
    )  # fmt: skip
    assert entry.message_type == pb.common_pb2.DATA
    assert (entry.created_at.seconds, entry.failed_at.seconds) == (DEFAULT_START + 100,) * 2
    payload = json.dumps({"task": "resize", "size": 1024}).encode()
    assert (entry.content_type, entry.payload_size) == ("application/json", len(payload))
    assert entry.payload_excerpt == payload
    history = [(a.what, a.reason) for a in entry.attempts]
    assert history[0] == ("message.received", "")
    assert history[-1] == ("message.state", "internal_error")
    assert all(a.at.seconds == DEFAULT_START + 100 for a in entry.attempts)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.Get(apiary_pb2.GetDlqRequest(entry_id=999))
    assert caught.value.code() is grpc.StatusCode.NOT_FOUND


@pytest.mark.conformance("dlq.ops.requeue")
async def test_selected_entries_are_requeued_over_grpc(letters: Letters) -> None:
    stub = _stub(letters)
    ids = {e.message_id: e.entry_id for e in (await stub.List(apiary_pb2.ListDlqRequest())).entries}
    # alice is gone: the letter to her has nowhere to go again.
    registry = pb.registry_pb2_grpc.RegistryServiceStub(letters.running.channel)
    await registry.DeregisterAgent(pb.registry_pb2.DeregisterAgentRequest(agent_id="alice"))
    selected = [ids[letters.failed], ids[letters.unsupported], 999]
    reply = await stub.Requeue(apiary_pb2.RequeueDlqRequest(entry_ids=selected))
    ok, nowhere, missing = reply.results
    assert ok.ok and ok.new_message_id not in ("", letters.failed)
    assert not nowhere.ok and nowhere.error.startswith("no_route: no registered agent 'alice'")
    assert not missing.ok and missing.error.startswith("NOT_FOUND")
    stored = await letters.running.coordinator.store.messages.get(ok.new_message_id)
    assert stored is not None and (stored.recipient, stored.state) == ("bob", "RECEIVED")
    entry = await stub.Get(apiary_pb2.GetDlqRequest(entry_id=ids[letters.failed]))
    assert entry.requeued_as == ok.new_message_id and entry.requeued_at.seconds > 0
    (twice,) = (await stub.Requeue(apiary_pb2.RequeueDlqRequest(
        entry_ids=[ids[letters.failed]]))).results  # fmt: skip
    assert not twice.ok and twice.error.startswith("ALREADY_COMPLETED")
    pending = await stub.List(apiary_pb2.ListDlqRequest(
        filter=apiary_pb2.DlqFilter(exclude_requeued=True)))  # fmt: skip
    assert letters.failed not in [e.message_id for e in pending.entries]


async def _dead_letter_at(letters: Letters, retry_count: int) -> int:
    """The entry id of a message at `retry_count` that bob failed (requeueable otherwise)."""
    r = letters.running
    sent = envelope("alice", {"task": "resize"}, retry_count=retry_count)
    await _send(r, sent, "bob")
    ack = {"ack_for_message_id": sent.message_id, "ack_stage": "FAILED",
           "error_code": "internal_error", "note": "out of memory"}  # fmt: skip
    await _send(r, envelope("bob", ack, message_type=pb.common_pb2.ACKNOWLEDGEMENT), "")
    listed = await _stub(letters).List(apiary_pb2.ListDlqRequest())
    (entry_id,) = [e.entry_id for e in listed.entries if e.message_id == sent.message_id]
    return entry_id


@pytest.mark.conformance("dlq.ops.requeue")
async def test_a_requeue_past_the_largest_retry_count_is_refused_naming_the_field(
    letters: Letters,
) -> None:
    stub = _stub(letters)
    last = await _dead_letter_at(letters, 2**32 - 2)
    beyond = await _dead_letter_at(letters, 2**32 - 1)
    reply = await stub.Requeue(apiary_pb2.RequeueDlqRequest(entry_ids=[beyond, last]))
    refused, ok = reply.results
    # The copy of `beyond` would need retry_count 2^32, which an Envelope (uint32) cannot
    # carry: that entry alone is refused and stays pending; the other one is requeued.
    assert (refused.entry_id, refused.ok, refused.new_message_id) == (beyond, False, "")
    assert refused.error.startswith("validation_error: retry_count: is 4294967295")
    assert (await stub.Get(apiary_pb2.GetDlqRequest(entry_id=beyond))).requeued_as == ""
    assert ok.ok
    stored = await letters.running.coordinator.store.messages.get(ok.new_message_id)
    assert stored is not None
    copy = pb.common_pb2.Envelope.FromString(stored.envelope)
    assert copy.retry_count == 2**32 - 1


@pytest.mark.conformance("dlq.ops.export")
async def test_a_filtered_bundle_is_exported_over_grpc(letters: Letters) -> None:
    stub = _stub(letters)
    reply = await stub.Export(apiary_pb2.ExportDlqRequest(
        filter=apiary_pb2.DlqFilter(producer_id="alice")))  # fmt: skip
    assert (reply.content_type, reply.entries) == ("application/json", 2)
    bundle = json.loads(reply.bundle)
    assert [e["message_id"] for e in bundle["entries"]] == [letters.invalid, letters.failed]
    assert all("payload_excerpt_base64" in e for e in bundle["entries"])


async def _export_all(
    stub: pb.apiary_pb2_grpc.DlqServiceStub, **request: Any
) -> tuple[list[str], list[int]]:
    """Every page of one export, following the cursor: the message ids, and each page's size."""
    ids: list[str] = []
    sizes: list[int] = []
    cursor = ""
    while True:
        reply = await stub.Export(apiary_pb2.ExportDlqRequest(cursor=cursor, **request))
        page = [e["message_id"] for e in json.loads(reply.bundle)["entries"]]
        assert reply.entries == len(page)
        ids += page
        sizes.append(reply.entries)
        if not reply.next_cursor:
            return ids, sizes
        cursor = reply.next_cursor


@pytest.mark.conformance("dlq.ops.export", "dlq.ops.filter")
async def test_an_export_comes_page_by_page_following_its_cursor(letters: Letters) -> None:
    stub = _stub(letters)
    everything = [letters.invalid, letters.failed, letters.unsupported]
    assert await _export_all(stub, page_size=2) == (everything, [2, 1])
    assert await _export_all(stub, page_size=1) == (everything, [1, 1, 1])
    # No page size: one page of up to 100, the whole export here (what a caller that knows
    # nothing of pages gets, in the same bundle shape).
    assert await _export_all(stub) == (everything, [3])
    alice = apiary_pb2.DlqFilter(producer_id="alice")
    assert await _export_all(stub, filter=alice, page_size=1) == (
        [letters.invalid, letters.failed], [1, 1],
    )  # fmt: skip
    # A page that ends exactly at the last match still says whether more follow.
    assert await _export_all(stub, filter=alice, page_size=2) == (
        [letters.invalid, letters.failed], [2],
    )  # fmt: skip


async def test_an_export_that_matches_nothing_is_one_empty_page(letters: Letters) -> None:
    reply = await _stub(letters).Export(apiary_pb2.ExportDlqRequest(
        filter=apiary_pb2.DlqFilter(recipient="nobody"), page_size=1))  # fmt: skip
    assert (reply.entries, reply.next_cursor) == (0, "")
    assert json.loads(reply.bundle)["entries"] == []


async def _refused(stub: pb.apiary_pb2_grpc.DlqServiceStub, **request: Any) -> tuple[str, str]:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.Export(apiary_pb2.ExportDlqRequest(**request))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    detail = error_detail(refused.value)
    return detail.error_code, detail.details["field"]


async def test_a_bad_cursor_or_page_size_is_refused_naming_it(letters: Letters) -> None:
    stub = _stub(letters)
    alice = apiary_pb2.DlqFilter(producer_id="alice")
    first = await stub.Export(apiary_pb2.ExportDlqRequest(filter=alice, page_size=1))
    assert first.next_cursor
    bad = ("garbage", "12", f"{2**63}.0123456789abcdef", first.next_cursor + "0", " 1.a")
    for cursor in bad:
        assert await _refused(stub, filter=alice, cursor=cursor) == ("validation_error", "cursor")
    # A cursor is good for the filter it was given with only: another would skip entries.
    for other in (apiary_pb2.DlqFilter(), apiary_pb2.DlqFilter(producer_id="bob")):
        assert await _refused(stub, filter=other, cursor=first.next_cursor) == (
            "validation_error", "cursor",
        )  # fmt: skip
    assert await _refused(stub, page_size=1001) == ("validation_error", "page_size")
    second = await stub.Export(
        apiary_pb2.ExportDlqRequest(filter=alice, page_size=1, cursor=first.next_cursor)
    )
    assert json.loads(second.bundle)["entries"][0]["message_id"] == letters.failed


# --- the CLI, as an operator runs it ---------------------------------------------------------


async def _cli(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *APIARY, "dlq", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.mark.conformance(
    "dlq.tools.inspection", "dlq.ops.filter", "dlq.ops.requeue", "dlq.ops.export"
)
async def test_the_dlq_command_inspects_filters_requeues_and_exports(
    letters: Letters, tmp_path: Path
) -> None:
    address = letters.running.grpc
    code, out, err = await _cli("list", "--grpc", address, "--json")
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["message_id"] for r in rows] == [letters.invalid, letters.failed, letters.unsupported]
    code, out, err = await _cli(
        "list", "--grpc", address, "--json", "--producer", "alice",
        "--since", "2023-11-14T22:14:00Z", "--error", "internal_error", "--route", "bob",
    )  # fmt: skip
    assert code == 0, err
    (row,) = [json.loads(line) for line in out.splitlines()]
    assert row["message_id"] == letters.failed
    entry_id = str(row["entry_id"])
    code, out, err = await _cli("show", entry_id, "--grpc", address)
    assert code == 0, err
    shown = json.loads(out)
    assert (shown["error_code"], shown["route"]) == (
        "internal_error",
        "alice -> coordinator -> bob",
    )
    assert json.loads(shown["payload_excerpt"]) == {"task": "resize", "size": 1024}
    assert shown["attempts"][-1]["reason"] == "internal_error"
    code, out, err = await _cli("requeue", entry_id, "--grpc", address)
    assert code == 0, err
    assert out.startswith(f"{entry_id}: requeued as ")
    code, out, err = await _cli("requeue", entry_id, "--grpc", address)
    assert code == 1 and "ALREADY_COMPLETED" in err
    bundle = tmp_path / "dlq.jsonl"
    code, out, err = await _cli(
        "export", "--grpc", address, "-o", str(bundle), "--until", "2023-11-14T22:15:30Z",
        "--page-size", "1",
    )  # fmt: skip
    assert code == 0, err
    assert out.strip() == f"wrote 2 entries to {bundle}"
    # Page by page (one entry each here), a progress line for each on stderr.
    assert err.splitlines() == [
        "apiary dlq export: 1 written", "apiary dlq export: 2 written",
    ]  # fmt: skip
    exported = [json.loads(line) for line in bundle.read_text().splitlines()]
    assert [e["message_id"] for e in exported] == [letters.invalid, letters.failed]
    assert exported[1]["requeued_as"]
    code, _, err = await _cli("list", "--grpc", address, "--since", "yesterday")
    assert code == 2 and "ISO-8601" in err
