"""The limits on client input as pure rules (core/limits.py, core/json_reader.py), the
[limits] table, the request walk of the service layer, and the defensive readers of
wire/convert.py: each limit at its boundary and one past it."""

from __future__ import annotations

import importlib
import inspect
import json
import math
import pkgutil
import sys
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from hypothesis import given
from hypothesis import strategies as st

import apiary.server.services as services
from apiary.core.envelope import Envelope, MessageType
from apiary.core.envelope_rules import PayloadLimits, validate_envelope
from apiary.core.json_reader import (
    JsonError,
    check_nesting,
    parse_json,
    plainly_json,
    read_json,
    read_json_object,
)
from apiary.core.limits import (
    DEFAULT_LIMITS,
    INT64_MAX,
    TIMESTAMP_MAX_S,
    Limits,
    check_duration,
    check_id,
    check_int,
    check_member,
    check_text,
    check_timestamp,
    check_timestamp_range,
    limit_for_field,
    quote,
)
from apiary.errors import ValidationError
from apiary.server.config.limits import limits_settings
from apiary.server.config.loader import load_config
from apiary.server.services.request_checks import RequestChecks
from apiary.server.services.router import _resume_after
from apiary.wire import pb
from apiary.wire.convert import (
    ack_from_payload,
    descriptor_from_dict,
    details_json,
    float_to_timestamp,
)
from apiary.wire.services import SERVICES

L = DEFAULT_LIMITS
NOW = 1_754_661_802.0
M1 = "6ae58b74-4e19-4b2f-9e7a-1a1a1fd2d001"


def field_of(call: Any) -> str:
    with pytest.raises(ValidationError) as caught:
        call()
    return caught.value.details["field"]


# --- the Limits and the [limits] table ----------------------------------------------------------


def test_every_limit_has_a_documented_default() -> None:
    decisions = (Path(__file__).parents[2] / "docs" / "decisions.md").read_text()
    section = decisions.split("## Limits", 1)[1].split("\n## ", 1)[0]
    for name, value in L.as_dict().items():
        assert f"`{name}`" in section, name
        shown = str(int(value)) if float(value).is_integer() else str(value)
        assert shown in section, (name, shown)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"agent_id_bytes": 0}, "limits.agent_id_bytes"),
        ({"text_bytes": True}, "limits.text_bytes"),
        ({"json_depth": 2000}, "limits.json_depth"),
        ({"quote_chars": 4}, "limits.quote_chars"),
        ({"clock_skew_s": -1.0}, "limits.clock_skew_s"),
        ({"max_duration_s": math.inf}, "limits.max_duration_s"),
    ],
)
def test_impossible_limits_are_refused_naming_the_setting(
    changes: dict[str, Any], field: str
) -> None:
    assert field_of(lambda: Limits(**changes)) == field


def test_the_limits_table_sets_any_limit(tmp_path: Path) -> None:
    path = tmp_path / "apiary.toml"
    path.write_text("[limits]\nagent_id_bytes = 64\nclock_skew_s = 60\njson_depth = 8\n")
    limits = load_config(path, {}, {}).limits
    assert (limits.agent_id_bytes, limits.clock_skew_s, limits.json_depth) == (64, 60.0, 8)
    assert limits.correlation_id_bytes == L.correlation_id_bytes
    assert load_config(None, {}, {}).limits == L


@pytest.mark.parametrize(
    ("values", "words"),
    [
        ({"ids": 3}, "unknown setting limits.ids"),
        ({"text_bytes": "big"}, "limits.text_bytes must be an integer"),
        ({"name_bytes": 0}, "limits.name_bytes: must be in [1,"),
    ],
)
def test_the_limits_table_names_what_is_wrong(values: dict[str, Any], words: str) -> None:
    with pytest.raises(ValidationError) as caught:
        limits_settings(values, "apiary.toml [limits]")
    assert caught.value.message.startswith("apiary.toml [limits]: ")
    assert words in caught.value.message


# --- strings --------------------------------------------------------------------------------------


