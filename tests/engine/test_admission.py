"""Admission through the router: the message-types Validation Rules, RFC 5.4 payload limits,
RFC 11 fields and TTL, RFC 12 addressing and modalities.

Every refusal is shown to be loud: the error names the code and the field, nothing reaches
the recipient, the producer finds a NACK in its inbox, the refusal is logged and counted
(apiary_router_admission_refused), and the DLQ stays empty: a refused envelope was never admitted
(engine/router/rejections.py).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from apiary.core.envelope import AckStage, Envelope, MessageType
from apiary.core.envelope_rules import KIB, MIB, PayloadLimits
from apiary.core.ids import is_uuid4
from apiary.engine.notices import COORDINATOR
from apiary.engine.settings import RouterSettings
from apiary.errors import ApiaryError
from apiary.testing.engine import EngineHarness, open_test_engine


@pytest.fixture
async def h() -> AsyncIterator[EngineHarness]:
    async with open_test_engine() as harness:
        await harness.register("alice")
        await harness.register("bob")
        yield harness


async def _nacks(h: EngineHarness, agent: str, message_id: str) -> list[dict[str, Any]]:
    return [
        p
        for p in await h.inbox_payloads(agent)
        if p["type"] == "ACKNOWLEDGEMENT" and p.get("ack_for_message_id") == message_id
    ]


async def _delivered_to(h: EngineHarness, agent: str) -> list[str]:
    """message_ids of the agents' messages (not coordinator notices) stored for `agent`."""
    return [
        m.message_id
        for m in await h.store.messages.inbox(agent, 0, 10_000)
        if m.producer_id != COORDINATOR and m.message_type != MessageType.ACKNOWLEDGEMENT
    ]


async def refused(
    h: EngineHarness, env: Envelope, code: str, field: str, *, to: str = "bob"
) -> ApiaryError:
    """Send `env` and check every consequence of a refusal at admission."""
    counted = h.engine.router.stats.admission_refused
    before = counted[code]
    with pytest.raises(ApiaryError) as caught:
        await h.send_env(env, to)
    error = caught.value
    assert (error.code, error.details.get("field")) == (code, field), error
    assert await h.store.messages.get(env.message_id) is None
    assert env.message_id not in await _delivered_to(h, to)
    (nack,) = await _nacks(h, env.producer_id, env.message_id)
    assert (nack["ack_stage"], nack["error_code"], nack["failed_stage"]) == (
        "REJECTED",
        code.upper(),
        "SENT",
    )
    assert nack["note"].startswith(f"{field}:")
    (rejected,) = [
        e for e in await h.events("message.rejected") if e.details["message_id"] == env.message_id
    ]
    assert rejected.details["error_code"] == code
    assert counted[code] == before + 1
    assert await h.store.dlq.list() == []
    return error


# --- required fields (message-types rule 1, RFC 11) -------------------------------------------


@pytest.mark.conformance(
    "envelope.validation.required-fields", "router.fields.message-type",
    "transport.correlation.correlation-id-required",
)  # fmt: skip
@pytest.mark.parametrize(
    ("field", "change"),
    [
        ("correlation_id", {"correlation_id": ""}),
        ("message_type", {"message_type": MessageType.MESSAGE_TYPE_UNSPECIFIED}),
        ("message_id", {"message_id": "m-1"}),
    ],
)
async def test_a_missing_required_field_is_refused(
    h: EngineHarness, field: str, change: dict[str, Any]
) -> None:
    env = h.envelope("alice", {"n": 1}, **change)
    await refused(h, env, "validation_error", field)


@pytest.mark.conformance("router.fields.producer-id", "envelope.validation.required-fields")
async def test_an_envelope_without_producer_is_refused_and_logged(h: EngineHarness) -> None:
    env = h.envelope("", {"n": 1})
    with pytest.raises(ApiaryError) as caught:
        await h.send_env(env, "bob")
    assert (caught.value.code, caught.value.details["field"]) == ("validation_error", "producer_id")
    assert await _delivered_to(h, "bob") == []
    # There is nobody to NACK; the caller has the error, the operator the event and the count.
    (rejected,) = await h.events("message.rejected")
    assert (rejected.details["message_id"], rejected.details["error_code"]) == (
        env.message_id,
        "validation_error",
    )
    assert h.engine.router.stats.admission_refused["validation_error"] == 1
    assert await h.store.dlq.list() == []


