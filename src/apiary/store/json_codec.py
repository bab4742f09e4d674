"""How every backend turns JSON fields (event details, agent descriptors, attempt lists)
into text.

One encoder for all backends, so that a value one backend refuses is refused by all of them,
before anything is written.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any

from apiary.store.errors import StoreError


def dump_json(value: Mapping[str, Any]) -> str:
    """Compact JSON text of a JSON object.

    Raises ValueError for anything that is not a JSON object of JSON values: NaN and
    infinities (no JSON reader accepts them), lone surrogates (not encodable as UTF-8),
    values and keys of non-JSON types.
    """
    if not isinstance(value, Mapping):
        raise ValueError(f"expected a JSON object, got {type(value).__name__}")
    return _dump(value)


def dump_json_list(values: Sequence[Any]) -> str:
    """Compact JSON text of a JSON array; raises ValueError as `dump_json` does."""
    if isinstance(values, str | bytes | bytearray) or not isinstance(values, Sequence):
        raise ValueError(f"expected a JSON array, got {type(values).__name__}")
    return _dump(list(values))


def load_json_object(text: str | bytes) -> dict[str, Any]:
    """Parse text written by `dump_json` (or a database's JSON type) back into a dict."""
    value = json.loads(text)
    if not isinstance(value, dict):
        raise StoreError(f"stored JSON is not an object: {type(value).__name__}")
    return value


def json_object_of(value: Any) -> dict[str, Any]:
    """A stored JSON object: already parsed by the driver (JSONB), or text to parse."""
    if isinstance(value, Mapping):
        return dict(value)
    return load_json_object(value)


def json_list_of(value: Any) -> list[Any]:
    """A stored JSON array: already parsed by the driver (JSONB), or text to parse."""
    if isinstance(value, list):
        return value
    return load_json_list(value)


def load_json_list(text: str | bytes) -> list[Any]:
    """Parse text written by `dump_json_list` back into a list."""
    value = json.loads(text)
    if not isinstance(value, list):
        raise StoreError(f"stored JSON is not an array: {type(value).__name__}")
    return value


_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
_C_ENCODE = (
    None
    if c_make_encoder is None
    else c_make_encoder(None, _ENCODER.default, encode_basestring, None, ":", ",", False, False,
                        False)
)  # fmt: skip
"""`_ENCODER`'s C encoder, built once: `JSONEncoder.encode` builds a new one per call, which
costs as much as encoding a small object (an event's details, two per routed message). Built
without the circular-reference markers, which are per call: a cycle, which no caller builds,
ends in a RecursionError instead."""


def _dump(value: Any) -> str:
    try:
        text = _ENCODER.encode(value) if _C_ENCODE is None else "".join(_C_ENCODE(value, 0))
        text.encode("utf-8")
    except (TypeError, ValueError, RecursionError) as exc:
        raise ValueError(f"not JSON values: {exc}") from exc
    return text
