"""Checking a tool call's arguments and result against the tool's JSON Schemas (RFC 18.2).

Arguments are checked before anything runs, results before they are returned. A failure is a
VALIDATION_ERROR naming the field (`args` or `result`) and the JSON path of the offending
value (`details["path"]`, e.g. `$.timezone`, `$` for the document itself), so that a caller
can tell which argument to fix.

Arguments and results are read by `core.json_reader`: nesting within `json_depth`, arguments
within `document_bytes` (what a TOOL_CALL payload carries by default) and a result within the
default TOOL_RESULT payload limit (16 MiB).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Final

from jsonschema import ValidationError as SchemaValidationError
from jsonschema.exceptions import best_match
from jsonschema.protocols import Validator
from jsonschema.validators import validator_for

from apiary.core.envelope_rules import PayloadLimits
from apiary.core.json_reader import JsonError, read_document
from apiary.core.limits import DEFAULT_LIMITS
from apiary.core.tools.descriptor import parse_schema
from apiary.errors import ValidationError

JSON: Final = "application/json"
MAX_ARGS_BYTES: Final = DEFAULT_LIMITS.document_bytes
MAX_RESULT_BYTES: Final = PayloadLimits().tool_result


def is_json(content_type: str) -> bool:
    """Whether `content_type` is JSON (`application/json`, `+json` suffixes, parameters)."""
    base = content_type.split(";", 1)[0].strip().lower()
    return base == JSON or base.endswith("+json")


@lru_cache(maxsize=512)
def _validator(schema_text: str) -> Validator | None:
    schema = parse_schema(schema_text)
    if schema is None:
        return None
    validator: Validator = validator_for(schema)(schema)
    return validator


def decode_json(data: bytes, field: str, max_bytes: int) -> Any:
    """The JSON value `data` holds; VALIDATION_ERROR naming `field` when it is not JSON
    within `max_bytes` and the depth limit."""
    try:
        # Passed on, not kept: syntax, depth and size are what matter.
        return read_document(data or b"null", max_bytes=max_bytes, kept=False)
    except JsonError as exc:
        raise ValidationError.for_field(field, str(exc), path="$") from None


def check_value(schema_text: str, value: Any, field: str) -> None:
    """Raise VALIDATION_ERROR naming `field` and the JSON path when `value` breaks the schema."""
    validator = _validator(schema_text)
    if validator is None:
        return
    error: SchemaValidationError | None = best_match(validator.iter_errors(value))
    if error is None:
        return
    path = error.json_path
    raise ValidationError(f"{field}: {path}: {error.message}", {"field": field, "path": path})


def check_arguments(schema_text: str, content_type: str, args: bytes) -> Any:
    """The decoded arguments (None when not JSON and no schema applies), checked against
    `schema_text`. A tool with an input schema takes JSON arguments only."""
    if not is_json(content_type or JSON):
        if schema_text.strip():
            raise ValidationError.for_field(
                "content_type",
                f"{content_type!r}: this tool's arguments are JSON (application/json)",
            )
        return None
    # No arguments: an empty object.
    value = decode_json(args, "args", MAX_ARGS_BYTES) if args else {}
    check_value(schema_text, value, "args")
    return value


def check_result(schema_text: str, content_type: str, data: bytes) -> None:
    """Check a complete result against the output schema (JSON results only)."""
    if not schema_text.strip():
        return
    if not is_json(content_type or JSON):
        raise ValidationError.for_field(
            "result", f"content type {content_type!r} is not JSON, but the tool declares an "
            "output schema",
        )  # fmt: skip
    check_value(schema_text, decode_json(data, "result", MAX_RESULT_BYTES), "result")