@pytest.mark.conformance(
    "transport.correlation.correlation-id-required", "transport.payload.declare-content-length",
    "envelope.content-length.accurate", "envelope.content-type.declared",
    "router.fields.content-type-length", "router.fields.sequence-number",
    "router.fields.producer-id",
)  # fmt: skip
async def test_the_coordinators_own_messages_carry_every_required_field(h: EngineHarness) -> None:
    await h.connect("alice")  # presence notices and heartbeats reach connected agents
    await h.register("carol")
    bad = h.envelope("alice", {"n": 1}, content_length=1)
    with pytest.raises(ApiaryError):
        await h.send_env(bad, "bob")
    await h.engine.presence.tick()
    notices = [
        h.engine.router.codec.decode(m.envelope)
        for m in await h.store.messages.inbox("alice", 0, 10_000)
    ]
    kinds = {n.message_type for n in notices}
    assert {MessageType.NOTIFICATION, MessageType.ACKNOWLEDGEMENT, MessageType.HEARTBEAT} <= kinds
    for notice in notices:
        assert notice.producer_id == COORDINATOR
        assert is_uuid4(notice.message_id)
        assert notice.correlation_id
        assert notice.content_type == "application/json"
        assert notice.content_length == len(notice.payload) > 0
    numbers = [n.sequence_number for n in notices]
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)


# --- payload metadata, consistency, type safety, encoding (rules 2, 4, 5, 8) -------------------


@pytest.mark.conformance(
    "envelope.validation.payload-metadata", "router.fields.content-type-length",
    "transport.payload.declare-content-length", "envelope.content-type.declared",
    "addressing.content-type.mime",
)  # fmt: skip
@pytest.mark.parametrize(
    ("field", "change"),
    [("content_type", {"content_type": ""}), ("content_length", {"content_length": 0})],
)
async def test_a_payload_needs_content_type_and_length(
    h: EngineHarness, field: str, change: dict[str, Any]
) -> None:
    await refused(h, h.envelope("alice", {"n": 1}, **change), "validation_error", field)


@pytest.mark.conformance(
    "envelope.validation.content-length-match", "envelope.content-length.accurate"
)
@pytest.mark.parametrize("declared", [1, 100])
async def test_content_length_must_match_the_payload(h: EngineHarness, declared: int) -> None:
    env = h.envelope("alice", {"n": 1}, content_length=declared)
    error = await refused(h, env, "validation_error", "content_length")
    assert error.details["actual"] == str(len(env.payload))


@pytest.mark.conformance("addressing.content-type.mime", "envelope.content-type.declared")
@pytest.mark.parametrize("content_type", ["json", "application/", "*/*", "text/plain; charset"])
async def test_content_type_must_be_a_mime_type(h: EngineHarness, content_type: str) -> None:
    env = h.envelope("alice", b"hello", content_type=content_type)
    if content_type == "text/plain; charset":
        # A parameter without a value is ignored; the type itself is fine.
        assert (await h.send_env(env, "bob")).accepted
        return
    await refused(h, env, "validation_error", "content_type")


@pytest.mark.conformance("envelope.validation.payload-type-safety")
@pytest.mark.parametrize(
    ("content_type", "payload"),
    [
        ("application/json", b"{not json"),
        ("application/json", b'{"x": NaN}'),
        ("application/problem+json", b"[1, 2"),
    ],
)
async def test_payload_must_be_valid_for_its_content_type(
    h: EngineHarness, content_type: str, payload: bytes
) -> None:
    await h.register("bob", modalities=["application/json", "application/problem+json"])
    env = h.envelope("alice", payload, content_type=content_type)
    await refused(h, env, "validation_error", "payload")


async def test_opaque_content_types_are_not_parsed(h: EngineHarness) -> None:
    await h.register("bob", modalities=["application/protobuf", "application/octet-stream"])
    for content_type in ("application/protobuf", "application/octet-stream"):
        env = h.envelope("alice", b"\x08\x96\x01\xff", content_type=content_type)
        assert (await h.send_env(env, "bob")).accepted


