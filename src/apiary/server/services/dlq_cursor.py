"""The cursor of a paged DLQ export: the entry id the next page starts after, bound to the
filter it was given for (a cursor passed with another filter would skip entries silently).

Opaque to callers. It is no credential: a made-up cursor can only skip entries the caller
may read anyway, so a digest of the filter, not a signature, is enough."""

from __future__ import annotations

import hashlib
import re

from apiary.core.limits import INT64_MAX
from apiary.errors import ValidationError
from apiary.wire import pb

FIELD = "cursor"
_SHAPE = re.compile(r"(\d{1,19})\.([0-9a-f]{16})")


def _digest(where: pb.apiary_pb2.DlqFilter) -> str:
    return hashlib.sha256(where.SerializeToString(deterministic=True)).hexdigest()[:16]


def export_cursor(after_id: int, where: pb.apiary_pb2.DlqFilter) -> str:
    """The cursor of the page after entry `after_id` of the export filtered by `where`."""
    return f"{after_id}.{_digest(where)}"


def read_export_cursor(cursor: str, where: pb.apiary_pb2.DlqFilter) -> int:
    """The entry id `cursor` starts after (0 for no cursor); validation_error naming
    `cursor` when it is not one this server gives, or was given for another filter."""
    if not cursor:
        return 0
    shape = _SHAPE.fullmatch(cursor)
    if shape is None or int(shape[1]) > INT64_MAX:
        raise ValidationError.for_field(
            FIELD, "not a cursor this server gave; pass next_cursor back as it came"
        )
    if shape[2] != _digest(where):
        raise ValidationError.for_field(
            FIELD, "was given for another filter; repeat that filter, or start again without one"
        )
    return int(shape[1])
