"""One JSON value read in a single scan, for the payloads every routed message carries.

`json.loads` runs its decoder's scanner from the first non-blank character, then checks
that only blanks follow, two regular-expression passes around the scan; a payload that is
one value from its first character to its last (what every SDK sends) needs neither. What
is not that plainly (blanks around it, anything malformed) is left to the caller's long
way, which reads it as before and gives its error.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Final

Scanner = Callable[[str, int], tuple[Any, int]]
"""A decoder's `scan_once`: one JSON value from an index, and where it ended (raises
StopIteration where no value starts)."""

NOT_PLAIN: Final = object()
"""What `plain_value` answers for a text that is not plainly one JSON value."""

_BLANKS: Final = frozenset(" \t\n\r\ufeff")
"""What may start a JSON text that is not plainly one value (blanks are allowed around a
value; a byte order mark is refused by json.loads with its own message)."""


def scanner(decoder: json.JSONDecoder) -> Scanner:
    """`decoder`'s scanner (its parse_constant and other hooks apply)."""
    scan: Scanner = decoder.scan_once  # type: ignore[attr-defined]
    return scan


def plain_value(text: str, scan: Scanner) -> Any:
    """The JSON value `text` is when it is one value from its first character to its last,
    else NOT_PLAIN (also for anything `scan` refuses)."""
    if not text or text[0] in _BLANKS:
        return NOT_PLAIN
    try:
        value, end = scan(text, 0)
    except (ValueError, StopIteration, RecursionError):
        return NOT_PLAIN
    return value if end == len(text) else NOT_PLAIN
