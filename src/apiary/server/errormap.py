"""Translation of exceptions into the protocol's error vocabulary, shared by transports.

Unknown exceptions become one opaque `internal_error`; their details go to the log only.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from apiary.errors import ApiaryError, ErrorSpec, spec_for

log = logging.getLogger("apiary.server")


@dataclass(frozen=True, slots=True)
class ErrorAnswer:
    spec: ErrorSpec
    code: str
    message: str
    details: dict[str, str]


def answer_for(exc: BaseException, where: str) -> ErrorAnswer:
    """What to tell the caller about `exc` raised while serving `where`."""
    spec = spec_for(exc)
    if isinstance(exc, ApiaryError):
        return ErrorAnswer(spec, exc.code, exc.message, dict(exc.details))
    log.error("internal error in %s", where, exc_info=exc)
    return ErrorAnswer(spec, spec.code, "internal error; see the coordinator log", {})