def test_an_id_may_take_its_whole_limit_in_bytes_not_characters() -> None:
    assert check_id("é" * 128, "agent_id", 256) == "é" * 128
    assert field_of(lambda: check_id("é" * 128 + "x", "agent_id", 256)) == "agent_id"
    assert check_id("", "agent_id", 1) == ""


@pytest.mark.parametrize("bad", ["a\x00b", "tab\there", "line\n", "\u202eevil", "\ud800", "\x7f"])
def test_ids_are_printable_text(bad: str) -> None:
    with pytest.raises(ValidationError) as caught:
        check_id(bad, "producer_id", 256)
    assert "printable" in caught.value.message and "U+" in caught.value.message


def test_text_may_hold_line_breaks_and_tabs_but_no_other_control() -> None:
    assert check_text("two\r\nlines\tand é 😀", "reason", 100)
    for bad in ("nul\x00", "bell\x07", "esc\x1b[0m", "\ud800"):
        with pytest.raises(ValidationError):
            check_text(bad, "reason", 100)


def test_an_error_quotes_a_short_prefix_whatever_the_input() -> None:
    with pytest.raises(ValidationError) as caught:
        check_id("x" * 10_000_000, "correlation_id", 256)
    message = caught.value.message
    assert len(message) < 300 and "(10000000 characters)" in message
    assert quote("abc") == "'abc'" and quote(b"\x00" * 100, 4).startswith("b'\\x00\\x00")


@pytest.mark.parametrize(
    ("name", "limit"),
    [
        ("agent_id", "agent_id_bytes"), ("participants", "agent_id_bytes"),
        ("recipient", "agent_id_bytes"), ("producer_id", "producer_id_bytes"),
        ("task_ids", "task_id_bytes"), ("target_repo_id", "repo_id_bytes"),
        ("hlc_timestamp", "hlc_bytes"), ("negotiation_room_id", "id_bytes"),
        ("entry_ids", "id_bytes"), ("event_types", "name_bytes"),
        ("context_json", "document_bytes"), ("workflow_data", "document_bytes"),
        ("reason", "text_bytes"), ("anything_else", "text_bytes"),
    ],
)  # fmt: skip
def test_each_field_name_has_its_limit(name: str, limit: str) -> None:
    assert limit_for_field(name) == limit


# --- numbers and times ----------------------------------------------------------------------------


def test_timestamps_lie_within_the_clock_skew_window() -> None:
    skew = L.clock_skew_s
    assert check_timestamp(NOW + skew, "ts", now=NOW) == NOW + skew
    assert check_timestamp(0.0, "ts", now=NOW) == 0.0  # no age limit by default
    with pytest.raises(ValidationError) as caught:
        check_timestamp(NOW + skew + 1, "ts", now=NOW)
    assert "clock_skew_s" in caught.value.message
    aged = Limits(timestamp_age_s=60)
    check_timestamp(NOW - 60, "ts", now=NOW, limits=aged)
    with pytest.raises(ValidationError) as caught:
        check_timestamp(NOW - 61, "ts", now=NOW, limits=aged)
    assert "timestamp_age_s" in caught.value.message


@pytest.mark.parametrize("seconds", [-1e-9, TIMESTAMP_MAX_S + 1, math.nan, math.inf, 2.0**62])
def test_a_time_no_timestamp_can_show_is_refused(seconds: float) -> None:
    assert field_of(lambda: check_timestamp_range(seconds, "since")) == "since"


def test_durations_are_non_negative_and_bounded() -> None:
    assert check_duration(L.max_duration_s, "ttl") == L.max_duration_s
    for bad in (-0.001, L.max_duration_s + 0.001, math.nan):
        assert field_of(lambda bad=bad: check_duration(bad, "ttl")) == "ttl"


def test_integers_stop_at_what_sql_keeps() -> None:
    assert check_int(INT64_MAX, "after") == INT64_MAX
    for bad in (INT64_MAX + 1, -1, True):
        assert field_of(lambda bad=bad: check_int(bad, "after")) == "after"


