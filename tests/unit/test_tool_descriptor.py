"""Tool descriptors (RFC 18.1): the registration rule and capability requirements."""

from __future__ import annotations

import json

import pytest

from apiary.core.tools.descriptor import (
    ToolDescriptor,
    check_provider_id,
    descriptor_from_json,
    descriptor_to_json,
    parse_schema,
    validate_tool,
    validate_tools,
)
from apiary.errors import ValidationError


def test_a_full_descriptor_is_accepted_and_its_side_effects_normalised() -> None:
    tool = ToolDescriptor(
        "write_file",
        input_schema=json.dumps({"type": "object", "required": ["path"]}),
        output_schema="true",
        idempotent=True,
        needs_worktree=True,
        side_effects=" Filesystem , process,filesystem ",
    )
    valid = validate_tool(tool)
    assert valid.side_effects == "filesystem,process"
    assert valid.capabilities == ("filesystem", "process", "worktree")
    assert ToolDescriptor("pure", side_effects="none").capabilities == ()
    assert descriptor_from_json(descriptor_to_json(valid)) == valid


@pytest.mark.parametrize(
    ("schema", "problem"),
    [
        ("{", "is not valid JSON: Expecting property name"),
        # The JSON reader's limits: deeper than json_depth, larger than document_bytes.
        ('{"not": ' * 65 + "{}" + "}" * 65, "is not valid JSON: nests arrays and objects"),
        ('{"description": "' + "x" * (1 << 20) + '"}', "bytes of JSON, more than the 1048576"),
        ("[1]", "JSON Schema object or boolean"),
        ('{"type": "banana"}', "not a valid JSON Schema at type"),
        ('{"properties": {"a": {"minimum": "one"}}}', "at properties/a/minimum"),
        ('{"$schema": "http://json-schema.org/draft-07/schema#", "required": "a"}', "required"),
    ],
)
def test_schemas_must_be_json_schema_documents(schema: str, problem: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_schema(schema)
    assert problem in str(caught.value)
    with pytest.raises(ValidationError) as named:
        validate_tool(ToolDescriptor("t", output_schema=schema), index=3)
    assert named.value.details == {"field": "output_schema", "tool_name": "t", "index": "3"}
    assert named.value.message.startswith("tool 't': output_schema: ")


def test_empty_and_boolean_schemas_are_fine() -> None:
    assert parse_schema("") is None
    assert parse_schema("  ") is None
    assert parse_schema("false") is False
    assert parse_schema('{"type": "object"}') == {"type": "object"}


@pytest.mark.parametrize(
    ("tool", "field"),
    [
        (ToolDescriptor(""), "tool_name"),
        (ToolDescriptor("has space"), "tool_name"),
        (ToolDescriptor("x" * 129), "tool_name"),
        (ToolDescriptor("t", side_effects="GPU!"), "side_effects"),
        (ToolDescriptor("t", side_effects="none,gpu"), "side_effects"),
        (ToolDescriptor("t", max_concurrency=-1), "max_concurrency"),
        (ToolDescriptor("t", default_timeout_s=-5), "default_timeout_s"),
    ],
)
def test_bad_fields_are_named(tool: ToolDescriptor, field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        validate_tool(tool)
    assert caught.value.details["field"] == field


def test_names_are_unique_within_a_provider_and_keep_their_order() -> None:
    tools = [ToolDescriptor("b"), ToolDescriptor("a"), ToolDescriptor("c.d-e_f")]
    assert [t.tool_name for t in validate_tools(tools)] == ["b", "a", "c.d-e_f"]
    with pytest.raises(ValidationError) as caught:
        validate_tools([ToolDescriptor("a"), ToolDescriptor("a")])
    assert caught.value.details == {"field": "tool_name", "tool_name": "a", "index": "1"}
    with pytest.raises(ValidationError) as many:
        validate_tools([ToolDescriptor(f"t{i}") for i in range(1001)])
    assert many.value.details["field"] == "tools"


def test_provider_ids() -> None:
    assert check_provider_id("agent-7@host:1") == "agent-7@host:1"
    for bad in ("", "has space", "-x" * 100, "é"):
        with pytest.raises(ValidationError) as caught:
            check_provider_id(bad)
        assert caught.value.details["field"] == "provider_id"
