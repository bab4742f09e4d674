"""Detached copies of JSON values for the in-memory stores."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from apiary.store.json_codec import dump_json, load_json_object


def json_copy(value: Mapping[str, Any]) -> dict[str, Any]:
    """`value` through JSON text and back: validated as the SQL backends validate it, and
    detached from the caller's (mutable) dict."""
    return load_json_object(dump_json(value))