def test_an_enum_value_the_proto_lacks_is_named_with_the_ones_it_has() -> None:
    with pytest.raises(ValidationError) as caught:
        check_member(99, "state", {0: "UNSPECIFIED", 1: "RUNNING"})
    assert (
        caught.value.message
        == "state: 99 is not one of the values the proto defines (UNSPECIFIED=0, RUNNING=1)"
    )


# --- the JSON reader ------------------------------------------------------------------------------


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_json_may_nest_exactly_to_the_depth_limit() -> None:
    assert parse_json(nested(L.json_depth)) is not None
    with pytest.raises(JsonError, match="deeper than 64"):
        parse_json(nested(L.json_depth + 1))
    with pytest.raises(JsonError, match="deeper than 64"):
        parse_json(nested(1_000_000))  # measured on the text: no recursion
    # Brackets inside strings do not nest.
    assert parse_json(json.dumps({"s": "[" * 500})) == {"s": "[" * 500}


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("9" * 4301, "more than 4300 digits"), ("NaN", "NaN is not JSON"),
        ("\ufeff{}", "byte order mark"), ("[1,", "Expecting value"), ('{"a" 1}', "delimiter"),
    ],
)  # fmt: skip
def test_json_that_is_not_rfc_8259_within_limits_is_refused(text: str, words: str) -> None:
    with pytest.raises(JsonError, match=words):
        parse_json(text)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("1e400", "too large"), ("[-1e309]", "too large"), ('{"a": "\\u0000"}', "NUL"),
        ('{"\\u0000": 1}', "NUL"), ('["\\udc00"]', "surrogate"),
    ],
)  # fmt: skip
def test_json_the_coordinator_keeps_must_be_storable(text: str, words: str) -> None:
    parse_json(text)  # valid JSON to pass on
    with pytest.raises(JsonError, match=words):
        parse_json(text, kept=True)


def test_a_valid_surrogate_pair_is_one_character() -> None:
    assert parse_json('"\\ud83d\\ude00"', kept=True) == "😀"


def test_read_json_names_the_field_and_the_size_limit() -> None:
    with pytest.raises(ValidationError) as caught:
        read_json("[" + "1," * 100 + "1]", "context_json", max_bytes=50)
    assert caught.value.details["field"] == "context_json"
    assert "more than the 50-byte limit" in caught.value.message
    assert field_of(lambda: read_json_object("[1]", "patch_json")) == "patch_json"
    assert read_json_object(b'{"a": 1}', "patch_json") == {"a": 1}


def test_check_nesting_refuses_only_what_no_parser_here_survives() -> None:
    check_nesting("{not json", "input_schema")  # the schema's own reader says why
    for bad in (nested(65), "9" * 4301):
        assert field_of(lambda bad=bad: check_nesting(bad, "input_schema")) == "input_schema"


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=30,
)


@given(json_values, st.sampled_from([0, 1, 2, 8, 64]), st.sampled_from(["", " ", "\n"]))
def test_the_fast_path_decides_as_the_reader_does(value: Any, depth: int, blank: str) -> None:
    text = blank + json.dumps(value, allow_nan=False) + blank
    try:
        expected: Any = parse_json(text, depth)
    except JsonError:
        expected = JsonError
    if plainly_json(text, depth):
        assert expected is not JsonError
    if expected is not JsonError:
        assert expected == json.loads(text)


# --- envelopes --------------------------------------------------------------------------------


def envelope(**changes: Any) -> Envelope:
    values: dict[str, Any] = {
        "message_id": M1, "producer_id": "alice", "message_type": MessageType.DATA,
        "payload": b"{}", "content_type": "application/json", "content_length": 2,
        "correlation_id": "wf123", "hlc_timestamp": "HLC:1754661802000000:0:node",
    }  # fmt: skip
    values.update(changes)
    return Envelope(**values)


def decided(env: Envelope, *, long_way: bool) -> str:
    """'ok' or the refused field; `long_way` skips the fast path (HLC checks force it)."""
    try:
        validate_envelope(env, limits=PayloadLimits(), now=NOW, hlc_required=long_way)
    except ValidationError as exc:
        return exc.details["field"]
    return "ok"


