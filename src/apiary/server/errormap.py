"""Translation of exceptions into the protocol's error vocabulary, shared by transports.

Unknown exceptions become one opaque `internal_error`; their details go to the log only.
What reaches the client is bounded whatever the request held: a message that quotes a
10 MB id would otherwise become a status line and trailers no client accepts (gRPC refuses
metadata over 8 KB and the caller would see RESOURCE_EXHAUSTED instead of the real error).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from apiary.errors import ApiaryError, ErrorSpec, spec_for

log = logging.getLogger("apiary.server")

MAX_MESSAGE_BYTES = 512
"""An error message's UTF-8 size at most; longer ones are cut and end with an ellipsis."""
MAX_DETAIL_KEY_BYTES = 64
MAX_DETAIL_VALUE_BYTES = 160
MAX_DETAILS = 12
"""Details kept per error (the rest are dropped): with the limits above, an answer's gRPC
status line and error trailer stay well under the 8 KB of metadata clients accept."""
ELLIPSIS = "…"


@dataclass(frozen=True, slots=True)
class ErrorAnswer:
    spec: ErrorSpec
    code: str
    message: str
    details: dict[str, str]


def clip(text: str, limit: int = MAX_DETAIL_VALUE_BYTES) -> str:
    """`text` cut to at most `limit` UTF-8 bytes (ending in an ellipsis when cut), so that
    quoting client input in an answer or a log line costs a bounded size. Lone surrogates
    (which JSON escapes can carry) become "?": every transport can encode the result."""
    data = text.encode("utf-8", "replace")
    if len(data) <= limit:
        return text if text.isascii() else data.decode("utf-8")
    room = limit - len(ELLIPSIS.encode())
    return data[:room].decode("utf-8", "ignore") + ELLIPSIS


def _bounded(details: Mapping[str, str]) -> dict[str, str]:
    kept = list(details.items())[:MAX_DETAILS]
    return {
        clip(str(k), MAX_DETAIL_KEY_BYTES): clip(str(v), MAX_DETAIL_VALUE_BYTES) for k, v in kept
    }


def answer_for(exc: BaseException, where: str) -> ErrorAnswer:
    """What to tell the caller about `exc` raised while serving `where`."""
    spec = spec_for(exc)
    if isinstance(exc, ApiaryError):
        message = clip(exc.message, MAX_MESSAGE_BYTES)
        return ErrorAnswer(spec, exc.code, message, _bounded(exc.details))
    log.error("internal error in %s", where, exc_info=exc)
    return ErrorAnswer(spec, spec.code, "internal error; see the coordinator log", {})
