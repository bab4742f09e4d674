"""ACK payloads as agents send them (INTEROP.md): JSON with stage names or numbers, or a
protobuf Ack; what is not one is refused naming the field."""

from __future__ import annotations

import json

import pytest

from apiary.core.envelope import Ack, AckStage
from apiary.errors import ValidationError
from apiary.wire import pb
from apiary.wire.convert import ack_from_payload, ack_to_json

TARGET = "6ae58b74-4e19-4b2f-9e7a-1a1a1fd2d001"


def _json(**doc: object) -> bytes:
    return json.dumps({"ack_for_message_id": TARGET, **doc}).encode()


@pytest.mark.parametrize("stage", ["FULFILLED", "fulfilled", "Fulfilled", 3])
def test_a_json_ack_names_its_stage_by_name_in_any_case_or_by_number(stage: object) -> None:
    ack = ack_from_payload("application/json", _json(ack_stage=stage))
    assert ack == Ack(TARGET, AckStage.FULFILLED)


@pytest.mark.parametrize("around", [("", ""), (" ", "\n"), ("\t", ""), ("", "  ")])
def test_a_json_ack_may_have_whitespace_around_it(around: tuple[str, str]) -> None:
    payload = around[0].encode() + _json(ack_stage="READ") + around[1].encode()
    assert ack_from_payload("application/json", payload) == Ack(TARGET, AckStage.READ)


def test_json_and_protobuf_acks_read_back_what_was_written() -> None:
    ack = Ack(TARGET, AckStage.FAILED, "validation_error", "bad input é")
    assert ack_from_payload("application/json", ack_to_json(ack)) == ack
    proto = pb.common_pb2.Ack(
        ack_for_message_id=TARGET, ack_stage=pb.common_pb2.FAILED, note="bad input é"
    )
    read = ack_from_payload("application/protobuf", proto.SerializeToString())
    assert (read.ack_for_message_id, read.ack_stage, read.note) == (
        TARGET, AckStage.FAILED, "bad input é",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        (_json(ack_stage="DONE"), "ack_stage"),
        (_json(ack_stage=99), "ack_stage"),
        (_json(), "ack_stage"),
        (json.dumps({"ack_stage": "READ"}).encode(), "ack_for_message_id"),
        (b"[1]", "payload"),
        (b"{", "payload"),
        (_json(ack_stage="READ") + b"x", "payload"),
        (b'{"ack_stage": "READ", "ack_for_message_id": "\xff"}', "payload"),
        ('{"ack_stage": "READ"}'.encode("utf-16"), "payload"),
    ],
)
def test_what_is_not_an_ack_is_refused_naming_the_field(payload: bytes, field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        ack_from_payload("application/json", payload)
    assert caught.value.details["field"] == field
