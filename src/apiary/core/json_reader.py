"""The one reader of JSON a client sends: payloads, and the JSON text of request fields.

Every JSON text that arrives from a client is read here, within two limits: its size, and
its nesting depth (arrays and objects inside one another). It must be RFC 8259 JSON: UTF-8
without a byte order mark, no NaN or Infinity, no integer longer than Python converts
(4300 digits). Refusals are `JsonError` (a ValueError) saying what is wrong; `read_json`
turns them into validation_error naming the field, and `read_document` leaves that to a
caller that names the field its own way.

A value the coordinator keeps (`kept=True`: HITL context, negotiation validation rules,
log details, workflow data) must also be one it can store and show again: no number that
overflows to infinity (which would be written back as the non-JSON `Infinity`), no NUL and
no lone surrogate in a string or key (which PostgreSQL cannot store and UTF-8 cannot encode).
A payload the router only passes on is checked for syntax and depth alone.

Speed: a text that is plainly one value (`json_scan`) with no more brackets than the depth
limit is read by one scan plus two substring counts; the depth of a text with more brackets
is measured on the text before it is parsed, so nesting never reaches the parser's recursion.
"""

from __future__ import annotations

import json
import math
import re
from itertools import accumulate
from typing import Any, Final, NoReturn

from apiary.core.json_scan import NOT_PLAIN, plain_value, scanner
from apiary.core.limits import DEFAULT_LIMITS, quote, utf8_size
from apiary.errors import ValidationError

DEFAULT_DEPTH: Final = DEFAULT_LIMITS.json_depth


class JsonError(ValueError):
    """A text is not JSON the reader accepts; the message says why (it quotes no input
    beyond a short prefix)."""


def _reject_constant(name: str) -> NoReturn:
    raise JsonError(f"{name} is not JSON")


