"""Swarm wire facts byte for byte (INTEROP.md): the signing input, the Ed25519 signature, the
invite JWT; and message parsing with errors that name the field."""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import replace
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from apiary.swarm.errors import SwarmError
from apiary.swarm.invite import (
    InviteClaims,
    check_invite,
    decode_invite,
    encode_invite,
    invite_url,
    parse_invite_url,
)
from apiary.swarm.keys import Identity, public_key, sign_message, verify_message
from apiary.swarm.wire import (
    format_timestamp,
    parse_message,
    parse_timestamp,
    signing_input,
)

SEED = bytes(range(32))
SWARM = "550e8400-e29b-41d4-a716-446655440000"
BODY: dict[str, Any] = {
    "protocol_version": "0.1.0",
    "message_id": "6ba7b810-9dad-11d1-80b4-00c04fd430c8",
    "timestamp": "2026-02-05T14:30:00.000Z",
    "sender": {"agent_id": "agent-a", "endpoint": "https://a.example.com/swarm"},
    "recipient": "broadcast",
    "swarm_id": SWARM,
    "type": "message",
    "content": "Hello, swarm",
    "signature": "",
}


def _b64u(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def test_timestamps_have_milliseconds_and_a_literal_z() -> None:
    assert format_timestamp(1770301800.0) == "2026-02-05T14:30:00.000Z"
    assert format_timestamp(1770301800.1239) == "2026-02-05T14:30:00.123Z"
    assert parse_timestamp("2026-02-05T14:30:00.000Z", "t") == 1770301800.0
    assert parse_timestamp("2026-02-05T15:30:00+01:00", "t") == 1770301800.0


@pytest.mark.conformance("swarm.message.signature-rule")
def test_a_message_signature_is_byte_for_byte_the_interop_rule() -> None:
    # The rule, written out independently of the implementation:
    concatenated = (
        BODY["message_id"] + BODY["timestamp"] + BODY["swarm_id"] + BODY["recipient"]
        + BODY["type"] + BODY["content"]
    )  # fmt: skip
    digest = hashlib.sha256(concatenated.encode("utf-8")).digest()
    expected = base64.b64encode(Ed25519PrivateKey.from_private_bytes(SEED).sign(digest)).decode()
    message = parse_message({**BODY, "signature": "x"})
    assert signing_input(message) == digest
    signed = sign_message(Identity.from_seed(SEED), message)
    assert signed.signature == expected
    # Pinned, so a change of any input byte is caught (Ed25519 is deterministic).
    assert signed.signature == (
        "i9y+JivISAnPLaxQhamjcV2SxKJSeB4t8+iWyqQ6VIrSzwhXt7LItO7wIqfFQZtahzoNsY38+qxLg0gMPDVFDQ=="
    )
    identity = Identity.from_seed(SEED)
    assert identity.public_key == "A6EHv/POEL4dcN0Y50vAmWfk1jCbpQ1fHdyGZBJVMbg="
    verify_message(identity.public_key, signed)


@pytest.mark.conformance("swarm.security.verify")
def test_a_forged_or_altered_message_does_not_verify() -> None:
    identity = Identity.from_seed(SEED)
    signed = sign_message(identity, parse_message({**BODY, "signature": "x"}))
    other = Identity.from_seed(bytes(32))
    for key, message in (
        (other.public_key, signed),
        (identity.public_key, replace(signed, content="Hello, swarm!")),
        (identity.public_key, replace(signed, recipient="agent-b")),
        (identity.public_key, parse_message({**signed.to_json(), "signature": "AAAA"})),
    ):  # fmt: skip
        with pytest.raises(SwarmError) as caught:
            verify_message(key, message)
        assert (caught.value.status, caught.value.code) == (401, "INVALID_SIGNATURE")


def test_public_keys_are_raw_base64_and_the_der_form_is_read_too() -> None:
    identity = Identity.from_seed(SEED)
    raw = base64.b64decode(identity.public_key)
    der = bytes.fromhex("302a300506032b6570032100") + raw
    assert public_key(base64.b64encode(der).decode()).public_bytes_raw() == raw
    for bad in ("", "not base64!", base64.b64encode(b"short").decode()):
        with pytest.raises(SwarmError) as caught:
            public_key(bad)
        assert caught.value.field == "public_key"


def test_an_invite_token_is_byte_for_byte_the_interop_jwt() -> None:
    identity = Identity.from_seed(SEED)
    claims = InviteClaims(
        swarm_id=SWARM, master="agent-a", endpoint="https://a.example.com/swarm",
        iat=1770301800, expires_at="2026-02-06T14:30:00.000Z", max_uses=1,
    )  # fmt: skip
    header = _b64u(json.dumps({"alg": "EdDSA", "typ": "JWT"}, separators=(",", ":")).encode())
    payload = _b64u(json.dumps({
        "swarm_id": SWARM, "master": "agent-a", "endpoint": "https://a.example.com/swarm",
        "expires_at": "2026-02-06T14:30:00.000Z", "max_uses": 1, "iat": 1770301800,
    }, separators=(",", ":")).encode())  # fmt: skip
    signature = Ed25519PrivateKey.from_private_bytes(SEED).sign(f"{header}.{payload}".encode())
    expected = f"{header}.{payload}.{_b64u(signature)}"
    token = encode_invite(identity, claims)
    assert token == expected
    assert header == "eyJhbGciOiJFZERTQSIsInR5cCI6IkpXVCJ9"
    assert decode_invite(token) == claims
    url = invite_url(claims, token)
    assert url == f"swarm://{SWARM}@a.example.com?token={token}"
    assert parse_invite_url(url) == (SWARM, "a.example.com", token)


def _token(**changes: Any) -> tuple[Identity, str]:
    identity = Identity.from_seed(SEED)
    fields: dict[str, Any] = {
        "swarm_id": SWARM, "master": "agent-a", "endpoint": "https://a.example.com/swarm",
        "iat": 1770301800, **changes,
    }  # fmt: skip
    return identity, encode_invite(identity, InviteClaims(**fields))


def test_invites_are_checked_signature_swarm_endpoint_expiry_and_uses() -> None:
    now = 1770301800.0 + 60
    identity, token = _token(expires_at="2026-02-05T15:30:00.000Z", max_uses=2)
    ok = {"swarm_id": SWARM, "endpoint": "https://a.example.com/swarm", "now": now}
    assert check_invite(token, identity.public_key, uses=1, **ok).max_uses == 2
    cases = [
        ({**ok, "uses": 2}, identity.public_key, "TOKEN_EXHAUSTED"),
        ({**ok, "uses": 0, "now": 1770305400.0}, identity.public_key, "TOKEN_EXPIRED"),
        ({**ok, "uses": 0, "swarm_id": "6ba7b810-9dad-11d1-80b4-00c04fd430c8"},
         identity.public_key, "INVALID_TOKEN"),
        ({**ok, "uses": 0, "endpoint": "https://evil.example.com/swarm"},
         identity.public_key, "INVALID_TOKEN"),
        ({**ok, "uses": 0}, Identity.from_seed(bytes(32)).public_key, "INVALID_TOKEN"),
    ]  # fmt: skip
    for kwargs, key, code in cases:
        with pytest.raises(SwarmError) as caught:
            check_invite(token, key, **kwargs)
        assert (caught.value.status, caught.value.code) == (400, code), kwargs
    head, body, sig = token.split(".")
    forged_claims = _b64u(json.dumps({**json.loads(base64.urlsafe_b64decode(body + "==")),
                                      "max_uses": 99}).encode())  # fmt: skip
    with pytest.raises(SwarmError) as caught:
        check_invite(f"{head}.{forged_claims}.{sig}", identity.public_key, uses=0, **ok)
    assert caught.value.code == "INVALID_TOKEN"
    for malformed in ("", "a.b", "x.y.z", f"{head}.{body}"):
        with pytest.raises(SwarmError) as caught:
            decode_invite(malformed)
        assert (caught.value.code, caught.value.field) == ("INVALID_TOKEN", "invite_token")


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"protocol_version": "0.1"}, "protocol_version"),
        ({"message_id": "not-a-uuid"}, "message_id"),
        ({"timestamp": "yesterday"}, "timestamp"),
        ({"sender": {"agent_id": "a"}}, "sender.endpoint"),
        ({"sender": {"agent_id": "a", "endpoint": "http://a"}}, "sender.endpoint"),
        ({"sender": {"endpoint": "https://a"}}, "sender.agent_id"),
        ({"type": "chat"}, "type"),
        ({"swarm_id": "x"}, "swarm_id"),
        ({"priority": "urgent"}, "priority"),
        ({"references": [{"type": "github_issue", "repo": "o/r"}]}, "references[0].number"),
        ({"references": [{"type": "url", "url": "https://x", "action": "stolen"}]},
         "references[0].action"),
        ({"attachments": [{"type": "inline", "mime_type": "text/plain"}]},
         "attachments[0].content"),
        ({"expires_at": "soon"}, "expires_at"),
    ],
)  # fmt: skip
@pytest.mark.conformance("swarm.message.fields")
def test_a_malformed_message_is_a_400_naming_the_field(change: dict[str, Any], field: str) -> None:
    with pytest.raises(SwarmError) as caught:
        parse_message({**BODY, "signature": "x", **change})
    assert (caught.value.status, caught.value.field) == (400, field)
    assert caught.value.to_json()["error"]["details"]["field"] == field


