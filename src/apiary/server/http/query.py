"""Query parameters of the console's reads (console.py, history.py): each bad one refused
with a ValidationError naming it (400 `validation_error`, `details.field`)."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import TypeVar

from apiary.core.limits import DEFAULT_LIMITS, check_id, check_text
from apiary.errors import ValidationError
from apiary.server.errormap import clip

MAX_CURSOR = 2**63 - 1
"""The largest sequence a store holds (a signed 64-bit integer)."""
QUERY_TEXT_BYTES = 200
"""A search's text."""

E = TypeVar("E", bound=StrEnum)


def cursor_param(text: str, field: str) -> int:
    """A non-negative decimal integer of ASCII digits (str.isdigit alone would take '²',
    which int() then refuses) that fits a store's 64-bit sequence."""
    digits = text.strip()
    if not (digits.isascii() and digits.isdigit()) or len(digits) > len(str(MAX_CURSOR)):
        raise ValidationError.for_field(
            field, f"must be a non-negative integer up to {MAX_CURSOR}, not {clip(text, 40)!r}"
        )
    value = int(digits)
    if value > MAX_CURSOR:
        raise ValidationError.for_field(field, f"must be at most {MAX_CURSOR}")
    return value


def limit_param(query: Mapping[str, str], default: int, most: int) -> int:
    """`?limit=`: 1..`most`, `default` when absent."""
    limit = cursor_param(query.get("limit", str(default)), "limit")
    if not 1 <= limit <= most:
        raise ValidationError.for_field("limit", f"must be within 1..{most}")
    return limit


def optional_cursor(query: Mapping[str, str], field: str) -> int | None:
    """A cursor parameter, None when absent or empty."""
    text = query.get(field, "")
    return cursor_param(text, field) if text else None


def choice_param(query: Mapping[str, str], field: str, kind: type[E]) -> E:
    """A required value of an enumeration."""
    text = query.get(field, "")
    try:
        return kind(text)
    except ValueError:
        names = ", ".join(member.value for member in kind)
        shown = f"not {clip(text, 40)!r}" if text else "it is required"
        raise ValidationError.for_field(field, f"must be one of {names}; {shown}") from None


def optional_choice(query: Mapping[str, str], field: str, kind: type[E]) -> E | None:
    """A value of an enumeration, None when absent or empty."""
    return choice_param(query, field, kind) if query.get(field, "") else None


def id_param(query: Mapping[str, str], field: str) -> str:
    """A required id: printable text within the id limit."""
    text = query.get(field, "")
    if not text:
        raise ValidationError.for_field(field, "is required")
    return check_id(text, field, DEFAULT_LIMITS.id_bytes)


def text_param(query: Mapping[str, str], field: str) -> str:
    """Optional search text (at most QUERY_TEXT_BYTES)."""
    return check_text(query.get(field, ""), field, QUERY_TEXT_BYTES)
