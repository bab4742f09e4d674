"""Envelope admission: the message-types Validation Rules, RFC 5.4 sizes, TTL, HLC, RFC 12."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apiary.core.envelope import Envelope, MessageType
from apiary.core.envelope_rules import (
    IMPLICIT_MODALITIES,
    KIB,
    MAX_PAYLOAD_LIMIT,
    MIB,
    PayloadLimits,
    check_modality,
    check_payload_type,
    content_type_base,
    is_media_range,
    media_type_params,
    ttl_deadline,
    validate_envelope,
)
from apiary.errors import (
    ApiaryError,
    OversizePayloadError,
    TtlExpiredError,
    UnsupportedMessageTypeError,
    ValidationError,
)

M1 = "6ae58b74-4e19-4b2f-9e7a-1a1a1fd2d001"
UUID1 = "6ae58b74-4e19-1b2f-9e7a-1a1a1fd2d001"
NOW = 1_754_661_802.0
LIMITS = PayloadLimits()
JSON_PAYLOAD = b'{"to":"agent-b","x":1}'


def env(**changes: Any) -> Envelope:
    base = Envelope(
        message_id=M1,
        producer_id="agent-a",
        message_type=MessageType.DATA,
        payload=JSON_PAYLOAD,
        content_type="application/json",
        content_length=len(JSON_PAYLOAD),
        correlation_id="wf-1",
    )
    return dataclasses.replace(base, **changes)


def with_payload(payload: bytes, content_type: str, **changes: Any) -> Envelope:
    return env(payload=payload, content_type=content_type, content_length=len(payload), **changes)


def refused(
    e: Envelope, exc_type: type[ApiaryError] = ValidationError, **kwargs: Any
) -> ApiaryError:
    options: dict[str, Any] = {"limits": LIMITS, "now": NOW, **kwargs}
    with pytest.raises(exc_type) as info:
        validate_envelope(e, **options)
    assert type(info.value) is exc_type or exc_type is ValidationError
    return info.value


# --- accepted envelopes -----------------------------------------------------------------------


def test_a_complete_envelope_is_accepted() -> None:
    validate_envelope(env(), limits=LIMITS, now=NOW)


def test_an_envelope_without_payload_needs_no_content_metadata() -> None:
    validate_envelope(env(payload=b"", content_type="", content_length=0), limits=LIMITS, now=NOW)


def test_proto3_zero_scalars_are_accepted() -> None:
    # sequence_number and retry_count cannot be told apart from "unset" in proto3.
    validate_envelope(env(sequence_number=0, retry_count=0), limits=LIMITS, now=NOW)


@given(
    doc=st.recursive(
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
        max_leaves=20,
    )
)
def test_any_json_document_is_accepted(doc: object) -> None:
    payload = json.dumps(doc).encode()
    validate_envelope(with_payload(payload, "application/json"), limits=LIMITS, now=NOW)


@given(text=st.text(min_size=1))
def test_any_utf8_text_is_accepted(text: str) -> None:
    payload = text.encode("utf-8")
    validate_envelope(with_payload(payload, "text/plain; charset=utf-8"), limits=LIMITS, now=NOW)


@given(data=st.binary(min_size=1, max_size=256))
@pytest.mark.parametrize(
    "content_type", ["application/protobuf", "application/octet-stream", "image/png"]
)
def test_binary_types_are_opaque(content_type: str, data: bytes) -> None:
    validate_envelope(with_payload(data, content_type), limits=LIMITS, now=NOW)


# --- rule 1: required fields ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"message_id": ""}, "message_id"),
        ({"message_id": "m1"}, "message_id"),
        ({"message_id": UUID1}, "message_id"),
        ({"producer_id": ""}, "producer_id"),
        ({"correlation_id": ""}, "correlation_id"),
        ({"message_type": MessageType.MESSAGE_TYPE_UNSPECIFIED}, "message_type"),
        ({"message_type": 99}, "message_type"),
        ({"sequence_number": -1}, "sequence_number"),
        ({"retry_count": 2**32}, "retry_count"),
    ],
)
def test_required_fields(changes: dict[str, Any], field: str) -> None:
    error = refused(env(**changes))
    assert error.code == "validation_error"
    assert error.details["field"] == field


# --- rule 2: payload metadata, RFC 12 content type syntax -------------------------------------


def test_payload_needs_a_content_type() -> None:
    assert refused(env(content_type="")).details["field"] == "content_type"


def test_payload_needs_a_content_length() -> None:
    error = refused(env(content_length=0))
    assert error.details["field"] == "content_length"
    assert "required" in error.message


@pytest.mark.parametrize(
    "content_type", ["json", "*/*", "image/*", "text/ plain", "/json", "application/", "a b/c"]
)
def test_content_type_must_be_a_concrete_mime_type(content_type: str) -> None:
    error = refused(env(content_type=content_type))
    assert error.details["field"] == "content_type"


def test_content_type_is_checked_even_without_payload() -> None:
    error = refused(env(payload=b"", content_length=0, content_type="nonsense"))
    assert error.details["field"] == "content_type"


@pytest.mark.parametrize("charset", ["latin-1", "utf-16", "ISO-8859-1"])
def test_declared_charset_must_be_utf8(charset: str) -> None:
    error = refused(with_payload(b"hello", f"text/plain; charset={charset}"))
    assert error.details["field"] == "content_type"


@pytest.mark.parametrize(
    "content_type",
    ['application/json; charset="UTF-8"', "application/json;charset=utf8", "Application/JSON"],
)
def test_utf8_charsets_and_case_are_accepted(content_type: str) -> None:
    validate_envelope(env(content_type=content_type), limits=LIMITS, now=NOW)


# --- rule 4: content_length matches the payload -----------------------------------------------


def test_content_length_must_match_the_payload() -> None:
    error = refused(env(content_length=len(JSON_PAYLOAD) - 1))
    assert error.details == {
        "field": "content_length",
        "declared": str(len(JSON_PAYLOAD) - 1),
        "actual": str(len(JSON_PAYLOAD)),
    }


def test_content_length_without_payload_is_a_mismatch() -> None:
    error = refused(env(payload=b"", content_length=3))
    assert error.details["field"] == "content_length"


@given(declared=st.integers(1, 64), actual=st.binary(min_size=1, max_size=64))
def test_consistency_is_exact(declared: int, actual: bytes) -> None:
    e = env(payload=actual, content_type="application/octet-stream", content_length=declared)
    if declared == len(actual):
        validate_envelope(e, limits=LIMITS, now=NOW)
    else:
        assert refused(e).details["field"] == "content_length"


# --- RFC 5.4: per-type payload limits ---------------------------------------------------------


def test_default_limits_are_the_message_types_table() -> None:
    assert PayloadLimits().as_dict() == {
        "CONTROL": 64 * KIB,
        "DATA": 16 * MIB,
        "HEARTBEAT": 4 * KIB,
        "NOTIFICATION": 32 * KIB,
        "ACKNOWLEDGEMENT": 4 * KIB,
        "HITL_INVOCATION": 256 * KIB,
        "WORKTREE_CONTROL": 64 * KIB,
        "NEGOTIATION": 1 * MIB,
        "TOOL_CALL": 1 * MIB,
        "TOOL_RESULT": 16 * MIB,
        "TOOL_ERROR": 64 * KIB,
    }


@pytest.mark.parametrize("message_type", [t for t in MessageType if t.value])
def test_every_type_is_limited_at_its_limit(message_type: MessageType) -> None:
    limit = LIMITS.limit_for(message_type)
    at_limit = with_payload(b"\0" * limit, "application/octet-stream", message_type=message_type)
    validate_envelope(at_limit, limits=LIMITS, now=NOW)
    over = with_payload(b"\0" * (limit + 1), "application/octet-stream", message_type=message_type)
    error = refused(over, OversizePayloadError)
    assert error.code == "oversize_payload"
    assert error.details == {
        "field": "content_length",
        "size": str(limit + 1),
        "limit": str(limit),
        "message_type": message_type.name,
    }
    assert str(limit) in error.message


def test_declared_length_over_the_limit_is_refused_before_reading() -> None:
    limits = PayloadLimits().with_overrides({"DATA": 10})
    error = refused(env(content_length=11, payload=b"{}"), OversizePayloadError, limits=limits)
    assert error.details["field"] == "content_length"


def test_actual_payload_over_the_limit_is_oversize_even_if_declared_small() -> None:
    limits = PayloadLimits().with_overrides({"DATA": 10})
    payload = b'{"k":"0123456789"}'
    error = refused(env(payload=payload, content_length=2), OversizePayloadError, limits=limits)
    assert error.details["field"] == "payload"
    assert error.details["size"] == str(len(payload))


@given(limit=st.integers(1, 64), size=st.integers(1, 96))
def test_oversize_iff_size_exceeds_limit(limit: int, size: int) -> None:
    limits = PayloadLimits().with_overrides({"control": limit})
    e = with_payload(b"x" * size, "application/octet-stream", message_type=MessageType.CONTROL)
    if size <= limit:
        validate_envelope(e, limits=limits, now=NOW)
    else:
        assert refused(e, OversizePayloadError, limits=limits).details["limit"] == str(limit)


def test_overrides_replace_only_the_named_types() -> None:
    limits = PayloadLimits().with_overrides({"data": 100, " Tool_Call ": 200})
    assert limits.data == 100
    assert limits.tool_call == 200
    assert limits.control == 64 * KIB
    assert PayloadLimits().data == 16 * MIB


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"FOO": 1}, "payload_limits.FOO"),
        ({"MESSAGE_TYPE_UNSPECIFIED": 1}, "payload_limits.MESSAGE_TYPE_UNSPECIFIED"),
        ({"DATA": 0}, "payload_limits.DATA"),
        ({"DATA": -5}, "payload_limits.DATA"),
        ({"DATA": True}, "payload_limits.DATA"),
        ({"DATA": "10"}, "payload_limits.DATA"),
        ({"DATA": 1.5}, "payload_limits.DATA"),
        ({"DATA": MAX_PAYLOAD_LIMIT + 1}, "payload_limits.DATA"),
    ],
)
def test_bad_overrides_name_the_limit(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        PayloadLimits().with_overrides(overrides)
    assert info.value.details["field"] == field


def test_limits_are_checked_on_construction() -> None:
    with pytest.raises(ValidationError) as info:
        PayloadLimits(heartbeat=0)
    assert info.value.details["field"] == "payload_limits.HEARTBEAT"


def test_unspecified_has_no_limit() -> None:
    with pytest.raises(ValueError, match="UNSPECIFIED"):
        LIMITS.limit_for(MessageType.MESSAGE_TYPE_UNSPECIFIED)


# --- rules 5 and 8: type safety ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "content_type"),
    [
        (b"{not json", "application/json"),
        (b"NaN", "application/json"),
        (b'{"x": Infinity}', "application/json"),
        (b"\xef\xbb\xbf{}", "application/json"),  # a BOM is not JSON text (RFC 8259)
        ('{"name": "é"}'.encode("latin-1"), "application/json"),
        ('"x"'.encode("utf-16"), "application/json"),
        (b"{", "application/vnd.sw4rm.ack+json"),
        (b"[" * 100_000, "application/json"),
        (b"\xff\xfe", "text/plain"),
        (b"caf\xe9", "text/markdown"),
        (b"<a>\xff</a>", "application/xml"),
        (b"<a>\xff</a>", "image/svg+xml"),
        (b"\xc3", "application/x-ndjson"),
        (b'{"a":1}x', "application/json"),
        (b"{} {}", "application/json"),
        (b"1 2", "application/json"),
        (b" NaN ", "application/json"),
    ],
)
def test_payload_must_be_valid_for_its_content_type(payload: bytes, content_type: str) -> None:
    error = refused(with_payload(payload, content_type))
    assert error.details["field"] == "payload"
    with pytest.raises(ValidationError):
        check_payload_type(content_type, payload)


def _strict_json(payload: bytes) -> bool:
    """The reference: UTF-8 JSON text without a BOM, NaN or the infinities (RFC 8259)."""

    def refuse(name: str) -> None:
        raise ValueError(name)

    try:
        text = payload.decode("utf-8")
        json.loads(text, parse_constant=refuse)
    except (ValueError, RecursionError):
        return False
    return True


@given(
    st.binary(min_size=1, max_size=40)
    | st.text(alphabet=' \t\n\ufeff{}[]":,0123456789.eE+-truefalsnNIiy\\', min_size=1,
              max_size=40).map(str.encode)
)  # fmt: skip
def test_json_payloads_are_refused_exactly_when_they_are_not_strict_json(payload: bytes) -> None:
    envelope = with_payload(payload, "application/json")
    if _strict_json(payload):
        validate_envelope(envelope, limits=LIMITS, now=NOW)
    else:
        assert refused(envelope).details["field"] == "payload"


@pytest.mark.parametrize("payload", [b' {"a": 1}', b'{"a": 1}\n', b"\t[1, 2]\r\n", b'"x"', b"0"])
def test_json_with_whitespace_around_it_is_accepted(payload: bytes) -> None:
    validate_envelope(with_payload(payload, "application/json"), limits=LIMITS, now=NOW)


def test_type_safety_comes_after_the_cheap_checks() -> None:
    bad_json = with_payload(b"{", "application/json", ttl_ms=1000, timestamp=NOW - 10)
    refused(bad_json, TtlExpiredError)


# --- TTL (RFC 11) -----------------------------------------------------------------------------


def test_ttl_counts_from_the_envelope_timestamp() -> None:
    e = env(ttl_ms=1000, timestamp=100.0)
    assert ttl_deadline(e) == 101.0
    validate_envelope(e, limits=LIMITS, now=100.999)
    error = refused(e, TtlExpiredError, now=101.0)  # the deadline itself is expired
    assert error.code == "ttl_expired"
    assert error.details["field"] == "ttl_ms"
    assert error.details["ttl_ms"] == "1000"
    refused(e, TtlExpiredError, now=150.0)


def test_ttl_without_timestamp_cannot_have_expired_at_admission() -> None:
    e = env(ttl_ms=1, timestamp=0.0)
    validate_envelope(e, limits=LIMITS, now=NOW)
    assert ttl_deadline(e) == 0.0
    assert ttl_deadline(e, received_at=NOW) == NOW + 0.001


def test_no_ttl_means_no_deadline() -> None:
    e = env(ttl_ms=0, timestamp=1.0)
    validate_envelope(e, limits=LIMITS, now=NOW)
    assert ttl_deadline(e) == 0.0
    assert ttl_deadline(e, received_at=NOW) == 0.0


@given(
    timestamp=st.floats(1.0, 2e9),
    ttl_ms=st.integers(1, 10**9),
    offset=st.floats(-1e6, 1e6),
)
def test_expired_iff_deadline_reached(timestamp: float, ttl_ms: int, offset: float) -> None:
    e = env(ttl_ms=ttl_ms, timestamp=timestamp)
    deadline = timestamp + ttl_ms / 1000
    now = max(0.0, deadline + offset)
    if deadline <= now:
        refused(e, TtlExpiredError, now=now)
    else:
        validate_envelope(e, limits=LIMITS, now=now)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"ttl_ms": -1}, "ttl_ms"),
        ({"timestamp": -1.0}, "timestamp"),
        ({"timestamp": math.nan}, "timestamp"),
        ({"timestamp": math.inf}, "timestamp"),
    ],
)
def test_malformed_ttl_fields(changes: dict[str, Any], field: str) -> None:
    assert refused(env(**changes)).details["field"] == field


def test_now_must_be_finite() -> None:
    with pytest.raises(ValueError, match="finite"):
        validate_envelope(env(), limits=LIMITS, now=math.nan)


# --- HLC --------------------------------------------------------------------------------------


def test_hlc_required_when_enabled() -> None:
    error = refused(env(), hlc_required=True)
    assert error.details["field"] == "hlc_timestamp"
    assert "required" in error.message


@pytest.mark.parametrize("hlc", ["garbage", "HLC:1:2", "HLC:x:0:node", "1.23.node"])
def test_hlc_must_parse_when_enabled(hlc: str) -> None:
    error = refused(env(hlc_timestamp=hlc), hlc_required=True)
    assert error.details["field"] == "hlc_timestamp"


@pytest.mark.parametrize("hlc", ["HLC:1754661802000000:0:node-1", "1754661802.000000.node-1"])
def test_valid_hlc_forms_are_accepted(hlc: str) -> None:
    validate_envelope(env(hlc_timestamp=hlc), limits=LIMITS, now=NOW, hlc_required=True)


def test_hlc_is_not_checked_when_disabled() -> None:
    validate_envelope(env(hlc_timestamp="garbage"), limits=LIMITS, now=NOW)


# --- content types ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ct", "base"),
    [
        ("Application/JSON; charset=UTF-8", "application/json"),
        ("  text/plain  ", "text/plain"),
        ("image/png;x=1;y=2", "image/png"),
        ("", ""),
    ],
)
def test_content_type_base(ct: str, base: str) -> None:
    assert content_type_base(ct) == base


def test_media_type_params() -> None:
    assert media_type_params('text/plain; Charset="UTF-8"; junk; =x; a=b') == {
        "charset": "UTF-8",
        "a": "b",
    }


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("*/*", True),
        ("image/*", True),
        ("application/vnd.api+json", True),
        ("*/json", False),
        ("image", False),
        ("image/", False),
        ("", False),
    ],
)
def test_is_media_range(text: str, ok: bool) -> None:
    assert is_media_range(text) is ok


# --- RFC 12: modalities -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content_type", "modalities"),
    [
        ("text/plain", ["text/plain"]),
        ("TEXT/Plain; charset=utf-8", ["text/plain;format=flowed"]),
        ("image/png", ["image/*"]),
        ("audio/ogg", ["Audio/*"]),
        ("video/mp4", ["*/*"]),
        ("application/json", []),
        ("application/protobuf", ()),
        ("", ["image/png"]),
    ],
)
def test_modality_covers(content_type: str, modalities: list[str]) -> None:
    check_modality(content_type, modalities)


@pytest.mark.parametrize(
    ("content_type", "modalities"),
    [
        ("text/plain", []),
        ("image/png", ["text/*"]),
        ("imagex/png", ["image/*"]),
        ("application/json", ["application/protobuf"]),
        ("application/vnd.x+json", ["application/json"]),
    ],
)
def test_modality_refuses(content_type: str, modalities: list[str]) -> None:
    with pytest.raises(UnsupportedMessageTypeError) as info:
        check_modality(content_type, modalities)
    assert info.value.code == "unsupported_message_type"
    assert info.value.details["field"] == "content_type"
    assert info.value.details["content_type"] == content_type_base(content_type)


def test_implicit_modalities_are_the_rfc_musts() -> None:
    assert IMPLICIT_MODALITIES == ("application/json", "application/protobuf")


def test_malformed_content_type_is_a_validation_error_for_modality() -> None:
    with pytest.raises(ValidationError) as info:
        check_modality("not a type", ["*/*"])
    assert info.value.details["field"] == "content_type"


@given(kind=st.from_regex(r"[a-z][a-z0-9.+-]{0,10}/[a-z][a-z0-9.+-]{0,10}", fullmatch=True))
def test_star_star_covers_everything(kind: str) -> None:
    check_modality(kind, ["*/*"])
    check_modality(kind, [kind.split("/", maxsplit=1)[0] + "/*"])
    check_modality(kind.upper(), [kind])
