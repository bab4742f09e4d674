"""Arguments and results against a tool's JSON Schemas, with the JSON path of the problem."""

from __future__ import annotations

import json

import pytest

from apiary.core.tools.schema import (
    MAX_ARGS_BYTES,
    MAX_RESULT_BYTES,
    check_arguments,
    check_result,
    is_json,
)
from apiary.errors import ValidationError

SCHEMA = json.dumps({
    "type": "object",
    "properties": {
        "path": {"type": "string"},
        "lines": {"type": "array", "items": {"type": "integer", "minimum": 1}},
    },
    "required": ["path"],
    "additionalProperties": False,
})  # fmt: skip


def test_valid_arguments_are_decoded() -> None:
    args = json.dumps({"path": "a.txt", "lines": [1, 2]}).encode()
    assert check_arguments(SCHEMA, "application/json", args) == {"path": "a.txt", "lines": [1, 2]}
    assert check_arguments("", "", b"") == {}  # no arguments: an empty object
    assert check_arguments("", "text/plain", b"raw") is None  # not JSON, no schema: as is


@pytest.mark.parametrize(
    ("args", "path", "words"),
    [
        ({}, "$", "'path' is a required property"),
        ({"path": 3}, "$.path", "3 is not of type 'string'"),
        ({"path": "a", "lines": [1, 0]}, "$.lines[1]", "0 is less than the minimum of 1"),
        ({"path": "a", "extra": True}, "$", "Additional properties are not allowed"),
    ],
)
def test_bad_arguments_name_the_json_path(args: object, path: str, words: str) -> None:
    with pytest.raises(ValidationError) as caught:
        check_arguments(SCHEMA, "application/json; charset=utf-8", json.dumps(args).encode())
    assert caught.value.details == {"field": "args", "path": path}
    assert words in caught.value.message
    assert caught.value.message.startswith(f"args: {path}: ")


def test_arguments_must_be_json_when_a_schema_applies() -> None:
    with pytest.raises(ValidationError) as not_json:
        check_arguments(SCHEMA, "application/json", b"{nope")
    assert not_json.value.details["field"] == "args"
    with pytest.raises(ValidationError) as wrong_type:
        check_arguments(SCHEMA, "text/plain", b"path=a")
    assert wrong_type.value.details["field"] == "content_type"


def _nested(depth: int) -> bytes:
    return (b"[" * depth) + (b"]" * depth)


def _string_of(size: int) -> bytes:
    return b'"' + b"x" * (size - 2) + b'"'


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (_nested(65), "is not valid JSON: nests arrays and objects deeper than 64 levels"),
        (_string_of(MAX_ARGS_BYTES + 1), f"more than the {MAX_ARGS_BYTES}-byte limit"),
    ],
)
def test_arguments_are_read_within_the_json_limits(text: bytes, words: str) -> None:
    check_arguments("true", "application/json", _nested(64))  # at the limits: read
    check_arguments("true", "application/json", _string_of(MAX_ARGS_BYTES))
    with pytest.raises(ValidationError) as caught:
        check_arguments("true", "application/json", text)
    assert caught.value.details == {"field": "args", "path": "$"}
    assert caught.value.message.startswith("args: ") and words in caught.value.message


def test_results_are_read_within_the_json_limits() -> None:
    check_result("true", "application/json", _string_of(MAX_RESULT_BYTES))
    for text in (_nested(65), _string_of(MAX_RESULT_BYTES + 1)):
        with pytest.raises(ValidationError) as caught:
            check_result("true", "application/json", text)
        assert caught.value.details == {"field": "result", "path": "$"}


def test_results_are_checked_when_complete() -> None:
    check_result('{"type": "integer"}', "application/json", b"42")
    check_result("", "text/plain", b"anything")
    with pytest.raises(ValidationError) as caught:
        check_result('{"type": "object", "required": ["n"]}', "application/json", b"{}")
    assert caught.value.details == {"field": "result", "path": "$"}
    with pytest.raises(ValidationError) as not_json:
        check_result('{"type": "integer"}', "text/plain", b"42")
    assert not_json.value.details["field"] == "result"


def test_json_content_types() -> None:
    assert is_json("application/json")
    assert is_json("Application/JSON; charset=utf-8")
    assert is_json("application/vnd.apiary+json")
    assert not is_json("text/plain")