_DECODER: Final = json.JSONDecoder(parse_constant=_reject_constant)
"""One decoder for every text: json.loads with any option builds a new one per call."""
_SCAN: Final = scanner(_DECODER)
# Strings (whose brackets do not nest) and runs of anything but brackets, removed to leave
# the brackets alone; valid JSON strings are exactly what the first alternative matches.
_NOT_BRACKETS: Final = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[^\[\]{}"]+')
_DEPTH_STEP: Final = {"[": 1, "{": 1, "]": -1, "}": -1, '"': 0}
_SURROGATE: Final = re.compile("[\ud800-\udfff]")
MAX_DIGITS: Final = 4300
"""The longest integer Python converts from text (sys.get_int_max_str_digits' default)."""
_LONG_NUMBER: Final = re.compile(rf"\d{{{MAX_DIGITS + 1}}}")


def plainly_json(text: str, max_depth: int = DEFAULT_DEPTH) -> bool:
    """Whether `text` is one JSON value from its first character to its last within the
    depth limit, decided by one scan: True means `parse_json(text, max_depth)` accepts it;
    False means nothing (the caller asks `parse_json`, which decides and says why)."""
    if len(text) > 2 * max_depth and text.count("[") + text.count("{") > max_depth:
        return False
    return plain_value(text, _SCAN) is not NOT_PLAIN


def parse_json(text: str | bytes, max_depth: int = DEFAULT_DEPTH, *, kept: bool = False) -> Any:
    """The JSON value of `text` (bytes must be UTF-8); JsonError when it is not JSON within
    `max_depth`, or, with `kept`, not a value the coordinator can store and show again."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JsonError(f"is not UTF-8 text (byte {exc.start})") from None
    if _deeper(text, max_depth):
        raise JsonError(f"nests arrays and objects deeper than {max_depth} levels")
    value = plain_value(text, _SCAN)
    if value is NOT_PLAIN:
        value = _parse_slowly(text)
    if kept:
        _check_kept(value)
    return value


def read_document(
    text: str | bytes,
    *,
    max_bytes: int = DEFAULT_LIMITS.document_bytes,
    max_depth: int = DEFAULT_DEPTH,
    kept: bool = True,
) -> Any:
    """`parse_json` within a size limit too, for a caller that words its own error: the
    JsonError's message follows a field's name ("is 2000000 bytes of JSON, more than the
    1048576-byte limit ([limits])", "is not valid JSON: ...")."""
    size = len(text) if isinstance(text, bytes) else utf8_size(text)
    if size > max_bytes:
        raise JsonError(f"is {size} bytes of JSON, more than the {max_bytes}-byte limit ([limits])")
    try:
        return parse_json(text, max_depth, kept=kept)
    except JsonError as exc:
        raise JsonError(f"is not valid JSON: {exc}") from None


def read_json(
    text: str | bytes,
    field: str,
    *,
    max_bytes: int = DEFAULT_LIMITS.document_bytes,
    max_depth: int = DEFAULT_DEPTH,
    kept: bool = True,
) -> Any:
    """`parse_json` for a request field: ValidationError naming `field` when `text` is over
    `max_bytes` or is not JSON the reader accepts."""
    try:
        return read_document(text, max_bytes=max_bytes, max_depth=max_depth, kept=kept)
    except JsonError as exc:
        raise ValidationError.for_field(field, str(exc)) from None


def read_json_object(
    text: str | bytes,
    field: str,
    *,
    max_bytes: int = DEFAULT_LIMITS.document_bytes,
    max_depth: int = DEFAULT_DEPTH,
) -> dict[str, Any]:
    """`read_json` of a value the coordinator keeps that must be a JSON object."""
    value = read_json(text, field, max_bytes=max_bytes, max_depth=max_depth)
    if not isinstance(value, dict):
        raise ValidationError.for_field(field, f"must be a JSON object, got {type(value).__name__}")
    return value


def check_nesting(text: str | bytes, field: str, max_depth: int = DEFAULT_DEPTH) -> None:
    """For JSON text another part parses with its own rules and words: refuse, naming
    `field`, what no parser here survives, which is nesting deeper than `max_depth` (it
    would recurse) and a number of more than 4300 digits (json raises outside its error
    type), both found on the text without parsing it."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if _deeper(text, max_depth):
        raise ValidationError.for_field(
            field, f"is not valid JSON: nests arrays and objects deeper than {max_depth} levels"
        )
    if _LONG_NUMBER.search(text):
        raise ValidationError.for_field(
            field, f"is not valid JSON: has a number of more than {MAX_DIGITS} digits"
        )


def _parse_slowly(text: str) -> Any:
    """json.loads(text) with the strict decoder, its errors as JsonError."""
    if text.startswith("\ufeff"):
        raise JsonError("starts with a byte order mark (RFC 8259 forbids it)")
    try:
        return _DECODER.decode(text)
    except json.JSONDecodeError as exc:
        raise JsonError(f"{exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise JsonError("nests arrays and objects too deeply") from None
    except JsonError:
        raise
    except ValueError:  # an integer longer than Python converts
        raise JsonError(f"has a number of more than {MAX_DIGITS} digits") from None


def _deeper(text: str, max_depth: int) -> bool:
    """Whether `text` nests arrays and objects deeper than `max_depth` (nesting needs a
    bracket per level and its closing one: a short text or one with few brackets cannot)."""
    return (
        len(text) > 2 * max_depth
        and text.count("[") + text.count("{") > max_depth
        and _depth(text) > max_depth
    )


def _depth(text: str) -> int:
    """The deepest nesting of arrays and objects in `text`, counted on its brackets outside
    strings (a running sum computed in C, not a parse)."""
    brackets = _NOT_BRACKETS.sub("", text)
    steps = accumulate(map(_DEPTH_STEP.__getitem__, brackets))
    return max(steps, default=0)


def _check_kept(value: Any) -> None:
    """Walk `value` once (no recursion): finite numbers; keys and strings without NUL or
    lone surrogates."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            _check_string(item)
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise JsonError("has a number too large for a 64-bit float")
        elif isinstance(item, dict):
            for key, inner in item.items():
                _check_string(key)
                stack.append(inner)
        elif isinstance(item, list):
            stack.extend(item)


def _check_string(text: str) -> None:
    if "\x00" in text:
        raise JsonError(f"has a NUL character (\\u0000) in the string {quote(text, 40)}")
    if not text.isascii() and _SURROGATE.search(text):
        raise JsonError(f"has a lone surrogate (half a UTF-16 pair) in {quote(text, 40)}")