@pytest.mark.conformance("swarm.message.fields", "swarm.version.compatible")
def test_missing_fields_and_other_majors_are_refused() -> None:
    for name in ("message_id", "timestamp", "recipient", "swarm_id", "type", "content",
                 "signature"):  # fmt: skip
        body = {**BODY, "signature": "x"}
        del body[name]
        with pytest.raises(SwarmError) as caught:
            parse_message(body)
        assert caught.value.field == name
    with pytest.raises(SwarmError) as caught:
        parse_message({**BODY, "signature": "x", "protocol_version": "1.0.0"})
    assert (caught.value.status, caught.value.code) == (400, "UNSUPPORTED_VERSION")
    newer_minor = parse_message({**BODY, "signature": "x", "protocol_version": "0.2.5"})
    assert newer_minor.protocol_version == "0.2.5"


def test_metadata_references_and_unknown_fields_survive_a_round_trip() -> None:
    body = {
        **BODY, "signature": "x", "in_reply_to": "6ba7b811-9dad-11d1-80b4-00c04fd430c8",
        "thread_id": "6ba7b812-9dad-11d1-80b4-00c04fd430c8", "priority": "high",
        "expires_at": "2026-02-06T00:00:00.000Z",
        "references": [{"type": "github_issue", "repo": "o/r", "number": 3,
                        "action": "claimed"}],
        "attachments": [{"type": "url", "mime_type": "text/html", "content": "https://x"}],
        "metadata": {"k": "v"}, "action": "member_joined", "agent_id": "agent-b",
    }  # fmt: skip
    message = parse_message(body)
    assert message.to_json() == body
    assert message.extra == {"action": "member_joined", "agent_id": "agent-b"}


@pytest.mark.conformance("swarm.version.include", "swarm.message.fields")
def test_every_message_carries_the_protocol_version_and_needs_one() -> None:
    sent = parse_message({**BODY, "signature": "x"})
    assert sent.to_json()["protocol_version"] == "0.1.0"
    for name in ("protocol_version", "sender"):
        body = {**BODY, "signature": "x"}
        del body[name]
        with pytest.raises(SwarmError) as caught:
            parse_message(body)
        assert caught.value.field == name
