"""The value checks every backend applies alike: what the SQL columns can hold.

The memory backend runs them too, so that a value one backend refuses is refused by all.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

_UINT64: Final = 1 << 64
_INT64_MAX: Final = (1 << 63) - 1
_INT64_MIN: Final = -(1 << 63)


def check_limit(limit: int) -> None:
    """Refuse a negative LIMIT (SQLite would read it as "no limit", PostgreSQL fails)."""
    if limit < 0:
        raise ValueError(f"limit must not be negative: {limit}")


def checked_int64(name: str, value: int) -> int:
    """`value` if it fits a signed 64-bit column; ValueError naming `name` otherwise."""
    number = int(value)
    if not _INT64_MIN <= number <= _INT64_MAX:
        raise ValueError(f"{name} must fit a signed 64-bit integer: {value}")
    return number


def checked_count(name: str, value: int) -> int:
    """`value` if it is a non-negative 64-bit integer; ValueError naming `name` otherwise."""
    number = int(value)
    if not 0 <= number <= _INT64_MAX:
        raise ValueError(f"{name} must be a non-negative 64-bit integer: {value}")
    return number


def checked_strings(name: str, values: Sequence[str]) -> list[str]:
    """`values` as a list of str for a JSON column; ValueError naming `name` otherwise."""
    if (
        isinstance(values, str | bytes | bytearray)
        or not isinstance(values, Sequence)
        or not all(isinstance(v, str) for v in values)
    ):
        raise ValueError(f"{name} must be a sequence of str")
    return list(values)


def sequence_to_sql(sequence_number: int) -> int:
    """A uint64 sequence number as the signed 64-bit integer both databases store.

    Numbers from 2^63 on wrap around to negative values: a bijection, and sequence numbers
    are only compared for equality. Raises ValueError outside 0..2^64-1 (the envelope's
    uint64), which every backend refuses alike.
    """
    if not 0 <= sequence_number < _UINT64:
        raise ValueError(f"sequence_number must be a uint64: {sequence_number}")
    return sequence_number - _UINT64 if sequence_number > _INT64_MAX else sequence_number


def sequence_from_sql(stored: int) -> int:
    """The inverse of `sequence_to_sql`."""
    return stored + _UINT64 if stored < 0 else stored