@given(
    st.sampled_from(["producer_id", "correlation_id", "idempotency_token", "repo_id",
                     "worktree_id", "content_type"]),
    st.text(max_size=300) | st.sampled_from(["é" * 128, "é" * 129, "x" * 256, "x" * 257]),
)  # fmt: skip
def test_envelope_strings_are_decided_alike_by_both_paths(field: str, value: str) -> None:
    if field == "content_type":
        value = "application/json;p=" + value
    env = envelope(**{field: value})
    assert decided(env, long_way=False) == decided(env, long_way=True)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"correlation_id": "c" * 257}, "correlation_id"),
        ({"idempotency_token": "t\x00"}, "idempotency_token"),
        ({"repo_id": "é" * 129}, "repo_id"),
        ({"hlc_timestamp": "H" * 129}, "hlc_timestamp"),
        ({"content_type": "application/json; x=" + "y" * 300}, "content_type"),
        ({"ttl_ms": L.max_duration_ms + 1}, "ttl_ms"),
        ({"timestamp": TIMESTAMP_MAX_S + 1.0}, "timestamp"),
        ({"payload": nested(65).encode(), "content_length": 130}, "payload"),
    ],
)
def test_an_envelope_past_a_limit_is_refused_naming_the_field(
    changes: dict[str, Any], field: str
) -> None:
    assert decided(envelope(**changes), long_way=False) == field


def test_a_stricter_configuration_refuses_what_the_defaults_take() -> None:
    env = envelope(producer_id="a" * 100)
    validate_envelope(env, limits=PayloadLimits(), now=NOW)
    with pytest.raises(ValidationError) as caught:
        validate_envelope(env, limits=PayloadLimits(), now=NOW, fields=Limits(producer_id_bytes=64))
    assert caught.value.details["field"] == "producer_id"


# --- the request walk -----------------------------------------------------------------------------


def test_an_empty_request_of_every_method_passes() -> None:
    checks = RequestChecks()
    for methods in SERVICES.values():
        for method in methods:
            checks.check(method.request_type())


def test_every_rpc_method_of_every_handler_meets_the_checks() -> None:
    for info in pkgutil.iter_modules(services.__path__):
        module = importlib.import_module(f"{services.__name__}.{info.name}")
        for name, cls in vars(module).items():
            if not (inspect.isclass(cls) and name.endswith("Handler")):
                continue
            for attr, method in vars(cls).items():
                rpc = inspect.iscoroutinefunction(method) or inspect.isasyncgenfunction(method)
                if attr.startswith("_") or not rpc:
                    continue
                assert hasattr(method, "__wrapped__") or getattr(
                    method, "__checks_inside__", False
                ), f"{name}.{attr}"


def refused_field(message: Any, checks: RequestChecks | None = None) -> str:
    return field_of(lambda: (checks or RequestChecks(now=lambda: NOW)).check(message))


def test_the_walk_refuses_each_kind_of_field_naming_its_path() -> None:
    a = pb.apiary_pb2
    entry = a.ActivityRecord(agent_id="alice", task_id="t")
    entry.started_at.seconds = int(NOW + L.clock_skew_s + 1)
    assert refused_field(a.RegisterActivityRequest(entry=entry)) == "entry.started_at"
    assert refused_field(pb.registry_pb2.HeartbeatRequest(state=77)) == "state"  # type: ignore[arg-type]
    assert refused_field(a.RequeueDlqRequest(entry_ids=[1, 2**63])) == "entry_ids"
    assert (
        refused_field(pb.negotiation_pb2.Evaluation(confidence_score=math.nan))
        == "confidence_score"
    )
    assert refused_field(a.EscalateRequest(timeout_s=4_000_000_000)) == "timeout_s"
    assert refused_field(a.SwitchWorktreeRequest(agent_id="a", ttl_ms=2**63 - 1)) == "ttl_ms"
    grace = pb.scheduler_pb2.ShutdownAgentRequest(agent_id="a")
    grace.grace_period.nanos = -1
    assert refused_field(grace) == "grace_period"
    filters = a.ListDlqRequest()
    filters.filter.since.seconds = 0  # a query bound may lie anywhere in the range
    RequestChecks(now=lambda: NOW).check(filters)
    filters.filter.until.seconds = TIMESTAMP_MAX_S + 1
    assert refused_field(filters) == "filter.until"
    health = pb.registry_pb2.HeartbeatRequest(agent_id="a", health={"k" * 300: "v"})
    assert refused_field(health).startswith("health[")
    nodes = pb.workflow_pb2.WorkflowDefinition(workflow_id="w")
    nodes.nodes["n"].CopyFrom(pb.workflow_pb2.WorkflowNode(node_id="n", agent_id="\x00"))
    assert refused_field(pb.workflow_pb2.CreateWorkflowRequest(definition=nodes)) == (
        "definition.nodes['n'].agent_id"
    )


