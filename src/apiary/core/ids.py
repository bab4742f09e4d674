"""Identifier generation, injected so that tests get deterministic ids, and UUIDv4 checks."""

from __future__ import annotations

import re
from typing import Final, Protocol

# Hex is matched in either case: RFC 4122 (section 3) makes UUID strings case-insensitive on
# input, and some SDKs upper-case them.
_UUID4: Final = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", re.IGNORECASE
)


class IdGenerator(Protocol):
    """A source of fresh message, correlation and object ids."""

    def new_id(self) -> str:
        """A new UUIDv4 in its canonical 36-character hyphenated form."""
        ...


def is_uuid4(s: str) -> bool:
    """Whether `s` is a UUID version 4 (RFC 4122 variant) in the hyphenated 8-4-4-4-12 form.

    Other spellings that `uuid.UUID` accepts (braces, a `urn:uuid:` prefix, no hyphens) are
    refused: ids are compared as strings everywhere (acks, dedup, the store), so only the one
    form every SDK sends is let in.
    """
    return _UUID4.fullmatch(s) is not None