@pytest.mark.conformance("envelope.validation.utf8-text")
@pytest.mark.parametrize(
    ("content_type", "payload", "field"),
    [
        ("text/plain", b"caf\xe9", "payload"),
        ("application/json", b'"caf\xe9"', "payload"),
        ("text/plain; charset=latin-1", b"cafe", "content_type"),
    ],
)
async def test_text_payloads_must_be_utf8(
    h: EngineHarness, content_type: str, payload: bytes, field: str
) -> None:
    env = h.envelope("alice", payload, content_type=content_type)
    await refused(h, env, "validation_error", field)
    ok = h.envelope("alice", "café ☕".encode(), content_type="text/plain; charset=utf-8")
    assert (await h.send_env(ok, "bob")).accepted


# --- payload size (RFC 5.4) ---------------------------------------------------------------------


@pytest.mark.conformance(
    "transport.payload.oversize-reject", "transport.payload.max-size-configurable"
)
async def test_oversize_payloads_are_rejected_by_per_type_configurable_limits() -> None:
    limits = PayloadLimits().with_overrides({"data": 100, "CONTROL": 200})
    async with open_test_engine(RouterSettings(limits=limits)) as h:
        await h.register("alice")
        await h.register("bob", modalities=["application/octet-stream"])
        at_limit = h.envelope("alice", b"x" * 100, content_type="application/octet-stream")
        assert (await h.send_env(at_limit, "bob")).accepted
        over = h.envelope("alice", b"x" * 101, content_type="application/octet-stream")
        error = await refused(h, over, "oversize_payload", "content_length")
        assert error.details == {
            "field": "content_length", "size": "101", "limit": "100", "message_type": "DATA",
        }  # fmt: skip
        control = h.envelope(
            "alice", b"x" * 150, content_type="application/octet-stream",
            message_type=MessageType.CONTROL,
        )  # fmt: skip
        assert (await h.send_env(control, "bob")).accepted
        too_big = h.envelope(
            "alice", b"x" * 201, content_type="application/octet-stream",
            message_type=MessageType.CONTROL,
        )  # fmt: skip
        await refused(h, too_big, "oversize_payload", "content_length")


@pytest.mark.conformance("transport.payload.oversize-reject")
@pytest.mark.parametrize(
    ("message_type", "limit"),
    [
        (MessageType.CONTROL, 64 * KIB),
        (MessageType.DATA, 16 * MIB),
        (MessageType.NOTIFICATION, 32 * KIB),
        (MessageType.HITL_INVOCATION, 256 * KIB),
        (MessageType.TOOL_CALL, 1 * MIB),
    ],
)
async def test_default_limits_are_the_message_types_table(
    h: EngineHarness, message_type: MessageType, limit: int
) -> None:
    # The declared length is judged before the payload is read: a receiver refuses early.
    env = h.envelope("alice", b"{}", message_type=message_type, content_length=limit + 1)
    error = await refused(h, env, "oversize_payload", "content_length")
    assert error.details["limit"] == str(limit)


async def test_an_oversize_acknowledgement_is_refused_without_a_nack(h: EngineHarness) -> None:
    sent = await h.send("alice", "bob", {"n": 1})
    body = json.dumps({"ack_for_message_id": sent.message_id, "ack_stage": "READ",
                       "note": "x" * (4 * KIB)}).encode()  # fmt: skip
    ack = h.envelope("bob", body, message_type=MessageType.ACKNOWLEDGEMENT)
    with pytest.raises(ApiaryError) as caught:
        await h.send_env(ack)
    assert caught.value.code == "oversize_payload"
    assert (await h.message(sent.message_id)).state == "RECEIVED"
    # ACKs are never NACKed (that could loop), but the refusal is logged and counted.
    assert await _nacks(h, "bob", ack.message_id) == []
    assert [e.details["message_id"] for e in await h.events("message.rejected")] == [ack.message_id]
    assert h.engine.router.stats.admission_refused["oversize_payload"] == 1
    assert await h.store.dlq.list() == []


# --- TTL and HLC (RFC 11) -------------------------------------------------------------------------


async def test_a_message_expired_before_admission_is_ttl_expired(h: EngineHarness) -> None:
    env = h.envelope("alice", {"n": 1}, ttl_ms=1000, timestamp=h.clock.now() - 5)
    await refused(h, env, "ttl_expired", "ttl_ms")
    fresh = h.envelope("alice", {"n": 1}, ttl_ms=1000, timestamp=h.clock.now() - 0.5)
    outcome = await h.send_env(fresh, "bob")
    assert outcome.stored is not None and outcome.stored.expires_at == fresh.timestamp + 1.0