def test_the_walk_leaves_envelopes_to_admission_and_uses_the_configured_limits() -> None:
    huge = pb.common_pb2.Envelope(correlation_id="c" * 10_000)
    RequestChecks().check(pb.router_pb2.SendMessageRequest(msg=huge))
    strict = RequestChecks(Limits(agent_id_bytes=8))
    assert refused_field(pb.registry_pb2.HeartbeatRequest(agent_id="a" * 9), strict) == "agent_id"


@pytest.mark.parametrize("offset", ["²", "٣", "9" * 20, str(INT64_MAX + 1), "-1", ""])
def test_a_resume_offset_is_ascii_digits_sql_can_keep(offset: str) -> None:
    with pytest.raises(ValidationError):
        _resume_after("bob", offset, "", L)
    assert _resume_after("bob", str(INT64_MAX), "", L) == INT64_MAX


# --- defensive readers ----------------------------------------------------------------------------


@given(st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([2.0**40, 2.0**62, -1.5]))
def test_any_stored_time_converts_to_a_timestamp_every_reader_can_show(seconds: float) -> None:
    ts = float_to_timestamp(seconds)
    assert 0 <= ts.nanos < 1_000_000_000
    ts.ToJsonString()  # raises for a Timestamp JSON cannot show
    if 0 <= seconds <= TIMESTAMP_MAX_S:
        assert abs(ts.seconds + ts.nanos / 1e9 - seconds) <= max(1e-6, abs(seconds) * 1e-15)


def test_times_past_the_range_show_at_its_ends() -> None:
    assert float_to_timestamp(2.0**40).ToJsonString() == "9999-12-31T23:59:59Z"
    assert float_to_timestamp(-(2.0**40)).ToJsonString() == "0001-01-01T00:00:00Z"
    assert float_to_timestamp(math.nan).ToJsonString() == "1970-01-01T00:00:00Z"
    assert float_to_timestamp(0.9999999999) == Timestamp(seconds=1, nanos=0)


def test_stored_details_render_as_json_whatever_they_hold() -> None:
    text = details_json({"nan": math.nan, "inf": [math.inf], "raw": b"\x00", "ok": 1})
    assert json.loads(text) == {"inf": ["inf"], "nan": "nan", "ok": 1, "raw": "b'\\x00'"}
    deep: Any = []
    for _ in range(sys.getrecursionlimit() + 10):
        deep = [deep]
    assert "nested deeper than 64" in details_json({"deep": deep})


def test_a_stored_descriptor_the_proto_cannot_take_shows_its_id() -> None:
    shown = descriptor_from_dict({"agent_id": "a", "name": "n", "communication_class": {}})
    assert (shown.agent_id, shown.name) == ("a", "n")


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        (b'{"ack_for_message_id": "m", "ack_stage": "READ", "note": "\\u0000"}', "note"),
        (b'{"ack_for_message_id": "m", "ack_stage": "READ", "note": [1]}', "note"),
        (b'{"ack_for_message_id": "m", "ack_stage": ' + b"9" * 5000 + b"}", "payload"),
        (b'{"ack_for_message_id": "m\\u0000", "ack_stage": "READ"}', "ack_for_message_id"),
    ],
)
def test_an_ack_payload_is_read_by_the_one_reader(payload: bytes, field: str) -> None:
    assert field_of(lambda: ack_from_payload("application/json", payload)) == field
