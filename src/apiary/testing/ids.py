"""Deterministic ids for tests: valid UUIDv4 strings that count up."""

from __future__ import annotations

import uuid


class SequentialIds:
    """`apiary.core.ids.IdGenerator` that yields UUIDv4 strings numbered from `start`.

    The counter fills the low 62 bits and `stream` the top 32, so that two generators in one
    test never collide and ids read as their number:
    `SequentialIds().new_id() == "00000000-0000-4000-8000-000000000001"`.
    """

    _COUNTER_LIMIT = 1 << 62

    def __init__(self, start: int = 1, stream: int = 0) -> None:
        if not 0 <= start < self._COUNTER_LIMIT:
            raise ValueError(f"start must be in [0, 2**62), got {start}")
        if not 0 <= stream < 1 << 32:
            raise ValueError(f"stream must be in [0, 2**32), got {stream}")
        self._next = start
        self._stream = stream

    def new_id(self) -> str:
        """The next id; raises OverflowError once the 62-bit counter is used up."""
        if self._next >= self._COUNTER_LIMIT:
            raise OverflowError("SequentialIds counter exhausted")
        value = (self._stream << 96) | self._next
        self._next += 1
        # version=4 also sets the RFC 4122 variant bits, which the counter never reaches.
        return str(uuid.UUID(int=value, version=4))
