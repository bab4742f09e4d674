"""The NEGOTIATION event fanout JSON (RFC 17.1) and the SDK's decode helpers."""

from __future__ import annotations

import base64
import json

import pytest

from apiary.core.negotiation.events import KINDS, b64, decode_event, encode, event
from apiary.errors import ValidationError
from apiary.sdk import negotiation as sdk


@pytest.mark.conformance(
    "negotiation.events.ignore-unknown-fields", "patterns.events.ignore-unknown-fields",
    "negotiation.events.sdk-decode-helpers", "patterns.events.sdk-decode-helpers",
)  # fmt: skip
def test_decoders_ignore_unknown_fields_and_decode_base64_on_demand() -> None:
    raw = json.dumps({
        "kind": "propose", "ts": "2025-08-08T14:03:22Z", "from": "frontend",
        "ct": "application/json", "payload_b64": b64(b'{"path":"/orders"}'),
        "x-vendor": {"anything": [1, 2]}, "score": "not a number",
    }).encode()  # fmt: skip
    found = sdk.decode(raw)
    assert found.raw == raw
    assert (found.kind, found.sender, found.content_type) == ("propose", "frontend",
                                                              "application/json")  # fmt: skip
    assert found.payload() == b'{"path":"/orders"}'
    assert found.payload_json() == {"path": "/orders"}
    assert found.score is None
    assert found.fields["x-vendor"] == {"anything": [1, 2]}


def test_every_kind_reads_its_fields() -> None:
    decided = sdk.decode(encode(event("decide", "t", by="hitl", ct="text/plain",
                                      result_b64=b64(b"B"))))  # fmt: skip
    assert (decided.by, decided.result()) == ("hitl", b"B")
    opened = sdk.decode(encode(event("open", "t", topic="/api", corr="neg-1")))
    assert (opened.topic, opened.negotiation_id) == ("/api", "neg-1")
    voted = sdk.decode(encode(event("evaluate", "t", **{"from": "a"}, score=1, notes="ok")))
    assert (voted.score, voted.notes) == (1.0, "ok")
    policy = sdk.decode(encode(event("policy", "t", negotiation_id="n", policy={"max_rounds": 2})))
    assert policy.policy == {"max_rounds": 2}
    aborted = sdk.decode(encode(event("abort", "t", reason="timeout")))
    assert aborted.reason == "timeout"
    future = sdk.decode(b'{"kind": "vote", "ts": "t"}')
    assert not future.known and future.kind == "vote"
    assert set(KINDS) == {"open", "policy", "propose", "counter", "evaluate", "decide", "abort"}


@pytest.mark.parametrize(
    ("raw", "field"),
    [(b"[1]", "kind"), (b"{not json", "payload"), (b'{"kind": 3}', "kind")],
)
def test_what_is_not_an_event_is_refused(raw: bytes, field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        decode_event(raw)
    assert caught.value.details["field"] == field


def test_bad_base64_names_its_field() -> None:
    found = decode_event(b'{"kind": "counter", "payload_b64": "***"}')
    with pytest.raises(ValidationError) as caught:
        found.payload()
    assert caught.value.details["field"] == "payload_b64"
    with pytest.raises(ValidationError) as missing:
        found.result()
    assert missing.value.details["field"] == "result_b64"


def test_the_sdk_builds_what_participants_send_to_the_scheduler() -> None:
    body = sdk.proposal("neg-1", b"\x00\xffraw", content_type="application/octet-stream",
                        counter=True)  # fmt: skip
    doc = json.loads(body)
    assert (doc["kind"], doc["negotiation_id"]) == ("counter", "neg-1")
    assert doc["ct"] == "application/octet-stream"
    assert base64.b64decode(doc["payload_b64"]) == b"\x00\xffraw"
    vote = json.loads(sdk.evaluation("neg-1", 0.7, "close"))
    assert (vote["kind"], vote["score"], vote["notes"]) == ("evaluate", 0.7, "close")
    assert json.loads(sdk.abort("neg-1", "no time"))["reason"] == "no time"