@pytest.mark.conformance("router.fields.hlc-when-enabled")
async def test_hlc_timestamp_is_required_when_hlc_is_enabled() -> None:
    async with open_test_engine(RouterSettings(hlc_required=True)) as h:
        await h.register("alice")
        await h.connect("alice")
        await h.register("bob")
        await refused(h, h.envelope("alice", {"n": 1}), "validation_error", "hlc_timestamp")
        garbled = h.envelope("alice", {"n": 1}, hlc_timestamp="yesterday")
        await refused(h, garbled, "validation_error", "hlc_timestamp")
        stamped = h.envelope("alice", {"n": 1}, hlc_timestamp="HLC:1700000000000000:0:alice")
        assert (await h.send_env(stamped, "bob")).accepted
        # The coordinator's own notices carry one too, so join/leave and NACKs still flow.
        events = {p.get("event") for p in await h.inbox_payloads("alice")}
        assert {"directory", "agent_joined"} <= events


async def test_hlc_is_not_checked_when_disabled(h: EngineHarness) -> None:
    env = h.envelope("alice", {"n": 1}, hlc_timestamp="not an hlc")
    assert (await h.send_env(env, "bob")).accepted


# --- addressing and modalities (RFC 12) -----------------------------------------------------------


@pytest.mark.conformance("addressing.unicast-only")
async def test_a_message_reaches_exactly_one_recipient(h: EngineHarness) -> None:
    await h.register("carol")
    outcome = await h.send("alice", "bob", {"to": "carol"})  # explicit recipient wins
    assert outcome.recipient == "bob"
    assert await _delivered_to(h, "bob") == [outcome.message_id]
    assert await _delivered_to(h, "carol") == []
    by_payload = await h.send_env(h.envelope("alice", {"to": "carol"}))
    assert await _delivered_to(h, "carol") == [by_payload.message_id]
    # No recipient is not a broadcast: it is refused.
    nowhere = h.envelope("alice", {"n": 1})
    with pytest.raises(ApiaryError) as caught:
        await h.send_env(nowhere)
    assert caught.value.code == "no_route"
    assert h.engine.router.stats.admission_refused["no_route"] == 1
    assert await h.store.dlq.list() == []


@pytest.mark.conformance(
    "addressing.modality.enforce", "addressing.modality.reject-unsupported"
)  # fmt: skip
async def test_a_content_type_outside_the_targets_modalities_is_refused(h: EngineHarness) -> None:
    await h.register("bob", modalities=["application/json"])
    env = h.envelope("alice", b"plain words", content_type="text/plain")
    error = await refused(h, env, "unsupported_message_type", "content_type")
    assert error.details["modalities"] == "application/json"
    assert (await h.send("alice", "bob", {"n": 1})).accepted


@pytest.mark.conformance("addressing.modality.enforce")
async def test_wildcard_modalities_cover_their_subtypes(h: EngineHarness) -> None:
    await h.register("viewer", modalities=["image/*", "Application/JSON"])
    png = h.envelope("alice", b"\x89PNG\r\n", content_type="image/png")
    assert (await h.send_env(png, "viewer")).accepted
    jpeg = h.envelope("alice", b"\xff\xd8\xff", content_type="IMAGE/JPEG")
    assert (await h.send_env(jpeg, "viewer")).accepted
    json_env = h.envelope("alice", {"n": 1}, content_type="application/json; charset=utf-8")
    assert (await h.send_env(json_env, "viewer")).accepted
    wav = h.envelope("alice", b"RIFF", content_type="audio/wav")
    await refused(h, wav, "unsupported_message_type", "content_type", to="viewer")


@pytest.mark.conformance(
    "addressing.content-type.json-protobuf", "addressing.content-type.text-plain"
)
async def test_json_protobuf_and_text_plain_are_supported(h: EngineHarness) -> None:
    # An agent that declares nothing accepts the two types every implementation must.
    await h.register("plain", modalities=())
    for content_type, payload in (
        ("application/json", b"{}"),
        ("application/protobuf", b"\x08\x01"),
    ):
        env = h.envelope("alice", payload, content_type=content_type)
        assert (await h.send_env(env, "plain")).accepted, content_type
    text = h.envelope("alice", b"hello", content_type="text/plain")
    await refused(h, text, "unsupported_message_type", "content_type", to="plain")
    # text/plain is supported for agents that declare it.
    await h.register("reader", modalities=["text/plain"])
    again = h.envelope("alice", b"hello", content_type="text/plain")
    assert (await h.send_env(again, "reader")).accepted


async def test_nacks_reach_a_producer_whatever_modalities_it_declared(h: EngineHarness) -> None:
    await h.register("camera", modalities=["image/*"])
    env = h.envelope("camera", {"n": 1}, content_length=1)
    await refused(h, env, "validation_error", "content_length")


# --- responses echo the request's correlation (RFC 11.3, message-types rule 6) ------------------


@pytest.mark.conformance(
    "ids.correlation-id.response-echo", "envelope.correlation-id.response-echo",
    "envelope.validation.correlation-echo",
)  # fmt: skip
async def test_the_coordinators_responses_echo_the_request_correlation_id(
    h: EngineHarness,
) -> None:
    bad = h.envelope("alice", {"n": 1}, content_length=2, correlation_id="wf-bad")
    with pytest.raises(ApiaryError):
        await h.send_env(bad, "bob")
    timed = await h.send("alice", "bob", {"n": 2}, correlation_id="wf-timeout")
    await h.take("bob")  # handed out: its ACK deadline runs
    h.clock.advance(10.5)
    await h.fire()
    token = "alice:op:echo"
    done = await h.send("alice", "bob", {"n": 3}, idempotency_token=token,
                        correlation_id="wf-done")  # fmt: skip
    await h.ack("bob", done.message_id, AckStage.FULFILLED)
    dup = h.envelope("alice", {"n": 3}, idempotency_token=token, correlation_id="wf-dup")
    assert not (await h.send_env(dup, "bob")).accepted
    responses = {}
    for stored in await h.store.messages.inbox("alice", 0, 10_000):
        env = h.engine.router.codec.decode(stored.envelope)
        if env.message_type is MessageType.ACKNOWLEDGEMENT:
            responses[json.loads(env.payload)["ack_for_message_id"]] = env.correlation_id
    assert responses[bad.message_id] == "wf-bad"
    assert responses[timed.message_id] == "wf-timeout"
    assert responses[dup.message_id] == "wf-dup"


# --- timestamps in payloads (message-types rule 7) ------------------------------------------------


def _is_iso_with_zone(text: object) -> bool:
    if not isinstance(text, str):
        return False
    return dt.datetime.fromisoformat(text).tzinfo is not None


@pytest.mark.conformance("envelope.validation.iso8601-timestamps")
async def test_timestamps_the_coordinator_writes_are_iso8601_with_timezone(
    h: EngineHarness,
) -> None:
    await h.connect("bob")
    await h.engine.presence.tick()
    heartbeats = [p for p in await h.inbox_payloads("bob") if p["type"] == "HEARTBEAT"]
    assert heartbeats and all(_is_iso_with_zone(p["at"]) for p in heartbeats)
    token = "alice:op:iso"
    first = await h.send("alice", "bob", {"n": 1}, idempotency_token=token)
    await h.ack("bob", first.message_id, AckStage.FULFILLED)
    again = await h.send("alice", "bob", {"n": 1}, idempotency_token=token)
    assert _is_iso_with_zone(again.details["cached_at"])
    (notice,) = [p for p in await h.inbox_payloads("alice") if p.get("status")]
    assert _is_iso_with_zone(notice["cached_at"])
    failed = await h.send("alice", "bob", {"n": 2})
    await h.ack("bob", failed.message_id, AckStage.FAILED, "internal_error", "crashed")
    bundle = (await h.engine.router.dead_letters.export(None, include_payloads=False)).bundle
    (entry,) = json.loads(bundle)["entries"]
    stamps = [entry["created_at"], entry["failed_at"], *(a["at"] for a in entry["attempts"])]
    assert all(_is_iso_with_zone(s) for s in stamps)
    assert _is_iso_with_zone(json.loads(bundle)["exported_at"])
